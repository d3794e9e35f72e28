package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// TestRestartQEMU is a vrdmad restart as a guest under QEMU lives through
// it (docs/spec.md, "Reset and disconnect"): a guest whose device's
// chardev reconnects (reconnect-ms on the command line) sets up a
// loopback pair and verifies traffic; vrdmad is SIGKILLed and started
// again on the same socket; QEMU reconnects and restarts the rings; the
// guest gets DEVICE_FATAL, its old QP answers NOT_FOUND, it resets the
// device (status 0), initialises it again, re-creates its objects and
// verifies traffic. Then the same with a graceful stop (SIGTERM). QEMU and
// the VM stay up throughout, and each new vrdmad shows the device attached
// with the re-created objects in its control API and its metrics (the
// guest waits for VRDMA-NEXT after each recovery, so they are looked at
// while it holds them).
func TestRestartQEMU(t *testing.T) {
	env := needGuestImage(t)
	bin := needBinary(t, "vrdmad")
	dir := t.TempDir()
	sock := filepath.Join(dir, "rs0.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 2*e2eWait)
	defer cancel()

	first := launchVrdmad(t, bin, dir, "a", "--socket", restartID+"="+sock)
	dev := e2eDevice(restartID, sock)
	dev.ReconnectMs = 500
	env.vms.Add(1)
	rg := &restartGuest{t: t, ctx: ctx, g: boot(t, ctx, guestvm.Config{Name: "restart", QEMU: env.qemu,
		Kernel: env.kernel, Initrd: env.initrd, Run: "restart",
		Args: []string{"--rounds", "2", "--timeout", "150s", "--ack"}, Devices: []qemu.VhostUserDevice{dev}})}
	rg.lines = rg.g.Lines()

	ready := rg.next("ready", 0)
	if !ready.Verified {
		t.Fatalf("guest ready without verified traffic: %+v", ready)
	}
	rg.attached("before the restarts", first, "")
	rg.alive("before the restarts")

	// Round 1: SIGKILL, as a crash would. Round 2: SIGTERM, as systemctl
	// restart does; the guest must see the same in both.
	cur := first
	for r, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		round := r + 1
		if err := cur.stop(sig); sig == syscall.SIGTERM && err != nil {
			t.Fatalf("round %d: vrdmad after SIGTERM: %v\n%s", round, err, cur.logText())
		}
		metrics := filepath.Join(dir, fmt.Sprintf("metrics%d.sock", round))
		var d devicer
		if round < 2 {
			cur = launchVrdmad(t, bin, dir, fmt.Sprintf("b%d", round), "--socket", restartID+"="+sock, "--metrics", "unix:"+metrics)
			d = cur
		} else {
			// The last one as every other test starts vrdmad: its cleanup
			// checks that it stops cleanly.
			d = startVrdmad(t, dir, "--socket", restartID+"="+sock, "--metrics", "unix:"+metrics)
		}
		rg.round(round, sig.String(), d, metrics)
	}
	if _, err := rg.g.WaitResult(ctx); err != nil {
		t.Fatalf("guest: %v", err)
	}
	if s := rg.g.VM().Stderr(); s != "" {
		t.Logf("QEMU stderr:\n%s", s)
	}
}

// TestRestartQEMUHotplug is the same restart for a device hot-plugged the
// way vrdmactl vm attach does it (chardev-add with reconnect-ms=1000, then
// device_add): the guest starts paused, the device is attached, the guest
// runs; vrdmad is SIGKILLed and started again.
func TestRestartQEMUHotplug(t *testing.T) {
	env := needGuestImage(t)
	bin := needBinary(t, "vrdmad")
	dir := t.TempDir()
	sock := filepath.Join(dir, "rs0.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 2*e2eWait)
	defer cancel()

	first := launchVrdmad(t, bin, dir, "a", "--socket", restartID+"="+sock)
	env.vms.Add(1)
	rg := &restartGuest{t: t, ctx: ctx, g: boot(t, ctx, guestvm.Config{Name: "restart-hp", QEMU: env.qemu,
		Kernel: env.kernel, Initrd: env.initrd, Run: "restart", Args: []string{"--timeout", "150s", "--ack"},
		ExtraQEMUArgs: []string{"-S", "-device", "pcie-root-port,id=vrdma-rp0,bus=pcie.0,chassis=9"}})}
	if err := rg.g.VM().AttachVhostUser(ctx, e2eDevice(restartID, sock), "vrdma-rp0"); err != nil {
		t.Fatal(err)
	}
	if _, err := rg.g.VM().QMP().Run([]byte(`{"execute":"cont"}`)); err != nil {
		t.Fatal(err)
	}
	rg.lines = rg.g.Lines()
	if ready := rg.next("ready", 0); !ready.Verified {
		t.Fatalf("guest ready without verified traffic: %+v", ready)
	}
	first.stop(syscall.SIGKILL)
	metrics := filepath.Join(dir, "metrics.sock")
	rg.round(1, syscall.SIGKILL.String(), startVrdmad(t, dir, "--socket", restartID+"="+sock, "--metrics", "unix:"+metrics), metrics)
	if _, err := rg.g.WaitResult(ctx); err != nil {
		t.Fatalf("guest: %v", err)
	}
}

// restartID is the device of the restart tests.
const restartID = "rs0"

// restartGuest follows a guest running vrdma-guest restart --ack.
type restartGuest struct {
	t     *testing.T
	ctx   context.Context
	g     *guestvm.Guest
	lines <-chan string
}

// next returns the guest's next restart result, which must be event want
// of round.
func (rg *restartGuest) next(want string, round int) guestresult.Restart {
	rg.t.Helper()
	return nextGuestEvent[guestresult.Restart](rg.t, rg.ctx, rg.lines, guestresult.RoleRestart, want, round)
}

// round follows one restart, vrdmad (d) already started again with a
// metrics socket: DEVICE_FATAL with the status unchanged, NOT_FOUND
// for the old QP, reset, recovered; then QEMU must run, the daemon must
// show the re-created objects, and the guest is told to go on.
func (rg *restartGuest) round(round int, how string, d devicer, metrics string) {
	t := rg.t
	t.Helper()
	fatal := rg.next("device_fatal", round)
	// QEMU does not tell the guest (no NEEDS_RESET, no config interrupt):
	// the status is still ACKNOWLEDGE|DRIVER|FEATURES_OK|DRIVER_OK, and
	// DEVICE_FATAL is the news.
	if fatal.Status != "0x0f" {
		t.Errorf("round %d: device_status %q at DEVICE_FATAL, want 0x0f", round, fatal.Status)
	}
	nf := rg.next("not_found", round)
	if nf.Command != "QUERY_QP" || nf.Answer != "NOT_FOUND" {
		t.Errorf("round %d: old QP: got %s answering %s, want QUERY_QP answering NOT_FOUND", round, nf.Command, nf.Answer)
	}
	rg.next("reset", round)
	rec := rg.next("recovered", round)
	if !rec.Verified {
		t.Errorf("round %d: recovered without verified traffic: %+v", round, rec)
	}
	when := fmt.Sprintf("round %d (%s)", round, how)
	rg.alive(when)
	rg.attached(when, d, metrics)
	// The guest keeps its objects until told to go on.
	if err := rg.g.WriteLine("VRDMA-NEXT"); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: DEVICE_FATAL %.2f s after the guest began to wait, device_status %s; traffic verified again %.2f s after it",
		when, fatal.WaitS, fatal.Status, rec.RecoverS)
}

// alive checks that QEMU runs and the VM is running.
func (rg *restartGuest) alive(when string) {
	t := rg.t
	t.Helper()
	select {
	case <-rg.g.VM().Exited():
		t.Fatalf("%s: QEMU exited: %s", when, rg.g.VM().Stderr())
	default:
	}
	raw, err := rg.g.VM().QMP().Run([]byte(`{"execute":"query-status"}`))
	if err != nil {
		t.Fatalf("%s: query-status: %v", when, err)
	}
	var st struct {
		Return struct {
			Status string `json:"status"`
		} `json:"return"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.Return.Status != "running" {
		t.Fatalf("%s: VM status %s, want running", when, raw)
	}
}

// attached checks the daemon's control API (d) and (unless metrics is empty)
// its metrics: QEMU is connected and the guest's loopback pair is there.
func (rg *restartGuest) attached(when string, d devicer, metrics string) {
	t := rg.t
	t.Helper()
	info := deviceInfo(t, d, restartID)
	if !info.Connected || info.PDs != 1 || info.CQs != 2 || info.QPs != 2 || info.MRs != 2 || info.BytesMoved == 0 || info.RingErrors != 0 {
		t.Errorf("%s: control API shows %+v, want connected with 1 PD, 2 CQs, 2 QPs, 2 MRs, bytes moved and no ring errors", when, info)
	}
	if metrics == "" {
		return
	}
	m := scrapeUnix(t, metrics)
	for _, want := range []string{
		`vrdma_vhost_user_connected{device="` + restartID + `"} 1`,
		`vrdma_resources{device="` + restartID + `",type="qp"} 2`,
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("%s: metrics lack %q", when, want)
		}
	}
}

// killableVrdmad is a vrdmad the restart test may kill: the shared
// startVrdmad stops its daemon with SIGTERM at cleanup and wants a clean
// exit, which a SIGKILLed daemon cannot give.
type killableVrdmad struct {
	*vrdmadproc.Proc
}

// launchVrdmad starts bin with a control socket of its own (named after
// name) and args, and returns once the control API answers. The process is
// killed at cleanup if it still runs.
func launchVrdmad(t *testing.T, bin, dir, name string, args ...string) *killableVrdmad {
	t.Helper()
	control := filepath.Join(dir, "control-"+name+".sock")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: bin, Dir: dir, Control: control, Args: args, LogLevel: "debug"})
	if err != nil {
		t.Fatalf("vrdmad %s: %v", name, err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("vrdmad %s log:\n%s", name, p.Log())
		}
	})
	return &killableVrdmad{Proc: p}
}

// stop ends the process with sig (SIGKILL or SIGTERM) and returns how it
// went: nil for a clean exit after SIGTERM or an end by SIGKILL.
func (p *killableVrdmad) stop(sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		return p.Kill()
	}
	return p.Stop()
}

func (p *killableVrdmad) logText() string { return p.Log() }

// scrapeUnix fetches /metrics from a unix socket.
func scrapeUnix(t *testing.T, path string) string {
	t.Helper()
	resp, err := controlapi.HTTPClient(path, 5*time.Second).Get("http://vrdmad/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics: %s, %v", resp.Status, err)
	}
	return string(b)
}

// TestRestartQEMUPersisted restarts vrdmad under a running guest whose
// device was added through the control API (as vrdmactl device add does)
// and saved in the state directory: vrdmad is SIGKILLed and started again
// with nothing but --state-dir, serves the device again with the same id,
// socket, uuid and GUID, QEMU reconnects to it, and the guest recovers and
// verifies traffic as in TestRestartQEMU.
func TestRestartQEMUPersisted(t *testing.T) {
	env := needGuestImage(t)
	bin := needBinary(t, "vrdmad")
	dir := t.TempDir()
	sock := filepath.Join(dir, "rs0.sock")
	state := filepath.Join(dir, "state")
	ctx, cancel := context.WithTimeout(context.Background(), 2*e2eWait)
	defer cancel()

	first := launchVrdmad(t, bin, dir, "a", "--state-dir", state)
	before, err := first.AddDevice(ctx, controlapi.AddRequest{ID: restartID, Socket: sock})
	if err != nil {
		t.Fatal(err)
	}
	if !before.Persisted {
		t.Fatalf("device added through the API is not persisted: %+v", before)
	}
	dev := e2eDevice(restartID, sock)
	dev.ReconnectMs = 500
	env.vms.Add(1)
	rg := &restartGuest{t: t, ctx: ctx, g: boot(t, ctx, guestvm.Config{Name: "restart-state", QEMU: env.qemu,
		Kernel: env.kernel, Initrd: env.initrd, Run: "restart", Args: []string{"--timeout", "150s", "--ack"},
		Devices: []qemu.VhostUserDevice{dev}})}
	rg.lines = rg.g.Lines()
	if ready := rg.next("ready", 0); !ready.Verified {
		t.Fatalf("guest ready without verified traffic: %+v", ready)
	}
	first.stop(syscall.SIGKILL)
	metrics := filepath.Join(dir, "metrics.sock")
	second := startVrdmad(t, dir, "--state-dir", state, "--metrics", "unix:"+metrics)
	after := deviceInfo(t, second, restartID)
	if after.Socket != before.Socket || after.UUID != before.UUID || after.GUID != before.GUID || !after.Persisted {
		t.Fatalf("restored device %+v, want the identity of %+v", after, before)
	}
	rg.round(1, syscall.SIGKILL.String(), second, metrics)
	if _, err := rg.g.WaitResult(ctx); err != nil {
		t.Fatalf("guest: %v", err)
	}
}
