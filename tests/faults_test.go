package tests

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// waitReleased waits until the daemon shows device id disconnected with
// nothing left: no objects, no pins.
func waitReleased(t *testing.T, d *daemon.Daemon, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		dv, ok := d.Device(id)
		if !ok {
			t.Fatalf("device %s vanished", id)
		}
		in := dv.Info()
		if !in.Connected && in.PinnedBytes == 0 && in.PDs+in.MRs+in.CQs+in.QPs+in.AHs == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("device %s not released: %+v", id, in)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDisconnectEveryStep drops the front-end's connection before each
// message of QEMU's start-up sequence in turn (realize, DRIVER_OK, rings of
// every queue) and after the driver created objects: every time the daemon
// releases all of it and keeps serving.
func TestDisconnectEveryStep(t *testing.T) {
	hygiene(t)
	d, socks := startDaemon(t, 2)
	cfg := frontend.Config{MemorySize: 16 << 20, QueueSize: 64, AbortAfter: 1 << 20}
	// How many messages a whole start-up takes.
	f := dial(t, socks[0], cfg)
	if err := f.Start(0, 1, 2); err != nil {
		t.Fatal(err)
	}
	total := f.Sent()
	f.Close()
	waitReleased(t, d, "dev0")
	if total < 20 {
		t.Fatalf("a start-up sent only %d messages", total)
	}
	for k := 0; k <= total; k++ {
		cfg.AbortAfter = k
		if k == 0 {
			cfg.AbortAfter = -1 // never abort: the full run, then objects, then a drop
		}
		cfg.Socket = socks[0]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		f, err := frontend.Dial(ctx, cfg)
		cancel()
		if err == nil {
			err = f.Start(0, 1, 2)
			if err == nil && k == 0 {
				tr, terr := frontend.NewTransport(f)
				if terr != nil {
					t.Fatal(terr)
				}
				c, oerr := verbs.Open(tr)
				if oerr != nil {
					t.Fatal(oerr)
				}
				pd, _ := c.AllocPD()
				buf, _ := c.AllocBuffer(1 << 20)
				if _, err := pd.RegMR(buf, 0, 1<<20, abi.AccessAll); err != nil {
					t.Fatal(err)
				}
				if _, err := c.CreateCQ(64); err != nil {
					t.Fatal(err)
				}
				if in := info(t, d); in.PinnedBytes == 0 || in.MRs != 1 {
					t.Fatalf("objects not created: %+v", in)
				}
			}
			if err != nil && !errors.Is(err, frontend.ErrAborted) {
				t.Fatalf("step %d: %v", k, err)
			}
			f.Close()
		} else if !errors.Is(err, frontend.ErrAborted) {
			t.Fatalf("step %d: dial: %v", k, err)
		}
		waitReleased(t, d, "dev0")
	}
	bystanderOK(t, socks[0])
	bystanderOK(t, socks[1])
}

// TestDisconnectDuringTraffic: one side's front-end goes away while the
// other writes to it: the writer's work requests complete in error (never
// hang), the daemon releases everything of the dead side and serves a new
// front-end on its socket.
func TestDisconnectDuringTraffic(t *testing.T) {
	hygiene(t)
	d, socks := startDaemon(t, 2)
	a := openPeer(t, socks[0], 64<<20)
	b := openPeer(t, socks[1], 64<<20)
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errc := make(chan error, 1)
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		wc := make([]verbs.WC, 16)
		for i := 0; ; i++ {
			select {
			case <-stop:
				errc <- nil
				return
			default:
			}
			err := a.qp.PostSend(verbs.SendWR{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
				SGL: []abi.SGE{a.mr.SGE(0, 4096)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey})
			if err != nil && !errors.Is(err, verbs.ErrQueueFull) {
				errc <- err
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for {
				n, err := a.cq.Poll(wc)
				if err != nil {
					errc <- err
					return
				}
				if n > 0 {
					if wc[0].Status != abi.WCSuccess {
						errc <- nil // the peer went away: an error completion, as it should be
						return
					}
					break
				}
				if time.Now().After(deadline) {
					errc <- errors.New("a work request neither completed nor failed in 10 s")
					return
				}
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	b.ctx.Close()
	b.f.Close()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		close(stop)
		t.Fatal("writer still running 20 s after its peer left")
	}
	wg.Wait()
	waitReleased(t, d, "dev1")
	bystanderOK(t, socks[1])
}
