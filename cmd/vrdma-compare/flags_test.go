package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/version"
)

// TestCommandLine: --help and --version on standard output with exit 0,
// bad usage in GNU form with exit 2, before any guest boots.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"--help"}, 0, "  --runs N\n", ""},
		{[]string{"-h"}, 0, "Exit status: 0 success, 1 failure, 2 bad usage.", ""},
		{[]string{"--version"}, 0, "vrdma-compare " + version.Version, ""},
		{[]string{"--nope"}, 2, "", "vrdma-compare: unknown option --nope\nTry 'vrdma-compare --help'"},
		{[]string{"--runs", "x"}, 2, "", `vrdma-compare: --runs: invalid value "x"`},
		{[]string{"--runs", "0"}, 2, "", "--runs 0: want 1..100"},
		{[]string{"stray"}, 2, "", `unexpected arguments ["stray"]`},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, &out, &errb)
			if code != tt.code || !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errb.String(), tt.stderr) {
				t.Errorf("exit %d, stdout %.120q, stderr %q; want %d, %q, %q", code, out.String(), errb.String(), tt.code, tt.stdout, tt.stderr)
			}
			if tt.code == 0 && errb.Len() != 0 {
				t.Errorf("stderr %q, want nothing", errb.String())
			}
		})
	}
}
