// Package clitest checks a vrdma program's command line the way every
// program's own test wants it checked (internal/cli's rules): the exit
// status, what standard output and standard error say, nothing on standard
// error when the program succeeded, and no flag named the Go way (-name).
package clitest

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// Case is one command line and what it must produce.
type Case struct {
	Name   string // the subtest's name (default: the arguments)
	Args   []string
	Code   int    // the exit status
	Stdout string // text standard output must contain
	Stderr string // text standard error must contain
	// Foreign: the output quotes another program's command line (QEMU's
	// -chardev, -device), whose single-dash options are not this
	// program's flags.
	Foreign bool
}

// Run runs every case through run, the program's entry point, each as a
// subtest of t.
func Run(t *testing.T, cases []Case, run func(args []string, stdout, stderr io.Writer) int) {
	t.Helper()
	for _, tc := range cases {
		name := tc.Name
		if name == "" {
			name = strings.Join(tc.Args, " ")
		}
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.Args, &out, &errb)
			if code != tc.Code || !strings.Contains(out.String(), tc.Stdout) || !strings.Contains(errb.String(), tc.Stderr) {
				t.Errorf("exit %d, stdout %.200q, stderr %.200q; want %d, %q, %q", code, out.String(), errb.String(), tc.Code, tc.Stdout, tc.Stderr)
			}
			if tc.Code == 0 && errb.Len() != 0 {
				t.Errorf("stderr %q, want nothing", errb.String())
			}
			if tc.Foreign {
				return
			}
			for _, l := range strings.Split(out.String()+errb.String(), "\n") {
				if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "-") && len(f[0]) > 2 && !strings.HasPrefix(f[0], "--") {
					t.Errorf("line %q names a flag the Go way (-name)", l)
				}
			}
		})
	}
}
