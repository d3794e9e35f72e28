package tests

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tests of `vrdma-vmtest exec` and `exec-pair`, the contract scripts and
// the RDMA end-to-end tests use to run commands in guests of the
// standard-stack image (scripts/guest-stack-image.sh). They run the built
// bin/vrdma-vmtest as a user would. They skip outside CI when a binary or
// the image is missing; in CI (CI=true) they must run.

// needStackImage checks for what `vrdma-vmtest exec` needs and returns the
// path of bin/vrdma-vmtest.
func needStackImage(t *testing.T) string {
	t.Helper()
	vmtest := needBinary(t, "vrdma-vmtest")
	needBinary(t, "vrdmad")
	needBinary(t, "qemu-system-x86_64")
	for _, f := range []string{"vmlinuz", "initramfs.img"} {
		p := filepath.Join(repoRoot(t), "bin", "guest-stack", f)
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI: the stack image is missing (make guest-stack-image builds it): %v", err)
			}
			t.Skipf("stack image not built (run make guest-stack-image): %v", err)
		}
	}
	return vmtest
}

// vmtestExec runs bin/vrdma-vmtest with args and returns its stdout,
// stderr and exit status.
func vmtestExec(t *testing.T, ctx context.Context, vmtest string, args ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, vmtest, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("vrdma-vmtest %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), errb.String(), code
}

// TestVmtestExec boots one stack guest and runs `ip link; ls
// /sys/class/infiniband`: the command's output and its exit status come
// back; eth0 is there; with the vrdma driver in the image, so is vrdma0,
// rmmod succeeds and the kernel logged no warning.
func TestVmtestExec(t *testing.T) {
	vmtest := needStackImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out, errs, code := vmtestExec(t, ctx, vmtest, "exec", "--timeout", "3m",
		"--cmd", "ip link; ls /sys/class/infiniband; printf no-newline; exit 3")
	if code != 3 {
		t.Fatalf("got exit %d, want the command's 3\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, want := range []string{"VRDMA-INIT ", "VRDMA-CMD-START ", "eth0: <BROADCAST,MULTICAST,UP,LOWER_UP>",
		"link/ether 52:54:00:00:00:01", "\nno-newline\n", "\nVRDMA-CMD-EXIT 3\n", "\nVRDMA-EXIT 3\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "the image has no vrdma.ko") {
		t.Logf("the image has no vrdma.ko (VRDMA_STACK_ALLOW_MISSING=1): device checks skipped")
		return
	}
	for _, want := range []string{"\nvrdma0\n", "vrdma0 node_guid 5254:00ff:fe00:0001", "\nVRDMA-RMMOD ok\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"VRDMA-ERROR", "VRDMA-KERNEL-WARNING"} {
		if strings.Contains(out, bad) {
			t.Errorf("stdout holds %s:\n%s\nstderr:\n%s", bad, out, errs)
		}
	}
}

// TestVmtestExecPair boots two stack guests joined by virtio-net: the
// client's command starts once the server's listens, {server} is the
// server's address, every line carries its guest's prefix, and both
// commands exiting 0 make the pair exit 0.
func TestVmtestExecPair(t *testing.T) {
	vmtest := needStackImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out, errs, code := vmtestExec(t, ctx, vmtest, "exec-pair", "--timeout", "3m",
		"--server", "nc -l -p 5000 >/tmp/got && cat /tmp/got",
		"--client", "echo hello from {client} | nc {server} 5000")
	if code != 0 {
		t.Fatalf("got exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, want := range []string{"server| VRDMA-LISTEN 5000\n", "server| hello from 10.11.0.2\n",
		"client| VRDMA-CMD-EXIT 0\n", "server| VRDMA-EXIT 0\n", "client| VRDMA-EXIT 0\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if !strings.HasPrefix(l, "server| ") && !strings.HasPrefix(l, "client| ") {
			t.Errorf("line without a guest prefix: %q", l)
		}
	}
	// The client waited for the server to listen.
	if !strings.Contains(errs, "client released: listen") {
		t.Errorf("stderr does not say the client was released on listen:\n%s", errs)
	}
}
