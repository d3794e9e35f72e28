package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// TestHotplug is the device lifecycle on a running VM, as an operator runs
// it: boot a VM with no vrdma device and a QMP socket, then twice:
// vrdmactl device add + vm attach, the guest rescans PCI, probes and runs
// the selftest, vrdmactl vm detach + device rm, and the daemon is left
// with no device and nothing pinned. Times are measured and printed,
// never asserted.
func TestHotplug(t *testing.T) {
	env := needGuestImage(t)
	ctl := needBinary(t, "vrdmactl")
	const rounds = 2
	dir := t.TempDir()
	d := startVrdmad(t, dir)
	qmpSock := filepath.Join(dir, "qmp.sock")
	env.vms.Add(1)
	cfg := guestvm.Config{
		Name: "hotplug", QEMU: env.qemu, Kernel: env.kernel, Initrd: env.initrd,
		Run: "hotplug", Args: []string{"--rounds", fmt.Sprint(rounds), "--ack"},
		// What an operator's VM has: two free root ports and a QMP socket
		// of its own (guestvm keeps the one vmm/qemu opens).
		ExtraQEMUArgs: []string{
			"-device", "pcie-root-port,id=vrdma-rp0,bus=pcie.0,chassis=1",
			"-device", "pcie-root-port,id=vrdma-rp1,bus=pcie.0,chassis=2",
			"-chardev", "socket,id=opqmp,path=" + qmpSock + ",server=on,wait=off",
			"-mon", "chardev=opqmp,mode=control",
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	g := boot(t, ctx, cfg)
	lines := g.Lines()
	// next returns the guest's next hotplug result.
	next := func(want string, round int) guestresult.Hotplug {
		t.Helper()
		return nextGuestEvent[guestresult.Hotplug](t, ctx, lines, guestresult.RoleHotplug, want, round)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, ctl, append([]string{"--control", d.control}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("vrdmactl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String()
	}
	// The VM's QMP socket must be up before the first attach.
	waitFile(t, qmpSock)
	var summary []string
	for r := 1; r <= rounds; r++ {
		sock := filepath.Join(dir, "hp0.sock")
		next("waiting", r)
		start := time.Now()
		run("device", "add", "hp0", "--socket", sock, "--max-qps", "16", "--max-pinned", "64M")
		run("vm", "attach", "--qmp", qmpSock, "--device", "hp0")
		attached := time.Since(start)
		ev := next("usable", r)
		usable := time.Since(start)
		next("attached", r)
		if info := deviceInfo(t, d, "hp0"); !info.Connected || info.Limits.MaxQPs != 16 {
			t.Errorf("round %d: got connected=%v max_qps=%d, want true 16", r, info.Connected, info.Limits.MaxQPs)
		}
		start = time.Now()
		run("vm", "detach", "--qmp", qmpSock, "--device", "hp0")
		detached := time.Since(start)
		run("device", "rm", "hp0")
		removed := time.Since(start)
		gone := next("detached", r)
		devs, err := d.devices()
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) != 0 {
			t.Errorf("round %d: after device rm got %d devices, want none", r, len(devs))
		}
		health, err := d.Client().Health(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if health.Devices != 0 || health.PinnedBytes != 0 {
			t.Errorf("round %d: health got %d devices, %d bytes pinned; want 0, 0", r, health.Devices, health.PinnedBytes)
		}
		if _, err := os.Stat(sock); !os.IsNotExist(err) {
			t.Errorf("round %d: socket after device rm: got %v, want it gone", r, err)
		}
		if err := g.WriteLine("VRDMA-NEXT"); err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("round %d: add+attach %.3f s, probe passed in guest after %.3f s (guest: rescan to probe %.3f s); detach %.3f s (guest released the slot: %v), +rm %.3f s",
			r, attached.Seconds(), usable.Seconds(), ev.ProbeS, detached.Seconds(), gone.Released, removed.Seconds())
		t.Log(line)
		summary = append(summary, line)
	}
	res, err := g.WaitResult(ctx)
	if err != nil {
		t.Fatalf("guest: %v (results %d)", err, len(res))
	}
	fmt.Printf("hot-plug spin-up:\n  %s\n", strings.Join(summary, "\n  "))
}

// waitFile waits until path exists (a socket QEMU creates).
func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", path)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOperationsCurl runs the curl lines of docs/operations.md as written,
// with /run/vrdma/ moved to a temporary directory, against a real vrdmad.
func TestOperationsCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: curl is missing (apt-get install curl): %v", err)
		}
		t.Skipf("curl not installed: %v", err)
	}
	doc, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "curl ") {
			cmds = append(cmds, line)
		}
	}
	if len(cmds) < 5 {
		t.Fatalf("docs/operations.md: got %d curl lines, want at least 5", len(cmds))
	}
	dir := t.TempDir()
	d := startVrdmad(t, dir)
	for _, c := range cmds {
		c = strings.ReplaceAll(c, "/run/vrdma/", dir+"/")
		c = strings.Replace(c, "curl ", curl+" ", 1)
		out, err := exec.Command("sh", "-c", c).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", c, err, out)
		}
		var v any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Errorf("%s: answer %q is not JSON: %v", c, out, err)
		}
	}
	// The lines add a device and remove it again.
	devs, err := d.devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 0 {
		t.Errorf("after the documented lines got %d devices, want none", len(devs))
	}
}

// nextGuestEvent reads the guest console until the next VRDMA-RESULT of
// role, which must be event want of round, and returns it decoded as a T.
func nextGuestEvent[T any](t *testing.T, ctx context.Context, lines <-chan string, role, want string, round int) T {
	t.Helper()
	for {
		select {
		case s, ok := <-lines:
			if !ok {
				t.Fatalf("guest console closed while waiting for %s of round %d", want, round)
			}
			kind, payload := guestvm.Classify(s)
			if kind == guestvm.KindError {
				t.Fatalf("guest: VRDMA-ERROR %s", payload)
			}
			if kind != guestvm.KindResult {
				continue
			}
			var ev T
			ok, err := guestresult.DecodeStep(payload, role, want, round, &ev)
			if err != nil {
				t.Fatalf("guest: %v", err)
			}
			if ok {
				return ev
			}
		case <-ctx.Done():
			t.Fatalf("no %s of round %d from the guest: %v", want, round, ctx.Err())
		}
	}
}
