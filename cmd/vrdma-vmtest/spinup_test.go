package main

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func TestParseSpinup(t *testing.T) {
	tests := []struct {
		args []string
		want spinupFlags
		ok   bool
	}{
		{nil, spinupFlags{rounds: 3}, true},
		{[]string{"--json", "--rounds", "2"}, spinupFlags{rounds: 2, json: true}, true},
		{[]string{"--rounds", "0"}, spinupFlags{}, false},
		{[]string{"--rounds", "101"}, spinupFlags{}, false},
		{[]string{"extra"}, spinupFlags{}, false},
		{[]string{"--bogus"}, spinupFlags{}, false},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			got, err := parseSpinup(tt.args, io.Discard)
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok=%v", err, tt.ok)
			}
			if tt.ok && got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			if !tt.ok && !errors.Is(err, errUsage) {
				t.Fatalf("got %v, want errUsage", err)
			}
		})
	}
}
