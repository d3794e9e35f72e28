package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vrdma/vrdma/internal/version"
)

// TestGlobalFlagsAnywhere: --control and --json work before the command,
// between its words and after it.
func TestGlobalFlagsAnywhere(t *testing.T) {
	control, _ := startControl(t)
	if _, errs, code := ctl(control, "device", "add", "vm1"); code != 0 {
		t.Fatalf("device add: exit %d: %s", code, errs)
	}
	t.Setenv("VRDMA_CONTROL", filepath.Join(t.TempDir(), "nobody.sock"))
	for _, args := range [][]string{
		{"--control", control, "--json", "device", "ls"},
		{"device", "ls", "--control", control, "--json"},
		{"device", "--json", "ls", "--control=" + control},
		{"--json", "device", "ls", "-control", control},
		{"device", "show", "vm1", "--json", "--control", control},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			if code := run(args, &out, &errb); code != 0 {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			var v any
			if err := json.Unmarshal(out.Bytes(), &v); err != nil {
				t.Fatalf("output %q is not JSON: %v", out.String(), err)
			}
			if !strings.Contains(out.String(), `"vm1"`) {
				t.Errorf("output %q lacks vm1", out.String())
			}
		})
	}
	// A command's own flag after "--" is an argument, not a global flag.
	var out, errb bytes.Buffer
	if code := run([]string{"--control", control, "device", "show", "--", "--json"}, &out, &errb); code != exitNotFound {
		t.Errorf("device show -- --json: exit %d (%s), want %d: no device named --json", code, errb.String(), exitNotFound)
	}
}

// TestGNUFlags: help and errors spell flags --name.
func TestGNUFlags(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"device", "add", "--help"}, {"device", "set", "--help"}, {"vm", "attach", "--help"}} {
		var out bytes.Buffer
		if code := run(args, &out, io.Discard); code != 0 {
			t.Fatalf("%q: exit %d", args, code)
		}
		for _, line := range strings.Split(out.String(), "\n") {
			f := strings.Fields(line)
			if len(f) > 0 && strings.HasPrefix(f[0], "-") && !strings.HasPrefix(f[0], "--") && f[0] != "-h," {
				t.Errorf("%q: help line %q is not GNU (--name)", args, line)
			}
		}
	}
	var out bytes.Buffer
	run([]string{"device", "add", "--help"}, &out, io.Discard)
	for _, want := range []string{"  --socket PATH\n", "  --max-qps N\n", "--control PATH"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("device add --help lacks %q:\n%s", want, out.String())
		}
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--frob"}, "vrdmactl: unknown option --frob\n"},
		{[]string{"device", "ls", "--frob"}, "vrdmactl: device ls: unknown option --frob\n"},
		{[]string{"device", "add", "vm1", "--max-qps", "x"}, `vrdmactl: device add: --max-qps: invalid value "x"`},
		{[]string{"--control"}, "vrdmactl: option --control needs a value\n"},
	} {
		var errb bytes.Buffer
		if code := run(tt.args, io.Discard, &errb); code != exitUsage || !strings.HasPrefix(errb.String(), tt.want) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", tt.args, code, errb.String(), exitUsage, tt.want)
		}
		if !strings.Contains(errb.String(), "Try 'vrdmactl --help'") {
			t.Errorf("%q: stderr %q does not point at --help", tt.args, errb.String())
		}
	}
}

func TestVersionFlag(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"-version"}, {"--control", "/nonexistent", "--version"}} {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		if code != 0 || !strings.HasPrefix(out.String(), "vrdmactl "+version.Version) || errb.Len() != 0 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 0 and vrdmactl %s", args, code, out.String(), errb.String(), version.Version)
		}
	}
}

// TestPermissionDeniedNamesGroup runs vrdmactl as an unprivileged user
// against a control socket of mode 0660 whose group that user is not in:
// the error names the group and how to join it.
func TestPermissionDeniedNamesGroup(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run vrdmactl as another user")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	// A group nobody is not in: daemon's where it exists, else root.
	group, sockGID := "root", 0
	if g, err := user.LookupGroup("daemon"); err == nil && g.Gid != nobody.Gid {
		group = g.Name
		sockGID, _ = strconv.Atoi(g.Gid)
	}
	dir, err := os.MkdirTemp("", "vrdmactl-perm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The test binary, where nobody may run it (go test's directory is
	// its builder's alone).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "vrdmactl.test")
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "control.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chown(sock, 0, sockGID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o660); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestVrdmactlHelper$", "--", "device", "ls", "--control", sock)
	cmd.Env = append(os.Environ(), "VRDMACTL_TEST_MAIN=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitUnreachable {
		t.Fatalf("got %v, want exit status %d; stderr:\n%s", err, exitUnreachable, stderr.String())
	}
	want := "vrdmactl: " + sock + ": permission denied (join group " + group + ": usermod -aG " + group + " $USER, then log in again)\n"
	if stderr.String() != want {
		t.Errorf("stderr %q, want %q", stderr.String(), want)
	}
}

// TestVrdmactlHelper is vrdmactl when this test binary runs as one
// (VRDMACTL_TEST_MAIN=1, arguments after --); in a test run it skips.
func TestVrdmactlHelper(t *testing.T) {
	if os.Getenv("VRDMACTL_TEST_MAIN") != "1" {
		t.Skip("the vrdmactl of TestPermissionDeniedNamesGroup")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(run(args, os.Stdout, os.Stderr))
}
