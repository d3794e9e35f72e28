package main

import "testing"

func TestParseSpinup(t *testing.T) {
	testParse(t, parseSpinup, []parseCase[spinupFlags]{
		{nil, spinupFlags{rounds: 3}, true},
		{[]string{"--json", "--rounds", "2"}, spinupFlags{rounds: 2, json: true}, true},
		{[]string{"--rounds", "0"}, spinupFlags{}, false},
		{[]string{"--rounds", "101"}, spinupFlags{}, false},
		{[]string{"extra"}, spinupFlags{}, false},
		{[]string{"--bogus"}, spinupFlags{}, false},
	})
}
