package frontend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// DefaultCommandTimeout bounds one control command of a Transport.
const DefaultCommandTimeout = 10 * time.Second

// Transport is the virtio-user transport of the verbs library: control
// commands on queue 0, events on queue 1 (kept stocked with 16-byte
// buffers), doorbell notifications on queues 2…, DMA memory from the
// front-end's guest memory. It is safe for concurrent use. It does not own
// the Frontend: close the Frontend after the Transport (or the
// verbs.Context on top of it).
type Transport struct {
	f       *Frontend     // immutable
	timeout time.Duration // immutable
	dbs     []*Queue      // immutable: doorbell queues

	cmdMu  sync.Mutex // serialises commands and config reads on f
	broken error      // protected by cmdMu: set when a command was lost
	closed bool       // protected by cmdMu

	evMu   sync.Mutex // protects the event queue and the fields below
	evq    *Queue
	evBuf  []byte // slots of EventSize bytes, posted on evq
	evGPA  abi.GPA
	slotOf []int // by chain head: the slot it carries, -1 when none
}

// NewTransport makes a transport over f, whose control, event and doorbell
// queues (all of them) must have been started, and stocks the event queue.
func NewTransport(f *Frontend) (*Transport, error) {
	if f.NumQueues < abi.FirstDoorbellQueue+1 {
		return nil, fmt.Errorf("frontend: %d queues, an RDMA device has at least %d", f.NumQueues, abi.FirstDoorbellQueue+1)
	}
	for i, q := range f.queues {
		if !q.started || q.DriverQueue == nil {
			return nil, fmt.Errorf("frontend: queue %d not started", i)
		}
	}
	t := &Transport{f: f, timeout: DefaultCommandTimeout, dbs: f.queues[abi.FirstDoorbellQueue:], evq: f.queues[abi.EventQueue]}
	n := int(t.evq.Size())
	gpa, buf, err := f.Alloc(uint64(n*abi.EventSize), allocPage)
	if err != nil {
		return nil, fmt.Errorf("frontend: event buffers: %w", err)
	}
	t.evBuf, t.evGPA = buf, gpa
	t.slotOf = make([]int, n)
	for i := range t.slotOf {
		t.slotOf[i] = -1
	}
	for s := range n {
		if err := t.postEvent(s); err != nil {
			return nil, err
		}
	}
	if err := t.evq.Notify(); err != nil {
		return nil, err
	}
	return t, nil
}

// RDMATransport returns a Transport over f (see NewTransport).
func (f *Frontend) RDMATransport() (verbs.Transport, error) {
	t, err := NewTransport(f)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// OpenRDMA dials the vrdma device at socket with memSize bytes of guest
// memory (zero: the default), starts every queue and opens the verbs
// context. Close the context, then the Frontend.
func OpenRDMA(ctx context.Context, socket string, memSize uint64) (*verbs.Context, *Frontend, error) {
	f, err := Dial(ctx, Config{Socket: socket, MemorySize: memSize})
	if err != nil {
		return nil, nil, err
	}
	c, err := f.openRDMA()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return c, f, nil
}

// openRDMA starts every queue of f and opens a verbs context over them.
func (f *Frontend) openRDMA() (*verbs.Context, error) {
	qs := make([]int, f.NumQueues)
	for i := range qs {
		qs[i] = i
	}
	if err := f.Start(qs...); err != nil {
		return nil, fmt.Errorf("frontend: start: %w", err)
	}
	t, err := NewTransport(f)
	if err != nil {
		return nil, err
	}
	return verbs.Open(t)
}

// Reopen does what a driver must after the device lost its objects
// (DEVICE_FATAL once vrdmad restarted, docs/spec.md "Reset and
// disconnect"): it resets the device, starts every queue again and opens a
// new verbs context. The old context must be closed first.
func (f *Frontend) Reopen() (*verbs.Context, error) {
	if err := f.ResetDevice(); err != nil {
		return nil, err
	}
	return f.openRDMA()
}

// eventGPA is the guest-physical address of event slot s.
func (t *Transport) eventGPA(s int) abi.GPA {
	return t.evGPA + abi.GPA(s*abi.EventSize)
}

// postEvent posts event slot s. Precondition: evMu held or t not shared.
func (t *Transport) postEvent(s int) error {
	clear(t.evBuf[s*abi.EventSize : (s+1)*abi.EventSize])
	h, err := t.evq.Add([]virtio.Buf{{Addr: t.eventGPA(s), Len: abi.EventSize, Writable: true}})
	if err != nil {
		return fmt.Errorf("frontend: post event buffer: %w", err)
	}
	t.slotOf[h] = s
	return nil
}

// ReadConfig reads device config space (GET_CONFIG).
func (t *Transport) ReadConfig(off, n int) ([]byte, error) {
	if off < 0 || n < 0 || off > 1<<16 || n > 1<<16 {
		return nil, fmt.Errorf("frontend: config read [%d, +%d) out of range", off, n)
	}
	t.cmdMu.Lock()
	defer t.cmdMu.Unlock()
	if t.closed {
		return nil, verbs.ErrClosed
	}
	return t.f.ReadConfig(uint32(off), uint32(n))
}

// Command runs one control command on queue 0. A command that times out
// leaves its chain with the device, so the transport refuses further
// commands.
func (t *Transport) Command(req []byte, respLen int) ([]byte, error) {
	t.cmdMu.Lock()
	defer t.cmdMu.Unlock()
	if t.closed {
		return nil, verbs.ErrClosed
	}
	if t.broken != nil {
		return nil, fmt.Errorf("frontend: control queue unusable: %w", t.broken)
	}
	resp, err := t.f.Exec(abi.ControlQueue, req, respLen, t.timeout)
	if err != nil && (errors.Is(err, ErrTimeout) || errors.Is(err, virtio.ErrBroken)) {
		t.broken = err
	}
	return resp, err
}

// AllocDMA allocates zeroed guest memory.
func (t *Transport) AllocDMA(size, align uint64) (verbs.DMABuf, error) {
	gpa, b, err := t.f.Alloc(size, align)
	if err != nil {
		return verbs.DMABuf{}, err
	}
	return verbs.DMABuf{Addr: gpa, Buf: b}, nil
}

// FreeDMA gives guest memory back.
func (t *Transport) FreeDMA(b verbs.DMABuf) {
	if b.Buf != nil {
		t.f.Free(b.Addr)
	}
}

// Notify kicks doorbell queue i. Doorbell queues carry no descriptors.
func (t *Transport) Notify(i int) error {
	if i < 0 || i >= len(t.dbs) {
		return fmt.Errorf("frontend: doorbell queue %d of %d", i, len(t.dbs))
	}
	return t.dbs[i].Kick.Signal()
}

// Polling reports the NO_NOTIFY bit of doorbell queue i's used ring flags.
func (t *Transport) Polling(i int) bool {
	if i < 0 || i >= len(t.dbs) {
		return false
	}
	return abi.LoadUint16(t.dbs[i].rings.Used, 0)&virtio.UsedFNoNotify != 0
}

// WaitEvent returns the next event, waiting up to timeout; the buffer is
// posted again at once. A used element of the wrong length is an error
// (the buffer is reposted).
func (t *Transport) WaitEvent(timeout time.Duration) (abi.Event, error) {
	t.evMu.Lock()
	defer t.evMu.Unlock()
	deadline := time.Now().Add(timeout)
	sleep := 20 * time.Microsecond
	for {
		h, n, ok, err := t.evq.Used()
		if err != nil {
			return abi.Event{}, err
		}
		if ok {
			return t.takeEvent(h, n)
		}
		if !time.Now().Before(deadline) {
			return abi.Event{}, fmt.Errorf("frontend: event queue: %w", verbs.ErrTimeout)
		}
		t.evq.Call.TryWait()
		time.Sleep(min(sleep, time.Until(deadline)))
		sleep = min(2*sleep, time.Millisecond)
	}
}

// takeEvent copies the event out of chain h and reposts its buffer.
// Precondition: evMu held.
func (t *Transport) takeEvent(h uint16, n uint32) (abi.Event, error) {
	s := t.slotOf[h]
	t.slotOf[h] = -1
	if s < 0 {
		return abi.Event{}, fmt.Errorf("frontend: event chain %d carries no buffer", h)
	}
	var raw [abi.EventSize]byte
	copy(raw[:], t.evBuf[s*abi.EventSize:])
	var ev abi.Event
	uerr := abi.Unmarshal(raw[:], &ev)
	if err := t.postEvent(s); err != nil {
		return abi.Event{}, err
	}
	if err := t.evq.Notify(); err != nil {
		return abi.Event{}, err
	}
	if n != abi.EventSize {
		return abi.Event{}, fmt.Errorf("%w: event of %d bytes", verbs.ErrProtocol, n)
	}
	if uerr != nil {
		return abi.Event{}, uerr
	}
	return ev, nil
}

// Close stops the transport. The event buffers stay posted (the device may
// still write them) and die with the Frontend's guest memory.
func (t *Transport) Close() error {
	t.cmdMu.Lock()
	defer t.cmdMu.Unlock()
	t.closed = true
	return nil
}

var _ verbs.Transport = (*Transport)(nil)
