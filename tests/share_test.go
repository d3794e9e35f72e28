package tests

import (
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// stream keeps depth signaled RDMA WRITEs of size bytes from a to b in
// flight for d and returns what completed and how long that took.
func stream(t *testing.T, a, b *peer, size uint32, depth int, d time.Duration) (bytes, ops uint64, took time.Duration) {
	t.Helper()
	var wc [16]verbs.WC
	inflight := 0
	start := time.Now()
	last := start
	for {
		now := time.Now()
		posting := now.Sub(start) < d
		if !posting && inflight == 0 {
			return bytes, ops, now.Sub(start)
		}
		for posting && inflight < depth {
			if err := a.qp.PostSend(verbs.SendWR{WRID: ops, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
				SGL: []abi.SGE{a.mr.SGE(0, int(size))}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey}); err != nil {
				t.Fatal(err)
			}
			inflight++
		}
		n, err := a.cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range wc[:n] {
			if c.Status != abi.WCSuccess {
				t.Fatalf("completion %+v", c)
			}
			bytes += uint64(size)
			ops++
		}
		inflight -= n
		if n > 0 {
			last = now
		} else if now.Sub(last) > 10*time.Second {
			t.Fatalf("no completion for 10 s (%d in flight)", inflight)
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// A device's rate bounds hold: over any stretch it moves at most a
// bucket's worth plus the rate times the time, it keeps moving after the
// bucket is empty, and lifting the bound lifts the limit at once.
func TestShareRateBounds(t *testing.T) {
	hygiene(t)
	d, socks := startDaemon(t, 2)
	a, b := openPeer(t, socks[0], 0), openPeer(t, socks[1], 0)
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	dev, ok := d.Device("dev0")
	if !ok {
		t.Fatal("no dev0")
	}
	const burstBytes = 4 << 20 // the bucket's floor (share.go, maxMessage)

	const rate = 16 << 20
	if err := dev.Dev.SetShare(rdma.Share{MaxBytesPerSec: rate}); err != nil {
		t.Fatal(err)
	}
	moved, _, took := stream(t, a, b, 16<<10, 8, 600*time.Millisecond)
	limit := burstBytes + uint64(took.Seconds()*rate) + 8*16<<10
	t.Logf("bytes bound %d/s: %d bytes in %v (bound %d)", rate, moved, took, limit)
	if moved > limit {
		t.Errorf("moved %d bytes in %v under a bound allowing %d", moved, took, limit)
	}
	if moved <= burstBytes+16<<10 {
		t.Errorf("moved %d bytes in %v: nothing after the bucket emptied", moved, took)
	}

	const opsRate = 2000
	if err := dev.Dev.SetShare(rdma.Share{MaxOpsPerSec: opsRate}); err != nil {
		t.Fatal(err)
	}
	_, ops, took := stream(t, a, b, 64, 8, 500*time.Millisecond)
	opsLimit := uint64(opsRate/10) + uint64(took.Seconds()*opsRate) + 8
	t.Logf("ops bound %d/s: %d ops in %v (bound %d)", opsRate, ops, took, opsLimit)
	if ops > opsLimit {
		t.Errorf("%d WRITEs in %v under a bound allowing %d", ops, took, opsLimit)
	}
	if ops <= opsRate/10+8 {
		t.Errorf("%d WRITEs in %v: nothing after the bucket emptied", ops, took)
	}

	if err := dev.Dev.SetShare(rdma.Share{}); err != nil {
		t.Fatal(err)
	}
	if got := dev.Dev.Share(); got != (rdma.Share{}) {
		t.Fatalf("share %+v after clearing it", got)
	}
	moved, _, took = stream(t, a, b, 16<<10, 8, 300*time.Millisecond)
	if bound := burstBytes + uint64(took.Seconds()*rate); moved <= bound {
		t.Errorf("unbounded again, moved only %d bytes in %v (the old bound allowed %d)", moved, took, bound)
	}
	if err := dev.Dev.SetShare(rdma.Share{Weight: rdma.MaxWeight + 1}); err == nil {
		t.Error("a weight above MaxWeight was accepted")
	}
	a.teardown(t)
	b.teardown(t)
}
