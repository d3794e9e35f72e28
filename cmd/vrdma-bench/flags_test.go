package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/version"
)

// TestCommandLine: --help and --version on standard output with exit 0,
// bad usage in GNU form with exit 2, before any section runs.
func TestCommandLine(t *testing.T) {
	tests := []struct {
		args           []string
		code           int
		stdout, stderr string
	}{
		{[]string{"--help"}, 0, "  --row-time DURATION\n", ""},
		{[]string{"--version"}, 0, "vrdma-bench " + version.Version, ""},
		{[]string{"--nope"}, 2, "", "vrdma-bench: unknown option --nope\nTry 'vrdma-bench --help'"},
		{[]string{"--repeats", "x"}, 2, "", `vrdma-bench: --repeats: invalid value "x"`},
		{[]string{"--repeats", "0"}, 2, "", "--repeats 1 … 100"},
		{[]string{"--pairs", "2,4"}, 2, "", "--pairs"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := cli.Exit(&out, &errb, "vrdma-bench", run(tt.args, &out))
			if code != tt.code || !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errb.String(), tt.stderr) {
				t.Errorf("exit %d, stdout %.120q, stderr %q; want %d, %q, %q", code, out.String(), errb.String(), tt.code, tt.stdout, tt.stderr)
			}
		})
	}
}
