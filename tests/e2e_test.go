package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// End-to-end tests: real guests (scripts/guest-image.sh: Debian's cloud
// kernel, busybox, vrdma-guest) under the patched QEMU (TCG), each with a
// vrdma device of the vrdmad binary, driven through vmm/guestvm. They skip
// outside CI when QEMU or the guest image is missing; in CI (CI=true) they
// must run.

// e2eWait bounds one guest run; boots take about 3 s under TCG.
const e2eWait = 3 * time.Minute

type e2eEnv struct {
	qemu, kernel, initrd string
	vms                  atomic.Int32
}

func needGuestImage(t *testing.T) *e2eEnv {
	t.Helper()
	env := &e2eEnv{qemu: needBinary(t, "qemu-system-x86_64")}
	needBinary(t, "vrdmad")
	for _, f := range []struct {
		path *string
		name string
	}{{&env.kernel, "vmlinuz"}, {&env.initrd, "initramfs.img"}} {
		*f.path = filepath.Join(repoRoot(t), "bin", "guest", f.name)
		if _, err := os.Stat(*f.path); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI: the guest image is missing (make guest-image builds it): %v", err)
			}
			t.Skipf("guest image not built (run make guest-image): %v", err)
		}
	}
	return env
}

func e2eDevice(id, sock string) qemu.VhostUserDevice {
	return qemu.VhostUserDevice{ID: id, Socket: sock, VirtioID: abi.DeviceID,
		NumVQs: abi.FirstDoorbellQueue + 1, VQSize: 256, ConfigSize: abi.ConfigSize}
}

func (env *e2eEnv) guest(name, sock, run string, args ...string) guestvm.Config {
	env.vms.Add(1)
	return guestvm.Config{Name: name, QEMU: env.qemu, Kernel: env.kernel, Initrd: env.initrd,
		Run: run, Args: args, Devices: []qemu.VhostUserDevice{e2eDevice(name, sock)}}
}

// boot boots a guest that is closed at cleanup, its log printed if the
// test failed.
func boot(t *testing.T, ctx context.Context, cfg guestvm.Config) *guestvm.Guest {
	t.Helper()
	g, err := guestvm.Boot(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", g.Log())
		}
		if err := g.Close(); err != nil {
			t.Errorf("close guest %s: %v", g.Name(), err)
		}
	})
	return g
}

func startPair(t *testing.T, ctx context.Context, server, client guestvm.Config) *guestvm.Pair {
	t.Helper()
	p, err := guestvm.StartPair(ctx, server, client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s", p.Log())
		}
		if err := p.Close(); err != nil {
			t.Errorf("close pair: %v", err)
		}
	})
	return p
}

// waitLine waits for g's first line of kind k and returns its payload.
func waitLine(t *testing.T, ctx context.Context, g *guestvm.Guest, k guestvm.Kind) string {
	t.Helper()
	lines := g.Lines()
	for {
		select {
		case s, ok := <-lines:
			if !ok {
				t.Fatalf("guest %s: console closed before a line of kind %d", g.Name(), k)
			}
			if kind, payload := guestvm.Classify(s); kind == k {
				return payload
			} else if kind == guestvm.KindError {
				t.Fatalf("guest %s: VRDMA-ERROR %s", g.Name(), payload)
			}
		case <-ctx.Done():
			t.Fatalf("guest %s: no line of kind %d: %v", g.Name(), k, ctx.Err())
		}
	}
}

// devicer is a running vrdmad's control API: *vrdmadProc and the restart
// tests' *killableVrdmad.
type devicer interface {
	Devices() ([]controlapi.DeviceInfo, error)
}

// deviceInfo returns the daemon's view of device id.
func deviceInfo(t *testing.T, d devicer, id string) controlapi.DeviceInfo {
	t.Helper()
	devs, err := d.Devices()
	if err != nil {
		t.Fatalf("control API: %v", err)
	}
	for _, dv := range devs {
		if dv.ID == id {
			return dv
		}
	}
	t.Fatalf("control API has no device %q: %+v", id, devs)
	return controlapi.DeviceInfo{}
}

func TestE2E(t *testing.T) {
	env := needGuestImage(t)
	start := time.Now()
	t.Cleanup(func() {
		wall := time.Since(start)
		t.Logf("e2e: %d VMs booted, wall time %.1f s", env.vms.Load(), wall.Seconds())
		line := fmt.Sprintf("e2e summary: %d VMs, wall time %.1f s\n", env.vms.Load(), wall.Seconds())
		fmt.Print(line)
		// go test shows a passing test's output only with -v: make test
		// prints this file after the run.
		os.WriteFile(filepath.Join(repoRoot(t), "bin", "e2e-summary.txt"), []byte(line), 0o644)
	})

	// (a) One VM: the device is found and initialised, and every verb
	// works on a loopback QP pair inside it.
	for _, run := range []string{"probe", "selftest"} {
		t.Run("OneVM/"+run, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "vm1.sock")
			startVrdmad(t, dir, "--socket", "vm1="+sock)
			ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
			defer cancel()
			g := boot(t, ctx, env.guest("vm1", sock, run))
			res, err := g.WaitResult(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("/init after %.1f s", g.InitTime().Seconds())
			if len(res) == 0 {
				t.Fatalf("%s printed no VRDMA-RESULT", run)
			}
			for _, r := range res {
				t.Log(r.Line())
				if r.Role != run {
					t.Errorf("got role %q, want %q", r.Role, run)
				}
			}
			if run == "selftest" {
				last := res[len(res)-1]
				if last.Op != "all" || !last.Verified {
					t.Fatalf("got final result %s, want op all verified", last.Raw)
				}
				for _, r := range res {
					if !r.Verified {
						t.Errorf("selftest %s: not verified: %s", r.Op, r.Raw)
					}
				}
			}
		})
	}

	// (b) Two VMs: each op between them, data verified on both sides.
	for _, op := range []string{"write", "read", "send", "atomic"} {
		t.Run("Pair/"+op, func(t *testing.T) {
			dir := t.TempDir()
			ss, cs := filepath.Join(dir, "server.sock"), filepath.Join(dir, "client.sock")
			d := startVrdmad(t, dir, "--socket", "server="+ss, "--socket", "client="+cs)
			ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
			defer cancel()
			args := []string{"--op", op, "--size", "4096", "--iters", "200"}
			p := startPair(t, ctx, env.guest("server", ss, "server", args...), env.guest("client", cs, "client", args...))
			res, err := p.Wait(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for side, rs := range map[string][]guestresult.Result{"server": res.Server, "client": res.Client} {
				if len(rs) == 0 {
					t.Fatalf("%s printed no VRDMA-RESULT", side)
				}
				for _, r := range rs {
					t.Logf("%s: %s", side, r.Line())
					if !r.Verified {
						t.Errorf("%s: not verified: %s", side, r.Raw)
					}
					if r.Op != op {
						t.Errorf("%s: got op %q, want %q", side, r.Op, op)
					}
				}
			}
			// The data crossed the daemon between the two devices.
			if dv := deviceInfo(t, d, "client"); dv.BytesMoved == 0 && deviceInfo(t, d, "server").BytesMoved == 0 {
				t.Errorf("control API: no bytes moved by either device")
			}
		})
	}

	// (c) PVDMA in a real guest: a 1 GiB VM that registers 8 MiB pins
	// about that, far below its RAM.
	t.Run("PinOnDemand", func(t *testing.T) {
		dir := t.TempDir()
		sock := filepath.Join(dir, "vm1.sock")
		d := startVrdmad(t, dir, "--socket", "vm1="+sock)
		ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
		defer cancel()
		const ram = 1 << 30
		const mr = 8 << 20
		// --tx-depth 1: one message buffer, so the MR is exactly --size.
		cfg := env.guest("vm1", sock, "server", "--op", "write", "--size", strconv.Itoa(mr), "--iters", "1", "--tx-depth", "1")
		cfg.MemoryMiB = ram >> 20
		g := boot(t, ctx, cfg)
		// The server has registered its buffer when it publishes its
		// endpoint; it then holds it, waiting for a peer that never comes.
		ep := waitLine(t, ctx, g, guestvm.KindExchange)
		t.Logf("server endpoint %s", ep)
		var endpoint struct {
			Size uint64 `json:"size"`
		}
		if err := json.Unmarshal([]byte(ep), &endpoint); err != nil || endpoint.Size != mr {
			t.Fatalf("endpoint %s (%v): want a %d-byte buffer", ep, err, mr)
		}
		dv := deviceInfo(t, d, "vm1")
		t.Logf("guest %d MiB, MR %d MiB: pinned %d bytes (%.1f MiB), %d MRs", ram>>20, mr>>20, dv.PinnedBytes, float64(dv.PinnedBytes)/(1<<20), dv.MRs)
		if !dv.Connected {
			t.Fatalf("device not connected: %+v", dv)
		}
		if dv.PinnedBytes < mr {
			t.Errorf("pinned %d bytes, want at least the %d registered", dv.PinnedBytes, mr)
		}
		// The MR plus the rings of the control, event, CQ and QP queues.
		if dv.PinnedBytes > mr+8<<20 {
			t.Errorf("pinned %d bytes, want the %d registered plus rings, far below guest RAM (%d)", dv.PinnedBytes, mr, ram)
		}
	})

	// (d) A guest that dies mid-traffic: its peer ends with an error, the
	// daemon stays healthy and releases everything of the dead VM.
	t.Run("PeerKilled", func(t *testing.T) {
		dir := t.TempDir()
		ss, cs := filepath.Join(dir, "server.sock"), filepath.Join(dir, "client.sock")
		d := startVrdmad(t, dir, "--socket", "server="+ss, "--socket", "client="+cs)
		ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
		defer cancel()
		args := []string{"--op", "write", "--size", "65536", "--iters", "100000000", "--timeout", "10s"}
		p := startPair(t, ctx, env.guest("server", ss, "server", args...), env.guest("client", cs, "client", args...))
		waitLine(t, ctx, p.Client, guestvm.KindExchange)
		// Traffic flows: the client's device moves bytes.
		deadline := time.Now().Add(time.Minute)
		for deviceInfo(t, d, "client").BytesMoved == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no traffic within a minute of the exchange")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := p.Client.Kill(); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		_, cerr := p.Client.WaitResult(ctx)
		if !errors.Is(cerr, guestvm.ErrGuestGone) {
			t.Errorf("killed client: got %v, want ErrGuestGone", cerr)
		}
		res, serr := p.Server.WaitResult(ctx)
		t.Logf("server ended %.1f s after the kill: %v", time.Since(killed).Seconds(), serr)
		if serr == nil {
			for _, r := range res {
				if r.Verified {
					t.Errorf("server verified a run whose client died: %s", r.Raw)
				}
			}
			if len(res) == 0 {
				t.Errorf("server exited 0 with no result after its peer died")
			}
		} else if !errors.Is(serr, guestvm.ErrGuestFailed) {
			t.Errorf("server: got %v, want a reported failure (VRDMA-ERROR or exit code)", serr)
		}
		// The daemon is healthy and released the dead VM's device.
		deadline = time.Now().Add(15 * time.Second)
		for {
			devs, err := d.devices()
			if err != nil {
				t.Fatalf("control API after the kill: %v", err)
			}
			if len(devs) != 2 {
				t.Fatalf("control API: got %d devices, want 2", len(devs))
			}
			dv := deviceInfo(t, d, "client")
			if !dv.Connected && dv.PinnedBytes == 0 && dv.QPs == 0 && dv.MRs == 0 && dv.CQs == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("dead VM's device not released: %+v", dv)
			}
			time.Sleep(50 * time.Millisecond)
		}
	})

	if os.Getenv("VRDMA_E2E_VERBOSE") != "" {
		t.Logf("e2e environment: qemu %s, kernel %s, initrd %s", env.qemu, env.kernel, env.initrd)
	}
}

// TestVMTestCommand runs `vrdma-vmtest pair` (what make run does) and checks
// that it passes, prints the guests' results and a summary, and leaves
// nothing behind: no process and no file in its TMPDIR.
func TestVMTestCommand(t *testing.T) {
	env := needGuestImage(t)
	bin := needBinary(t, "vrdma-vmtest")
	tmp := t.TempDir()
	cmd := exec.Command(bin, "--qemu", env.qemu, "--timeout", "3m", "pair", "--op", "send", "--size", "256", "--iters", "100")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("vrdma-vmtest pair took %.1f s", time.Since(start).Seconds())
	if err != nil {
		t.Fatalf("vrdma-vmtest: %v\n%s", err, out)
	}
	for _, want := range []string{`VRDMA-RESULT {`, `"role":"server"`, `"role":"client"`, "verified on both sides", "pair passed"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if ents, err := os.ReadDir(tmp); err != nil || len(ents) != 0 {
		t.Errorf("vrdma-vmtest left %d entries in its TMPDIR (%v)", len(ents), err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err == nil && strings.Contains(string(b), tmp) {
			t.Errorf("process %s still runs: %q", filepath.Dir(p), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
