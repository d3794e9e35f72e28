package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/version"
)

// TestCommandLine: GNU flags in help and errors, global flags after the
// scenario, --version, exit 2 for bad usage and 0 for --help.
func TestCommandLine(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	tests := []struct {
		name           string
		args           []string
		code           int
		stdout, stderr string
	}{
		{"help", []string{"--help"}, 0, "  --timeout DURATION\n", ""},
		{"version", []string{"--version"}, 0, "vrdma-vmtest " + version.Version, ""},
		{"unknown flag", []string{"--nope"}, 2, "", "vrdma-vmtest: unknown option --nope\n"},
		{"bad value", []string{"--memory", "lots", "probe"}, 2, "", `vrdma-vmtest: --memory: invalid value "lots"`},
		{"global flags after the scenario", []string{"probe", "--qemu", missing, "--vrdmad", missing}, 1, "", "vrdmad: stat " + missing},
		{"scenario flag error", []string{"pair", "--bogus"}, 2, "", "vrdma-vmtest pair: unknown option --bogus\n"},
		{"scenario help", []string{"interop", "--help"}, 0, "  --op STRING\n", ""},
		{"spinup help", []string{"spinup", "-h"}, 0, "  --rounds N\n", ""},
		{"hostnic help", []string{"hostnic", "--help"}, 0, "  --kill-job OP:SIZE:ITERS\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tt.args, &out, &errb)
			if code != tt.code || !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errb.String(), tt.stderr) {
				t.Errorf("exit %d, stdout %.200q, stderr %.200q; want %d, %q, %q", code, out.String(), errb.String(), tt.code, tt.stdout, tt.stderr)
			}
			if tt.code == 0 && errb.Len() != 0 {
				t.Errorf("stderr %q, want nothing", errb.String())
			}
			for _, l := range strings.Split(out.String()+errb.String(), "\n") {
				if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "-") && len(f[0]) > 2 && !strings.HasPrefix(f[0], "--") {
					t.Errorf("line %q names a flag the Go way (-name)", l)
				}
			}
		})
	}
}
