// Package rctest is an rc.Host over plain Go memory, for tests and tools
// that run the RC protocol without the engine: memory regions by rkey, a
// receive queue, and the completions, which a test waits for.
//
// It is safe for concurrent use: the QP calls it with its own lock held
// (from the endpoint's goroutines) while the test posts receives and waits.
package rctest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
)

// ErrRange is returned for an access outside a buffer or region.
var ErrRange = errors.New("rctest: access out of range")

// MR is a memory region: Buf at address Addr, reachable with RKey for
// Access. Every access takes mu, so that a test reading Buf through Copy
// after a completion is ordered after the responder's writes (the network
// orders them, but the race detector cannot see it). Set Buf before the MR
// is in use; later, touch it only through Copy and Store.
type MR struct {
	Buf    []byte
	Addr   uint64
	RKey   uint32
	Access rc.Access

	mu      sync.Mutex // protects the contents of Buf and atomics
	atomics int
}

// Copy returns a copy of n bytes at offset off of Buf.
func (m *MR) Copy(off, n int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]byte(nil), m.Buf[off:off+n]...)
}

// Store copies b to offset off of Buf.
func (m *MR) Store(off int, b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	copy(m.Buf[off:], b)
}

func (m *MR) slice(va uint64, n int) ([]byte, error) {
	if va < m.Addr || va-m.Addr > uint64(len(m.Buf)) || uint64(n) > uint64(len(m.Buf))-(va-m.Addr) {
		return nil, fmt.Errorf("%w: %d bytes at %#x, region %#x+%d", ErrRange, n, va, m.Addr, len(m.Buf))
	}
	o := va - m.Addr
	return m.Buf[o : o+uint64(n)], nil
}

// WriteAt implements rc.Region.
func (m *MR) WriteAt(va uint64, src []byte) error {
	d, err := m.slice(va, len(src))
	if err == nil {
		m.mu.Lock()
		copy(d, src)
		m.mu.Unlock()
	}
	return err
}

// ReadAt implements rc.Region.
func (m *MR) ReadAt(va uint64, dst []byte) error {
	s, err := m.slice(va, len(dst))
	if err == nil {
		m.mu.Lock()
		copy(dst, s)
		m.mu.Unlock()
	}
	return err
}

// Atomic implements rc.Region on little-endian 8-byte words.
func (m *MR) Atomic(va uint64, op rc.AtomicOp, compare, swapAdd uint64) (uint64, error) {
	s, err := m.slice(va, 8)
	if err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.atomics++
	orig := binary.LittleEndian.Uint64(s)
	switch op {
	case rc.AtomicFetchAdd:
		binary.LittleEndian.PutUint64(s, orig+swapAdd)
	case rc.AtomicCmpSwp:
		if orig == compare {
			binary.LittleEndian.PutUint64(s, swapAdd)
		}
	}
	return orig, nil
}

// Atomics returns how many atomic operations ran on m.
func (m *MR) Atomics() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.atomics
}

// Buf is local memory of one message: an rc.Buffer over a slice.
type Buf []byte

// Gather implements rc.Buffer.
func (b Buf) Gather(off uint32, dst []byte) error {
	if uint64(off)+uint64(len(dst)) > uint64(len(b)) {
		return ErrRange
	}
	copy(dst, b[off:])
	return nil
}

// Scatter implements rc.Buffer.
func (b Buf) Scatter(off uint32, src []byte) error {
	if uint64(off)+uint64(len(src)) > uint64(len(b)) {
		return ErrRange
	}
	copy(b[off:], src)
	return nil
}

// Host implements rc.Host.
type Host struct {
	mu      sync.Mutex
	mrs     map[uint32]*MR      // protected by mu
	recvs   []rc.Recv           // protected by mu
	sends   []rc.Completion     // protected by mu
	recvd   []rc.RecvCompletion // protected by mu
	changed chan struct{}       // a completion arrived (capacity 1)
}

// NewHost returns a Host without memory or receives.
func NewHost() *Host {
	return &Host{mrs: map[uint32]*MR{}, changed: make(chan struct{}, 1)}
}

// AddMR registers m under m.RKey.
func (h *Host) AddMR(m *MR) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mrs[m.RKey] = m
}

// PostRecv queues a receive.
func (h *Host) PostRecv(r rc.Recv) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recvs = append(h.recvs, r)
}

// Resolve implements rc.Host.
func (h *Host) Resolve(rkey uint32, va uint64, length uint32, access rc.Access) (rc.Region, bool) {
	if length == 0 {
		// Names no memory; this Host's QP allows every access.
		return nil, true
	}
	h.mu.Lock()
	m := h.mrs[rkey]
	h.mu.Unlock()
	if m == nil || m.Access&access != access {
		return nil, false
	}
	if _, err := m.slice(va, int(length)); err != nil {
		return nil, false
	}
	return m, true
}

// Invalidate implements rc.Host: a SEND with invalidate may free any MR
// the Host holds; a freed rkey resolves nothing from then on.
func (h *Host) Invalidate(rkey uint32, commit bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mrs[rkey] == nil {
		return false
	}
	if commit {
		delete(h.mrs, rkey)
	}
	return true
}

// TakeRecv implements rc.Host.
func (h *Host) TakeRecv() (rc.Recv, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recvs) == 0 {
		return rc.Recv{}, false
	}
	r := h.recvs[0]
	h.recvs[0] = rc.Recv{}
	h.recvs = h.recvs[1:]
	return r, true
}

// RecvDone implements rc.Host.
func (h *Host) RecvDone(c rc.RecvCompletion) {
	h.mu.Lock()
	h.recvd = append(h.recvd, c)
	h.mu.Unlock()
	h.notify()
}

// SendDone implements rc.Host.
func (h *Host) SendDone(c rc.Completion) {
	h.mu.Lock()
	h.sends = append(h.sends, c)
	h.mu.Unlock()
	h.notify()
}

func (h *Host) notify() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// wait waits until ready reports true (checked with mu held) or ctx ends.
func (h *Host) wait(ctx context.Context, ready func() bool) error {
	for {
		h.mu.Lock()
		ok := ready()
		h.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-h.changed:
		}
	}
}

// TakeSends waits for n send completions and returns them (removing them).
func (h *Host) TakeSends(ctx context.Context, n int) ([]rc.Completion, error) {
	if err := h.wait(ctx, func() bool { return len(h.sends) >= n }); err != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		return nil, fmt.Errorf("rctest: %d of %d send completions: %w", len(h.sends), n, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := append([]rc.Completion(nil), h.sends[:n]...)
	h.sends = append(h.sends[:0], h.sends[n:]...)
	return out, nil
}

// TakeRecvs waits for n receive completions and returns them (removing
// them).
func (h *Host) TakeRecvs(ctx context.Context, n int) ([]rc.RecvCompletion, error) {
	if err := h.wait(ctx, func() bool { return len(h.recvd) >= n }); err != nil {
		h.mu.Lock()
		defer h.mu.Unlock()
		return nil, fmt.Errorf("rctest: %d of %d receive completions: %w", len(h.recvd), n, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := append([]rc.RecvCompletion(nil), h.recvd[:n]...)
	h.recvd = append(h.recvd[:0], h.recvd[n:]...)
	return out, nil
}
