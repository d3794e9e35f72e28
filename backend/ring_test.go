package backend

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// expectQuiet checks that r gets no interrupt for a while.
func (f *testFrontend) expectQuiet(r *testRing) {
	f.t.Helper()
	if _, err := r.call.WaitTimeout(100 * time.Millisecond); !errors.Is(err, eventfd.ErrTimeout) {
		f.t.Fatalf("queue %d: got an interrupt (%v), want none", r.index, err)
	}
}

// TestGetVringBaseStopsRing: GET_VRING_BASE stops the ring and returns the
// next available index; the ring then ignores the driver until it is
// started again with a kick, and resumes where it stopped, buffers made
// available in between included.
func TestGetVringBaseStopsRing(t *testing.T) {
	dev := newFakeDevice(2)
	f := newFrontend(t, dev)
	f.ready(0, 1)
	r := f.rings[0]
	for range 5 {
		f.roundTrip(r, "x")
	}
	if got := f.getVringBase(0); got != 5 {
		t.Fatalf("GET_VRING_BASE: got %d, want 5", got)
	}
	// Stopped: the back-end's kick fd is gone.
	out := f.post(r, []byte("while stopped"))
	f.expectQuiet(r)
	// Stopping one ring leaves the other running.
	f.roundTrip(f.rings[1], "other ring")
	// A second GET_VRING_BASE of a stopped ring answers the same index.
	if got := f.getVringBase(0); got != 5 {
		t.Fatalf("second GET_VRING_BASE: got %d, want 5", got)
	}
	// Restart from where it stopped: configuration is allowed again.
	f.mustAck(vu.SetVringNum, state(0, queueSize))
	f.mustAck(vu.SetVringBase, state(0, 5))
	f.mustAck(vu.SetVringAddr, r.addr())
	f.mustAck(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
	if _, err := r.call.WaitTimeout(waitLong); err != nil {
		t.Fatalf("restarted ring did not process the waiting chain: %v", err)
	}
	if _, _, ok, _ := r.dq.Used(); !ok || string(f.mem[out:out+13]) != "while stopped" {
		t.Fatal("waiting chain not echoed")
	}
	if dev.Host().Resumed() {
		t.Fatal("Resumed after restarting from our own base")
	}
	f.roundTrip(r, "again")
}

// TestSetVringKickRestarts: a new kick fd on a running ring restarts its
// worker on the new fd, keeping its position.
func TestSetVringKickRestarts(t *testing.T) {
	f := newFrontend(t, newFakeDevice(1))
	f.ready(0)
	r := f.rings[0]
	f.roundTrip(r, "old kick")
	old := r.kick
	var err error
	if r.kick, err = eventfd.New(); err != nil {
		t.Fatal(err)
	}
	f.mustAck(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
	old.Close()
	f.roundTrip(r, "new kick")
	if got := f.getVringBase(0); got != 2 {
		t.Fatalf("GET_VRING_BASE: got %d, want 2", got)
	}
}

// TestSetVringCallWhileRunning: a new call fd takes effect for the next
// interrupt, and the old one is closed by the back-end.
func TestSetVringCallWhileRunning(t *testing.T) {
	f := newFrontend(t, newFakeDevice(1))
	f.ready(0)
	r := f.rings[0]
	f.roundTrip(r, "old call")
	old := r.call
	var err error
	if r.call, err = eventfd.New(); err != nil {
		t.Fatal(err)
	}
	f.mustAck(vu.SetVringCall, vringFile(0, false), r.call.Fd())
	f.roundTrip(r, "new call")
	if ok, _ := old.TryWait(); ok {
		t.Fatal("old call fd signalled after SET_VRING_CALL")
	}
	old.Close()
	// No call fd at all: the device works, nobody is told.
	f.mustAck(vu.SetVringCall, vringFile(0, true))
	out := f.post(r, []byte("silent"))
	waitFor(t, "the chain to be used", func() bool { return r.dq.HasUsed() })
	if string(f.mem[out:out+6]) != "silent" {
		t.Fatal("chain not echoed without a call fd")
	}
}

// TestKickBeforeConfiguration: a kick fd that arrives before the ring's
// size and addresses is kept, and the ring does not start until a kick
// arrives with everything set.
func TestKickBeforeConfiguration(t *testing.T) {
	f := newFrontend(t, newFakeDevice(1))
	f.ready()
	r := f.ring(0)
	f.newDriverQueue(r, queueSize)
	f.mustAck(vu.SetVringCall, vringFile(0, false), r.call.Fd())
	f.mustAck(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
	f.mustAck(vu.SetVringEnable, state(0, 1))
	f.post(r, []byte("too early"))
	f.expectQuiet(r)
	f.mustAck(vu.SetVringNum, state(0, queueSize))
	f.mustAck(vu.SetVringAddr, r.addr())
	f.mustAck(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
	if _, err := r.call.WaitTimeout(waitLong); err != nil {
		t.Fatalf("ring did not start: %v", err)
	}
}

// TestResetDevice: RESET_DEVICE stops every ring, closes its fds, forgets
// its configuration and resets the device; memory stays; rings set up
// again work.
func TestResetDevice(t *testing.T) {
	dev := newFakeDevice(2)
	f := newFrontend(t, dev)
	f.ready(0, 1)
	f.roundTrip(f.rings[0], "a")
	f.roundTrip(f.rings[1], "b")
	fds := openFds(t)
	f.mustAck(vu.ResetDevice, nil)
	// Three eventfds per ring were the back-end's.
	waitFor(t, "the rings' fds to close", func() bool { return openFds(t) == fds-6 })
	if dev.count("Reset") != 1 {
		t.Fatalf("device resets: %d, want 1", dev.count("Reset"))
	}
	if got := f.getU64(vu.GetStatus); got != 0 {
		t.Fatalf("GET_STATUS after RESET_DEVICE: %#x", got)
	}
	for i := range 2 {
		if got := f.getVringBase(i); got != 0 {
			t.Fatalf("GET_VRING_BASE %d after reset: %d, want 0", i, got)
		}
	}
	f.post(f.rings[0], []byte("after reset"))
	f.expectQuiet(f.rings[0])
	// Memory is still mapped: set the rings up again without a table.
	f.mustAck(vu.SetFeatures, vu.EncodeU64(f.feats))
	for i := range 2 {
		r := f.startRing(i, 0)
		f.roundTrip(r, "after reset")
	}
}

// TestSetStatusZeroKeepsRings: status 0 resets the device's objects but
// not the rings or memory.
func TestSetStatusZeroKeepsRings(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.ready(0)
	f.mustAck(vu.SetStatus, vu.EncodeU64(0xf))
	f.roundTrip(f.rings[0], "1")
	f.mustAck(vu.SetStatus, vu.EncodeU64(0))
	f.roundTrip(f.rings[0], "2")
	if got := f.getVringBase(0); got != 2 {
		t.Fatalf("GET_VRING_BASE: got %d, want 2", got)
	}
}

// TestHandleQueueErrorBreaksRing: an error from the device breaks that
// ring only: the error eventfd fires, later kicks are ignored, the other
// ring goes on; setting the ring up again repairs it.
func TestHandleQueueErrorBreaksRing(t *testing.T) {
	dev := newFakeDevice(2)
	f := newFrontend(t, dev)
	f.ready(0, 1)
	var fail atomic.Bool
	dev.setHandle(func(q *Queue) error {
		if q.Index() == 0 && fail.Load() {
			return errors.New("device says no")
		}
		return echo(q)
	})
	r := f.rings[0]
	f.roundTrip(r, "fine")
	fail.Store(true)
	f.post(r, []byte("fails"))
	f.expectBroken(r)
	if got := f.stats.ringErrors.Load(); got != 1 {
		t.Fatalf("ring errors: %d, want 1", got)
	}
	fail.Store(false)
	f.post(r, []byte("ignored"))
	f.expectQuiet(r)
	f.roundTrip(f.rings[1], "other ring")
	// Run on a broken ring reports the breaking error.
	if err := dev.Host().Queue(0).Run(func(*Queue) error { return nil }); err == nil {
		t.Fatal("Run on a broken ring succeeded")
	}
	// Set up again (GET_VRING_BASE, new kick): the two waiting chains are
	// processed.
	base := f.getVringBase(0)
	if base != 1 {
		t.Fatalf("GET_VRING_BASE of the broken ring: %d, want 1 (the chain it failed on is not consumed)", base)
	}
	f.mustAck(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
	waitFor(t, "the waiting chains", func() bool {
		for {
			_, _, ok, err := r.dq.Used()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			base++
		}
		return base == 3
	})
	f.expectNotBroken(r)
}

// TestMalformedChainBreaksRing: a descriptor chain the driver corrupted
// (head out of range) breaks the ring; the session and other ring go on.
func TestMalformedChainBreaksRing(t *testing.T) {
	f := newFrontend(t, newFakeDevice(2))
	f.ready(0, 1)
	r := f.rings[0]
	// Publish head index queueSize+3 in the available ring by hand.
	avail := f.mem[r.avail:]
	avail[4], avail[5] = queueSize+3, 0
	abi.StoreUint16(avail, 2, 1)
	r.kick.Signal()
	f.expectBroken(r)
	f.roundTrip(f.rings[1], "other ring")
	f.sync()
}

// TestQueueRun covers Queue.Run from outside HandleQueue (a device posting
// an event), Wake, and the Queue accessors.
func TestQueueRun(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.ready()
	q := dev.Host().Queue(0)
	if err := q.Run(func(*Queue) error { t.Fatal("fn ran on a stopped ring"); return nil }); !errors.Is(err, ErrQueueStopped) {
		t.Fatalf("Run on a stopped ring: %v, want ErrQueueStopped", err)
	}
	q.Wake() // a no-op while stopped

	// A device that only pushes from outside: HandleQueue does nothing.
	var handled atomic.Int64
	dev.setHandle(func(q *Queue) error { handled.Add(1); return nil })
	r := f.startRing(0, 0)
	out := f.post(r, []byte("event"))
	waitFor(t, "HandleQueue", func() bool { return handled.Load() > 0 })
	err := q.Run(func(q *Queue) error {
		if q.Memory() == nil {
			t.Error("Memory is nil inside Run")
		}
		if !q.Pending() {
			t.Error("Pending: false with a chain available")
		}
		if q.Stopping() {
			t.Error("Stopping on a running ring")
		}
		q.SetPolling(true)
		q.SetPolling(false)
		q.SetNotify(false)
		q.SetNotify(true)
		var c virtio.Chain
		ok, err := q.Pop(&c)
		if err != nil || !ok {
			t.Errorf("Pop: %v %v", ok, err)
			return err
		}
		c.Scatter([]byte("EVENT"))
		if err := q.Push(c.Head, 5); err != nil {
			return err
		}
		q.Notify() // the interrupt now, not at the end of Run
		if q.Pending() {
			t.Error("Pending: true with nothing left")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if _, err := r.call.WaitTimeout(waitLong); err != nil {
		t.Fatalf("no interrupt after Run pushed: %v", err)
	}
	if string(f.mem[out:out+5]) != "EVENT" {
		t.Fatalf("buffer: %q", f.mem[out:out+5])
	}
	// Wake makes the worker call HandleQueue without a kick.
	n := handled.Load()
	q.Wake()
	waitFor(t, "HandleQueue after Wake", func() bool { return handled.Load() > n })

	// An error from fn breaks the ring.
	if err := q.Run(func(*Queue) error { return errors.New("bad event") }); err == nil {
		t.Fatal("Run: got nil, want fn's error")
	}
	f.expectBroken(r)
	if err := q.Run(func(*Queue) error { return nil }); err == nil {
		t.Fatal("Run on a broken ring: got nil")
	}
	// Push of a head that is not in flight is a device bug: Push fails
	// and the ring is broken already, so Run reports it.
	f.getVringBase(0)
	f.mustAck(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
	err = q.Run(func(q *Queue) error { return q.Push(queueSize+1, 0) })
	if err == nil {
		t.Fatal("Push of an out-of-range head: Run got nil")
	}
}

// TestHandlerSeesDriverProgress: a chain the driver publishes while the
// handler runs (kicks suppressed) is picked up without another kick.
func TestHandlerSeesDriverProgress(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.ready(0)
	r := f.rings[0]
	var once atomic.Bool
	extra := make(chan uint64, 1)
	dev.setHandle(func(q *Queue) error {
		if once.CompareAndSwap(false, true) {
			// The driver adds a chain while the device works, without
			// a kick (the device asked for none).
			in, out := uint64(dataBase+0x8000), uint64(dataBase+0x9000)
			copy(f.mem[in:], "late")
			r.dq.Add([]virtio.Buf{{Addr: abi.GPA(in), Len: 4}, {Addr: abi.GPA(out), Len: 4, Writable: true}})
			extra <- out
			return nil
		}
		return echo(q)
	})
	r.kick.Signal()
	out := <-extra
	waitFor(t, "the late chain", func() bool { return string(f.mem[out:out+4]) == "late" })
}

// TestStoppingEndsLongHandler: a handler that polls until Stopping returns
// when GET_VRING_BASE stops the ring.
func TestStoppingEndsLongHandler(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.ready(0)
	running := make(chan struct{}, 1)
	dev.setHandle(func(q *Queue) error {
		select {
		case running <- struct{}{}:
		default:
		}
		for !q.Stopping() {
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	f.rings[0].kick.Signal()
	<-running
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.getVringBase(0)
	}()
	select {
	case <-done:
	case <-time.After(waitLong):
		t.Fatal("GET_VRING_BASE did not stop a polling handler")
	}
}

// TestGuestMemoryShrinks: a front-end that shrinks the (unsealed) file
// behind guest memory makes the next access fault; the fault breaks the
// ring that touched it, not the daemon. Both the start of a ring (which
// reads the used index) and its work are covered.
func TestGuestMemoryShrinks(t *testing.T) {
	t.Run("while running", func(t *testing.T) {
		dev := newFakeDevice(1)
		f := newFrontend(t, dev)
		f.ready(0)
		r := f.rings[0]
		f.roundTrip(r, "before")
		// The front-end's own mapping faults too: publish first.
		f.add(r, []byte("gone"))
		shrink(t, f)
		r.kick.Signal()
		f.expectBroken(r)
		f.sync()
	})
	t.Run("at start", func(t *testing.T) {
		dev := newFakeDevice(1)
		f := newFrontend(t, dev)
		f.ready()
		r := f.ring(0)
		f.newDriverQueue(r, queueSize)
		f.mustAck(vu.SetVringErr, vringFile(0, false), r.errfd.Fd())
		f.mustAck(vu.SetVringNum, state(0, queueSize))
		f.mustAck(vu.SetVringAddr, r.addr())
		shrink(t, f)
		f.mustAck(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
		f.expectBroken(r)
		f.sync()
	})
	t.Run("run from outside", func(t *testing.T) {
		dev := newFakeDevice(1)
		f := newFrontend(t, dev)
		f.ready(0)
		shrink(t, f)
		err := dev.Host().Queue(0).Run(func(q *Queue) error {
			q.Memory().Slice(0x1000, 1) // still translates
			b, _ := q.Memory().Slice(dataBase, 8)
			b[0] = 1 // faults
			return nil
		})
		if !errors.Is(err, memmap.ErrFault) {
			t.Fatalf("Run: %v, want ErrFault", err)
		}
		f.expectBroken(f.rings[0])
	})
}

// shrink truncates guest memory's file to nothing. The front-end's mapping
// becomes unusable as well; the tests stop touching it.
func shrink(t *testing.T, f *testFrontend) {
	t.Helper()
	if err := unix.Ftruncate(f.memfd, 0); err != nil {
		t.Fatal(err)
	}
}

// TestKickFdNotEventfd: a kick "eventfd" that is a socket is refused
// (internal/eventfd checks the fd's kind: a socket or /dev/zero would keep
// the ring's worker reading), the ring does not start, and the session and
// its other rings go on.
func TestKickFdNotEventfd(t *testing.T) {
	f := newFrontend(t, newFakeDevice(2))
	f.ready()
	r := f.ring(0)
	f.newDriverQueue(r, queueSize)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	f.mustAck(vu.SetVringErr, vringFile(0, false), r.errfd.Fd())
	f.mustAck(vu.SetVringNum, state(0, queueSize))
	f.mustAck(vu.SetVringAddr, r.addr())
	f.nack(vu.SetVringKick, vringFile(0, false), fds[0])
	unix.Close(fds[0])
	if got := f.getVringBase(0); got != 0 {
		t.Fatalf("GET_VRING_BASE: %d", got)
	}
	f.roundTrip(f.startRing(1, 0), "the other ring")
}

// TestMemTableSwapWhileRunning: a new memory table while rings run (QEMU
// sends the same table again at every start; memory hot-plug adds
// regions) is picked up by the workers, which translate their rings again.
func TestMemTableSwapWhileRunning(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.ready(0)
	r := f.rings[0]
	f.roundTrip(r, "first table")
	f.mustAck(vu.SetMemTable, memTable(oneRegion), f.memfd)
	f.roundTrip(r, "same table again")
	half := uint64(memSize / 2)
	f.mustAck(vu.SetMemTable, memTable(
		vu.MemoryRegion{GuestAddr: 0, Size: half, UserAddr: userBase},
		vu.MemoryRegion{GuestAddr: half, Size: half, UserAddr: userBase + half, MmapOffset: half}), f.memfd, f.memfd)
	f.roundTrip(r, "split table")
	f.mustAck(vu.AddMemReg, vu.MemRegionMsg{Region: vu.MemoryRegion{GuestAddr: 1 << 32, Size: 4096, UserAddr: 1 << 46}}.Encode(), f.memfd)
	f.roundTrip(r, "hot-plugged region")
	if got := dev.count("MemoryChanged"); got != 4 {
		t.Fatalf("MemoryChanged: %d calls, want 4", got)
	}
	if got := f.stats.memTables.Load(); got != 3 {
		t.Fatalf("mem tables: %d, want 3", got)
	}
}

// TestBrokenRingBreaksOnce: a ring that is already broken (bad addresses
// at start) and then gets a refused kick fd stays broken with the first
// error, counted once.
func TestBrokenRingBreaksOnce(t *testing.T) {
	f := newFrontend(t, newFakeDevice(1))
	f.ready()
	r := f.ring(0)
	f.mustAck(vu.SetVringErr, vringFile(0, false), r.errfd.Fd())
	f.mustAck(vu.SetVringNum, state(0, queueSize))
	f.mustAck(vu.SetVringAddr, vu.VringAddr{Desc: 1 << 50, Avail: 1 << 50, Used: 1 << 50}.Encode())
	kick, err := eventfd.New()
	if err != nil {
		t.Fatal(err)
	}
	defer kick.Close()
	f.mustAck(vu.SetVringKick, vringFile(0, false), kick.Fd())
	f.expectBroken(r)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	f.nack(vu.SetVringKick, vringFile(0, false), fds[0])
	unix.Close(fds[0])
	if got := f.stats.ringErrors.Load(); got != 1 {
		t.Fatalf("ring errors: %d, want 1", got)
	}
	f.getVringBase(0)
}
