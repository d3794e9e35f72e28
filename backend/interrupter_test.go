package backend

import (
	"testing"

	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// quietDevice is a fakeDevice that never interrupts queue 1.
type quietDevice struct{ *fakeDevice }

func (quietDevice) Interrupts(queue int) bool { return queue != 1 }

// The session checks the call eventfd of a queue the device never
// interrupts, and keeps none: a doorbell queue costs one descriptor less.
func TestCallFdOfQueueWithoutInterruptsNotKept(t *testing.T) {
	dev := newFakeDevice(2)
	a, b := socketpair(t)
	stats := &Stats{}
	s := newSession(b, quietDevice{dev}, discardLog(), stats)
	f := &testFrontend{t: t, conn: vu.NewConn(a), dev: dev, sess: s, stats: stats, done: make(chan error, 1)}
	go func() { f.done <- s.serve() }()
	f.initMemory()
	t.Cleanup(f.close)
	f.negotiate(vu.ProtocolReplyAck)
	// The session is in this process: a descriptor it keeps is one more
	// in /proc/self/fd (counted with system calls, not by reading the
	// session's fields under its feet).
	before := openFds(t)
	f.mustAck(vu.SetVringCall, vringFile(0, false), f.ring(0).call.Fd())
	kept0 := openFds(t) - before
	f.mustAck(vu.SetVringCall, vringFile(1, false), f.ring(1).call.Fd())
	kept1 := openFds(t) - before - kept0
	// f.ring(i) made 3 eventfds of the front-end's own each time.
	if kept0 != 3+1 || kept1 != 3 {
		t.Fatalf("descriptors added: queue 0 %d, queue 1 %d; want 4 (the front-end's 3 and the session's call fd) and 3", kept0, kept1)
	}
	// Still checked: a descriptor that is not an eventfd is refused.
	f.nack(vu.SetVringCall, vringFile(1, false), f.memfd)
}
