package qemu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testBinary returns the patched QEMU (bin/ of the repository or
// $VRDMA_QEMU). Without one the test is skipped, unless $CI is set: CI
// builds QEMU, so there a missing binary is a failure.
func testBinary(t *testing.T) string {
	t.Helper()
	bin, err := FindBinary(filepath.Join("..", ".."))
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but no QEMU binary: %v", err)
		}
		t.Skipf("no patched QEMU binary (run `make qemu` or set $%s): %v", EnvBinary, err)
	}
	return bin
}

// processGone waits until pid no longer exists.
func processGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		// A zombie still answers kill(0); it is gone for our purposes.
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			if f := strings.Fields(string(b)); len(f) > 2 && f[2] == "Z" {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// qemuProcessesWith lists live processes whose command line contains s.
func qemuProcessesWith(s string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte(s)) || !bytes.Contains(b, []byte("qemu")) {
			continue
		}
		if !processGone(pid, 0) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestQEMUStartQueryPCIQuit(t *testing.T) {
	bin := testBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	name, err := DeviceName(ctx, bin)
	if err != nil || name != DeviceNameRDMA {
		t.Errorf("DeviceName: got %q, %v, want %q (make qemu builds it with patches/0003)", name, err, DeviceNameRDMA)
	}
	if ok, err := HasDevice(ctx, bin, DeviceNameGeneric); err != nil || !ok {
		t.Errorf("HasDevice(%s): got %v, %v, want the generic device kept user-creatable (patches/0001)", DeviceNameGeneric, ok, err)
	}

	qmpSock := filepath.Join(t.TempDir(), "qmp.sock")
	vm, err := Start(ctx, Config{Binary: bin, MemoryMiB: 128, QMPSocket: qmpSock, RootPorts: 1})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = vm.Kill() })
	pid := vm.PID()

	devs, err := vm.QueryPCI(ctx)
	if err != nil {
		t.Fatalf("QueryPCI: %v", err)
	}
	var host, port *PCIDevice
	for i := range devs {
		d := &devs[i]
		switch {
		case d.VendorID == 0x8086 && d.DeviceID == 0x29c0:
			host = d
		case d.VendorID == 0x1b36 && d.DeviceID == 0x000c:
			port = d
		}
	}
	if host == nil || host.Bus != 0 || host.Slot != 0 || host.Function != 0 || host.ClassInfo != "Host bridge" {
		t.Errorf("got host bridge %+v, want 8086:29c0 at 00:00.0 (all: %+v)", host, devs)
	}
	if port == nil || port.ID != "vrdma-rp0" {
		t.Errorf("got root port %+v, want 1b36:000c with id vrdma-rp0 (all: %+v)", port, devs)
	}
	if free, err := FreeRootPort(ctx, vm.QMP()); err != nil || free != "vrdma-rp0" {
		t.Errorf("FreeRootPort: got %q, %v, want vrdma-rp0", free, err)
	}

	// Hot-plug with no back-end listening: QEMU accepts our chardev-add
	// (reconnect-ms), the back-end never answers, the chardev is removed.
	actx, acancel := context.WithTimeout(ctx, 500*time.Millisecond)
	err = vm.AttachVhostUser(actx, VhostUserDevice{ID: "rdma9", Socket: filepath.Join(t.TempDir(), "none.sock")}, "")
	acancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("AttachVhostUser without back-end: got %v, want DeadlineExceeded", err)
	}
	raw, err := vm.run(ctx, "query-chardev", nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), "rdma9-chr") {
		t.Errorf("chardev rdma9-chr left after a failed attach: %s", raw)
	}
	// QEMU refuses to detach what is not there, and says so.
	if err := vm.DetachVhostUser(ctx, "nosuch"); !errors.Is(err, ErrQMP) {
		t.Errorf("DetachVhostUser(nosuch): got %v, want ErrQMP", err)
	}

	if err := vm.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := vm.Wait(); err != nil {
		t.Errorf("Wait after quit: got %v, want nil (exit status 0)", err)
	}
	if !processGone(pid, 5*time.Second) {
		t.Errorf("qemu %d still running after Shutdown", pid)
	}
	if left := qemuProcessesWith(qmpSock); len(left) > 0 {
		t.Errorf("qemu processes left: %v", left)
	}
	if _, err := vm.QueryPCI(ctx); !errors.Is(err, ErrExited) {
		t.Errorf("QueryPCI after exit: got %v, want ErrExited", err)
	}
}

func TestQEMUKill(t *testing.T) {
	bin := testBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vm, err := Start(ctx, Config{Binary: bin, MemoryMiB: 64})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	sock := vm.cfg.QMPSocket
	if err := vm.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if err := vm.Kill(); err != nil {
		t.Errorf("second Kill: got %v, want nil", err)
	}
	if err := vm.Wait(); err == nil {
		t.Errorf("Wait after Kill: got nil, want the kill signal")
	}
	if !processGone(vm.PID(), 5*time.Second) {
		t.Errorf("qemu %d still running after Kill", vm.PID())
	}
	if _, err := os.Stat(filepath.Dir(sock)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("private QMP dir %s: got %v, want it removed", filepath.Dir(sock), err)
	}
}

func TestQEMUStartFailure(t *testing.T) {
	bin := testBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	marker := "vrdma-bogus-" + strconv.Itoa(os.Getpid())
	_, err := Start(ctx, Config{Binary: bin, ExtraArgs: []string{"-device", marker}})
	if !errors.Is(err, ErrExited) {
		t.Fatalf("Start with a bad device: got %v, want ErrExited", err)
	}
	if !strings.Contains(err.Error(), marker) {
		t.Errorf("got error %q, want QEMU's complaint about %s in it", err, marker)
	}
	if left := qemuProcessesWith(marker); len(left) > 0 {
		t.Errorf("qemu processes left: %v", left)
	}
}

// TestQEMUDiesWithParent starts a child test process that starts QEMU,
// SIGKILLs the child and checks that QEMU follows it.
func TestQEMUDiesWithParent(t *testing.T) {
	if os.Getenv("VRDMA_QEMU_CHILD") == "1" {
		bin := testBinary(t)
		vm, err := Start(context.Background(), Config{Binary: bin, MemoryMiB: 64})
		if err != nil {
			t.Fatalf("child Start: %v", err)
		}
		fmt.Printf("QEMU_PID=%d\n", vm.PID())
		time.Sleep(time.Minute) // killed by the parent long before
		return
	}
	testBinary(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestQEMUDiesWithParent$", "-test.v")
	cmd.Env = append(os.Environ(), "VRDMA_QEMU_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := 0
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "QEMU_PID="); ok {
			pid, _ = strconv.Atoi(v)
			break
		}
	}
	if pid == 0 {
		t.Fatal("child printed no QEMU_PID")
	}
	if processGone(pid, 0) {
		t.Fatalf("qemu %d not running in the child", pid)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !processGone(pid, 5*time.Second) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Fatalf("qemu %d outlived its parent", pid)
	}
}
