package main

import (
	"path/filepath"
	"testing"

	"github.com/vrdma/vrdma/internal/cli/clitest"
	"github.com/vrdma/vrdma/internal/version"
)

// TestCommandLine: GNU flags in help and errors, global flags after the
// scenario, --version, exit 2 for bad usage and 0 for --help.
func TestCommandLine(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	clitest.Run(t, []clitest.Case{
		{Name: "help", Args: []string{"--help"}, Stdout: "  --timeout DURATION\n"},
		{Name: "version", Args: []string{"--version"}, Stdout: "vrdma-vmtest " + version.Version},
		{Name: "unknown flag", Args: []string{"--nope"}, Code: 2, Stderr: "vrdma-vmtest: unknown option --nope\n"},
		{Name: "bad value", Args: []string{"--memory", "lots", "probe"}, Code: 2, Stderr: `vrdma-vmtest: --memory: invalid value "lots"`},
		{Name: "global flags after the scenario", Args: []string{"probe", "--qemu", missing, "--vrdmad", missing}, Code: 1, Stderr: "vrdmad: stat " + missing},
		{Name: "scenario flag error", Args: []string{"pair", "--bogus"}, Code: 2, Stderr: "vrdma-vmtest pair: unknown option --bogus\n"},
		{Name: "scenario help", Args: []string{"interop", "--help"}, Stdout: "  --op STRING\n"},
		{Name: "spinup help", Args: []string{"spinup", "-h"}, Stdout: "  --rounds N\n"},
		{Name: "hostnic help", Args: []string{"hostnic", "--help"}, Stdout: "  --kill-job OP:SIZE:ITERS\n"},
	}, run)
}
