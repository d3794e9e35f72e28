package main

import (
	"io"
	"testing"

	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/cli/clitest"
	"github.com/vrdma/vrdma/internal/version"
)

// TestCommandLine: --help and --version on standard output with exit 0,
// bad usage in GNU form with exit 2, before any section runs.
func TestCommandLine(t *testing.T) {
	clitest.Run(t, []clitest.Case{
		{Args: []string{"--help"}, Stdout: "  --row-time DURATION\n"},
		{Args: []string{"--version"}, Stdout: "vrdma-bench " + version.Version},
		{Args: []string{"--nope"}, Code: 2, Stderr: "vrdma-bench: unknown option --nope\nTry 'vrdma-bench --help'"},
		{Args: []string{"--repeats", "x"}, Code: 2, Stderr: `vrdma-bench: --repeats: invalid value "x"`},
		{Args: []string{"--repeats", "0"}, Code: 2, Stderr: "--repeats 1 … 100"},
		{Args: []string{"--pairs", "2,4"}, Code: 2, Stderr: "--pairs"},
	}, func(args []string, stdout, stderr io.Writer) int {
		return cli.Exit(stdout, stderr, "vrdma-bench", run(args, stdout))
	})
}
