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
	for i := range 2 {
		f.mustAck(vu.SetVringCall, vringFile(i, false), f.ring(i).call.Fd())
	}
	held := func(i int) bool {
		r := s.rings[i]
		r.q.mu.Lock()
		defer r.q.mu.Unlock()
		return r.call != nil
	}
	if !held(0) || held(1) {
		t.Fatalf("call eventfds kept: queue 0 %v, queue 1 %v; want queue 0 only", held(0), held(1))
	}
	// Still checked: a descriptor that is not an eventfd is refused.
	f.nack(vu.SetVringCall, vringFile(1, false), f.memfd)
}
