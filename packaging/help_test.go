package packaging

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestHelp builds every command (cmd/*) and runs its --help, and every
// vrdmactl command's: each must exit 0 and print its usage on standard
// output (where `cmd --help | less` and man_test.go, which checks the
// manual pages' OPTIONS against it, read it), with nothing on standard
// error.
func TestHelp(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds every command (make test runs it in its full pass)")
	}
	goBin := need(t, "go")
	bin := t.TempDir()
	cmds, err := filepath.Glob("../cmd/*")
	if err != nil || len(cmds) == 0 {
		t.Fatalf("no commands in ../cmd: %v", err)
	}
	build := exec.Command(goBin, "build", "-o", bin+"/", "../cmd/...")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cases := [][]string{}
	for _, c := range cmds {
		cases = append(cases, []string{filepath.Base(c), "--help"})
	}
	// vrdmactl's commands, from its own usage text.
	usage, _ := exec.Command(filepath.Join(bin, "vrdmactl"), "--help").Output()
	for _, line := range strings.Split(string(usage), "\n") {
		// "  vrdmactl device add ID [--socket PATH] ...": a command line of
		// the Commands section.
		f := strings.Fields(line)
		if !strings.HasPrefix(line, "  vrdmactl ") || len(f) < 2 || strings.HasPrefix(f[1], "-") || f[1] == "help" {
			continue
		}
		args := []string{"vrdmactl", f[1]}
		if len(f) > 2 && !strings.HasPrefix(f[2], "-") && !strings.HasPrefix(f[2], "(") &&
			strings.ToLower(f[2]) == f[2] && !strings.Contains(f[2], "|") {
			args = append(args, f[2])
		}
		args = append(args, "--help")
		if !slices.ContainsFunc(cases, func(c []string) bool { return slices.Equal(c, args) }) {
			cases = append(cases, args)
		}
	}
	if len(cases) < len(cmds)+7 {
		t.Errorf("found %d vrdmactl commands in its --help, want at least 7:\n%s", len(cases)-len(cmds), usage)
	}
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			cmd := exec.Command(filepath.Join(bin, args[0]), args[1:]...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if err != nil {
				t.Errorf("exit: %v, want status 0", err)
			}
			if !strings.Contains(strings.ToLower(stdout.String()), "usage") {
				t.Errorf("no usage on standard output (got %d bytes: %.120q)", stdout.Len(), stdout.String())
			}
			if stderr.Len() != 0 {
				t.Errorf("standard error: %.200q, want nothing", stderr.String())
			}
		})
	}
}
