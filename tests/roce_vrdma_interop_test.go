package tests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
)

// TestRoCEInteropVrdmad is issue 16's interop contract end to end: vrdmad
// itself, started in namespace h with --roce-bind, serves one device that
// a virtio-user front-end opens with guest/verbs (internal/roceinterop),
// and the rxe guest runs perftest against it over RoCEv2, in two boots:
// first as perftest's client (ib_write_bw, ib_read_bw, ib_atomic_bw,
// ib_send_bw, ib_write_lat; rxe is the requester, vrdma's responder
// answers), then as its server (vrdma's requester drives write, read,
// atomic, send and the write_lat ping-pong). The device's QPs send from
// its GID of h's address and connect to the guest's IPv4-mapped GID, so
// the engine's network transport carries them. Every run's data is
// verified: vrdma's memory and completions (internal/roceinterop's
// checkLocal) and every payload in QEMU's capture of the guest's link
// against that memory (Run.CheckCapture); every RoCE frame's ICRC is
// checked with the codec and tshark finds nothing malformed.
func TestRoCEInteropVrdmad(t *testing.T) {
	if testing.Short() {
		t.Skip("boots TCG guests")
	}
	vrdmad := needBinary(t, "vrdmad")
	lab := newInteropLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	d, err := lab.StartVrdmad(ctx, vrdmadproc.Config{Binary: vrdmad, Devices: []string{"interop"}, StateDir: vrdmadproc.NoState})
	if errors.Is(err, roceinterop.ErrNoRoCEBind) && os.Getenv("CI") == "" {
		t.Skipf("%v (make build)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	dev, err := roceinterop.OpenDevice(ctx, d.Socket("interop"), interopGoIP, 0)
	if err != nil {
		t.Fatalf("%v\n%s", err, d.Log())
	}
	defer dev.Close()
	t.Logf("device: GID %x at index %d", dev.GID, dev.GIDIndex)

	for _, phase := range []struct {
		role string // the rxe guest's
		jobs []string
	}{
		{"client", []string{"write_bw:65536:32", "read_bw:65536:32", "atomic_bw:8:100", "send_bw:65536:32", "write_lat:64:100"}},
		{"server", []string{"write_bw:65536:32", "read_bw:65536:32", "atomic_bw:8:100", "send_bw:65536:32", "write_lat:64:100"}},
	} {
		cfg := roceinterop.Guest{QEMU: lab.qemu, Kernel: lab.kernel, Initrd: lab.initrd, Role: phase.role,
			Dump: filepath.Join(t.TempDir(), "vrdma-"+phase.role+".pcap")}
		for _, s := range phase.jobs {
			j, err := roceinterop.ParseJob(s)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Jobs = append(cfg.Jobs, j)
		}
		out, err := lab.RunVrdma(ctx, dev, cfg)
		for _, r := range out.Results {
			t.Logf("rxe %s: %s", phase.role, r.Line())
		}
		for _, r := range out.Runs {
			if r.Role == "client" && r.Job.Op != pftexchange.WriteLat {
				t.Logf("vrdma client %s: %.3f Gb/s", r.Job, r.Gbits())
			}
		}
		for _, c := range out.Checks {
			t.Logf("verified: %s", c)
		}
		if err != nil {
			out.Close()
			// The logs first, the verdict last, where a reader looks.
			t.Logf("rxe guest's console:\n%s\n=== vrdmad log ===\n%s", out.GuestLog, d.Log())
			t.Fatalf("rxe guest as perftest's %s: %v", phase.role, err)
		}
		if len(out.Checks) != len(cfg.Jobs) {
			out.Close()
			t.Fatalf("rxe guest as perftest's %s: %d runs verified of %d", phase.role, len(out.Checks), len(cfg.Jobs))
		}
		if err := roceinterop.CheckTshark(lab.tshark, cfg.Dump, len(out.Frames)); err != nil {
			out.Close()
			t.Fatal(err)
		}
		t.Logf("rxe guest as perftest's %s: %d jobs in %.1f s, %d RoCE frames, every ICRC good, tshark: none malformed",
			phase.role, len(cfg.Jobs), out.GuestTime.Seconds(), len(out.Frames))
		out.Close()
	}
}
