package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/cli/clitest"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/memmap"
	"golang.org/x/sys/unix"
)

// TestFlagRules: the daemon's flags obey the control API's ranges and ID
// rules, and a command line that breaks them is bad usage (exit status
// 2) named by its flag, before anything is served.
func TestFlagRules(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "x.sock")
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" : accepted (checked without serving)
	}{
		{"max-qps at the API's bound", []string{"--max-qps", "65536"}, ""},
		{"max-qps beyond it", []string{"--max-qps", "65537"}, "--max-qps: 65537 out of range [1, 65536]"},
		{"max-qps beyond uint32", []string{"--max-qps", "4294967297"}, "--max-qps: 4294967297 out of range"},
		{"max-cqs beyond", []string{"--max-cqs", "70000"}, "--max-cqs: 70000 out of range [1, 65536]"},
		{"max-mrs beyond", []string{"--max-mrs", "1048577"}, "--max-mrs: 1048577 out of range [1, 1048576]"},
		{"max-pinned below a hugepage", []string{"--max-pinned", "1M"}, "--max-pinned: 1MiB (1048576 bytes) out of range [2MiB, 256TiB]"},
		{"max-pinned beyond 2^48", []string{"--max-pinned", "512T"}, "--max-pinned: 512TiB"},
		{"max-pinned at the bound", []string{"--max-pinned", "2M"}, ""},
		{"global-max-pinned below", []string{"--global-max-pinned", "4096"}, "--global-max-pinned: 4KiB (4096 bytes) out of range"},
		{"doorbell-queues beyond", []string{"--doorbell-queues", "257"}, "--doorbell-queues: 257 out of range [0, 256]"},
		{"doorbell-queues negative", []string{"--doorbell-queues", "-1"}, "--doorbell-queues: -1 out of range"},
		{"roce-paths beyond", []string{"--roce-paths", "65"}, "--roce-paths 65: out of range [1, 64]"},
		{"not a number", []string{"--max-qps", "many"}, `--max-qps: invalid value "many"`},
		{"unknown flag", []string{"--frob"}, "unknown option --frob"},
		{"stray argument", []string{"serve"}, `unexpected arguments: ["serve"]`},
		{"explicit ID not an ID", []string{"--socket", "1vm=" + sock}, `--socket 1vm=` + sock + `: device ID "1vm": "1vm" must start with a letter`},
		{"explicit ID too long", []string{"--socket", strings.Repeat("a", 65) + "=" + sock}, "longer than 64 bytes"},
		{"two sockets, one derived ID", []string{"--socket", filepath.Join(dir, "a", "vm.sock"), "--socket", filepath.Join(dir, "b", "vm.sock")}, `device ID "vm", taken from the file name, is --socket ` + filepath.Join(dir, "a", "vm.sock") + `'s too: name the device`},
		{"two sockets, one ID", []string{"--socket", "vm=" + sock, "--socket-path", filepath.Join(dir, "vm.sock")}, `device ID "vm", taken from the file name, is --socket vm=`},
		{"socket path too long", []string{"--socket", "/" + strings.Repeat("s", 120)}, "longer than 107 bytes"},
		{"world-readable socket", []string{"--socket-mode", "0666"}, "--socket-mode 0666 lets every local user connect to the device sockets"},
		{"any other bit", []string{"--socket-mode", "0601"}, "add --allow-world-socket to mean it"},
		{"world socket acknowledged", []string{"--socket-mode", "0666", "--allow-world-socket"}, ""},
		{"group socket", []string{"--socket-mode", "0660"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFlags()
			args := tt.args
			err := cli.Parse(f.fs, args)
			if err == nil {
				err = f.check()
			}
			if err == nil {
				_, err = f.daemonConfig()
				if err != nil {
					err = cli.Usagef("%w", err)
				}
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("%q: %v, want it accepted", args, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("%q: got %v, want an error with %q", args, err, tt.wantErr)
			}
			if !errors.Is(err, cli.ErrUsage) || exitCode(err) != 2 {
				t.Errorf("%q: %v is not bad usage (exit %d, want 2)", args, err, exitCode(err))
			}
		})
	}
}

// TestFlagRulesAreTheAPIs: a value at each side of the API's bounds gets
// the same verdict from the flag and from POST /v1/devices.
func TestFlagRulesAreTheAPIs(t *testing.T) {
	for _, c := range []struct {
		flag, key string
		values    []string
	}{
		{"--max-qps", "max_qps", []string{"0", "1", "65536", "65537"}},
		{"--max-cqs", "max_cqs", []string{"65536", "65537"}},
		{"--max-mrs", "max_mrs", []string{"1048576", "1048577"}},
		{"--max-pinned", "max_pinned_bytes", []string{"0", "2097151", "2097152", "281474976710656", "281474976710657"}},
	} {
		for _, v := range c.values {
			f := newFlags()
			if err := cli.Parse(f.fs, []string{c.flag, v}); err != nil {
				t.Fatal(err)
			}
			_, flagErr := f.daemonConfig()
			body := `{"id":"x","socket":"/run/x.sock","limits":{"` + c.key + `":` + v + `}}`
			_, apiErr := daemon.DecodeAddRequest([]byte(body))
			if (flagErr == nil) != (apiErr == nil) {
				t.Errorf("%s %s: flag says %v, API says %v", c.flag, v, flagErr, apiErr)
			}
		}
	}
}

func TestSocketID(t *testing.T) {
	tests := []struct {
		path string
		i    int
		want string
	}{
		{"/run/vrdma/vm1.sock", 0, "vm1"},
		{"/run/vrdma/1vm.sock", 0, "vrdma-1vm"},
		{"/run/vrdma/vm 1.sock", 0, "vm-1"},
		{"/run/vrdma/tenant:a.sock", 0, "tenant-a"},
		{"/run/vrdma/é.sock", 2, "vrdma2"},
		{"/run/vrdma/" + strings.Repeat("v", 80) + ".sock", 0, strings.Repeat("v", 64)},
		{"@abstract", 3, "vrdma3"},
		{"/", 1, "vrdma1"},
	}
	for _, tt := range tests {
		got := socketID(tt.path, tt.i)
		if got != tt.want {
			t.Errorf("socketID(%q, %d) = %q, want %q", tt.path, tt.i, got, tt.want)
		}
		if err := daemon.CheckID(got); err != nil {
			t.Errorf("socketID(%q) = %q, which the API refuses: %v", tt.path, got, err)
		}
	}
}

// TestDerivedIDServed: a socket whose file name is no device ID serves
// a device under the derived one.
func TestDerivedIDServed(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "2nd vm.sock")
	control := filepath.Join(dir, "control.sock")
	c := startVrdmad(t, startOpts{}, "--socket", sock, "--control", control, "--state-dir=")
	if !c.logHas("vrdmad serving", 10*time.Second) {
		t.Fatalf("vrdmad did not start:\n%s", c.log())
	}
	devs := devices(t, control)
	if d, ok := devs["vrdma-2nd-vm"]; len(devs) != 1 || !ok || d.Socket != sock {
		t.Errorf("devices %+v, want vrdma-2nd-vm on %s", devs, sock)
	}
	c.stop(t, nil)
}

func TestMemlockWarning(t *testing.T) {
	const mib = 1 << 20
	var (
		unbounded = daemon.Config{}
		bounded   = daemon.Config{Pin: daemonPin(0, 64*mib)}
		global    = daemon.Config{Pin: daemonPin(0, 8*mib), GlobalMaxPinned: 128 * mib}
		all       = daemon.Config{Pin: daemonPin(1, 0)}
	)
	tests := []struct {
		name    string
		limit   uint64
		cfg     daemon.Config
		capable bool
		want    string
	}{
		{"unbounded pins, small limit", 8 * mib, unbounded, false, "pins are unbounded"},
		{"unbounded pins, CAP_IPC_LOCK", 8 * mib, unbounded, true, ""},
		{"bound above the limit", 8 * mib, bounded, false, "below the configured pin bound"},
		{"bound above the limit, CAP_IPC_LOCK", 8 * mib, bounded, true, ""},
		{"bound under the limit", 128 * mib, bounded, false, ""},
		{"global bound counts", 64 * mib, global, false, "(134217728 bytes)"},
		{"pin all", 8 * mib, all, false, "--pin=all"},
		{"pin all, CAP_IPC_LOCK", 8 * mib, all, true, ""},
		{"infinite limit", unix.RLIM_INFINITY, unbounded, false, ""},
	}
	for _, tt := range tests {
		got := memlockWarning(tt.limit, tt.cfg, tt.capable)
		if (got == "") != (tt.want == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
	// This process: root in the tests, with CAP_IPC_LOCK unless a
	// container took it away; capget must answer either way.
	if _, err := hasCapIPCLock(); err != nil {
		t.Errorf("capget: %v", err)
	}
}

// TestUsageExit: bad usage exits 2, --help and --version exit 0 with
// their text on standard output, in the real process.
func TestUsageExit(t *testing.T) {
	clitest.Run(t, []clitest.Case{
		{Args: []string{"--frob"}, Code: 2, Stderr: "vrdmad: unknown option --frob"},
		{Args: []string{"--max-qps", "65537", "--socket", "/tmp/vrdmad-usage-test.sock"}, Code: 2, Stderr: "--max-qps: 65537 out of range"},
		{Args: []string{"--help"}, Stdout: "  --allow-world-socket\n", Foreign: true}, // it shows QEMU's -device line
		{Args: []string{"--version"}, Stdout: "vrdmad "},
	}, func(args []string, stdout, stderr io.Writer) int {
		out, errOut, code := runVrdmadOnce(t, args...)
		io.WriteString(stdout, out)
		io.WriteString(stderr, errOut)
		return code
	})
	if _, err := os.Lstat("/tmp/vrdmad-usage-test.sock"); err == nil {
		t.Error("a refused command line created its socket")
	}
}

// daemonPin is a pin configuration: all != 0 pins everything.
func daemonPin(all int, max uint64) memmap.PinConfig {
	return memmap.PinConfig{All: all != 0, MaxPinned: max}
}

// runVrdmadOnce runs vrdmad (this test binary as main) to its exit and
// returns its standard output, standard error and exit status.
func runVrdmadOnce(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), "VRDMAD_TEST_MAIN=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}
