package main

import (
	"testing"

	"github.com/vrdma/vrdma/internal/cli/clitest"
	"github.com/vrdma/vrdma/internal/version"
)

// TestCommandLine: --help and --version on standard output with exit 0,
// bad usage in GNU form with exit 2, before any guest boots.
func TestCommandLine(t *testing.T) {
	clitest.Run(t, []clitest.Case{
		{Args: []string{"--help"}, Stdout: "  --runs N\n"},
		{Args: []string{"-h"}, Stdout: "Exit status: 0 success, 1 failure, 2 bad usage."},
		{Args: []string{"--version"}, Stdout: "vrdma-compare " + version.Version},
		{Args: []string{"--nope"}, Code: 2, Stderr: "vrdma-compare: unknown option --nope\nTry 'vrdma-compare --help'"},
		{Args: []string{"--runs", "x"}, Code: 2, Stderr: `vrdma-compare: --runs: invalid value "x"`},
		{Args: []string{"--runs", "0"}, Code: 2, Stderr: "--runs 0: want 1..100"},
		{Args: []string{"stray"}, Code: 2, Stderr: `unexpected arguments ["stray"]`},
	}, run)
}
