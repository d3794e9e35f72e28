package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// parseCase is one row of a table for a scenario's flag parser.
type parseCase[T comparable] struct {
	args []string
	want T
	ok   bool
}

// testParse runs parse on every case: a good one must give want, a bad one
// errUsage.
func testParse[T comparable](t *testing.T, parse func([]string, io.Writer) (T, error), tests []parseCase[T]) {
	t.Helper()
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			got, err := parse(tt.args, io.Discard)
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

func TestParsePair(t *testing.T) {
	testParse(t, parsePair, []parseCase[pairFlags]{
		{nil, pairFlags{"write", 65536, 1000}, true},
		{[]string{"--op", "atomic", "--size", "8", "--iters", "5"}, pairFlags{"atomic", 8, 5}, true},
		{[]string{"--op", "nop"}, pairFlags{}, false},
		{[]string{"--size", "0"}, pairFlags{}, false},
		{[]string{"--iters", "-1"}, pairFlags{}, false},
		{[]string{"extra"}, pairFlags{}, false},
		{[]string{"--bogus"}, pairFlags{}, false},
	})
	if got := (pairFlags{"send", 64, 7}).args(); strings.Join(got, " ") != "--op send --size 64 --iters 7" {
		t.Fatalf("got %q", got)
	}
}

func TestRunUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no scenario", nil, 2, "usage"},
		{"bad flag", []string{"--nope"}, 2, ""},
		{"missing binaries", []string{"--qemu", missing, "--vrdmad", missing, "probe"}, 1, "vrdmad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(tt.args, &out, &errb); code != tt.code {
				t.Fatalf("got exit %d, want %d (stderr %q)", code, tt.code, errb.String())
			}
			if !strings.Contains(errb.String(), tt.msg) {
				t.Fatalf("got stderr %q, want it to hold %q", errb.String(), tt.msg)
			}
		})
	}
}

func result(t *testing.T, s string) guestresult.Result {
	t.Helper()
	r, err := guestresult.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCheckPair(t *testing.T) {
	pf := pairFlags{"write", 4096, 10}
	good := result(t, `{"role":"server","op":"write","verified":true}`)
	bad := result(t, `{"role":"client","op":"write","verified":false}`)
	other := result(t, `{"role":"client","op":"read","verified":true}`)
	tests := []struct {
		name string
		res  guestvm.PairResult
		ok   bool
	}{
		{"both verified", guestvm.PairResult{Server: []guestresult.Result{good}, Client: []guestresult.Result{good}}, true},
		{"client not verified", guestvm.PairResult{Server: []guestresult.Result{good}, Client: []guestresult.Result{bad}}, false},
		{"server silent", guestvm.PairResult{Client: []guestresult.Result{good}}, false},
		{"wrong op", guestvm.PairResult{Server: []guestresult.Result{good}, Client: []guestresult.Result{other}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkPair(pf, tt.res); (err == nil) != tt.ok {
				t.Fatalf("got %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestCheckSingle(t *testing.T) {
	all := result(t, `{"role":"selftest","op":"all","verified":true}`)
	one := result(t, `{"role":"selftest","op":"write","verified":true}`)
	unv := result(t, `{"role":"selftest","op":"read","verified":false}`)
	probe := result(t, `{"role":"probe"}`)
	tests := []struct {
		name, scenario string
		rs             []guestresult.Result
		ok             bool
	}{
		{"probe", "probe", []guestresult.Result{probe}, true},
		{"probe silent", "probe", nil, false},
		{"selftest", "selftest", []guestresult.Result{one, all}, true},
		{"selftest without all", "selftest", []guestresult.Result{one}, false},
		{"selftest unverified", "selftest", []guestresult.Result{unv, all}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkSingle(tt.scenario, tt.rs); (err == nil) != tt.ok {
				t.Fatalf("got %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestPrintResultsVerbatim(t *testing.T) {
	line := `{"op":"write","role":"client","verified":true,"x":[1]}`
	var b bytes.Buffer
	printResults(&b, []guestresult.Result{result(t, line)})
	if got := b.String(); got != "VRDMA-RESULT "+line+"\n" {
		t.Fatalf("got %q, want the line verbatim", got)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(b.String()), "VRDMA-RESULT ")), &v); err != nil {
		t.Fatal(err)
	}
}
