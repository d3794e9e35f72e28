package backend

import (
	"fmt"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// The ring messages: SET_VRING_NUM/ADDR/BASE configure a stopped ring,
// SET_VRING_KICK starts it, GET_VRING_BASE stops it, SET_VRING_CALL/ERR
// set its notifiers and SET_VRING_ENABLE enables it (doc.go, "Ring state
// machine").

// vringState decodes a vring-state payload and finds its ring; with
// stopped, the ring must not be running (configuration messages).
func (s *session) vringState(req vu.Request, p []byte, stopped bool) (vu.VringState, *vring, error) {
	st, err := vu.DecodeVringState(p)
	if err != nil {
		return st, nil, err
	}
	r, err := s.ring(st.Index)
	if err != nil {
		return st, nil, err
	}
	if stopped && r.started {
		return st, nil, fmt.Errorf("ring %d: %s while started", st.Index, req)
	}
	return st, r, nil
}

func (s *session) setVringNum(p []byte) error {
	st, r, err := s.vringState(vu.SetVringNum, p, true)
	if err != nil {
		return err
	}
	// "Queue Size value is always a power of 2. The maximum Queue Size
	// value is 32768." Ours is also bounded by the device.
	max := uint32(s.dev.MaxQueueSize())
	if st.Num == 0 || st.Num > max || st.Num&(st.Num-1) != 0 {
		return fmt.Errorf("ring %d: size %d is not a power of two in [1, %d]", st.Index, st.Num, max)
	}
	r.num = uint16(st.Num)
	return nil
}

func (s *session) setVringAddr(p []byte) error {
	a, err := vu.DecodeVringAddr(p)
	if err != nil {
		return err
	}
	r, err := s.ring(a.Index)
	if err != nil {
		return err
	}
	if a.Flags&^vu.VringAddrFLog != 0 {
		return fmt.Errorf("ring %d: unknown address flags %#x", a.Index, a.Flags)
	}
	same := r.addrSet && r.desc == memmap.UVA(a.Desc) && r.avail == memmap.UVA(a.Avail) && r.used == memmap.UVA(a.Used)
	if r.started && !same {
		// Only the log part may change while the ring runs (QEMU
		// turns VHOST_VRING_F_LOG on and off around a migration).
		return fmt.Errorf("ring %d: SET_VRING_ADDR while started", a.Index)
	}
	if err := s.setVringLog(r, a); err != nil {
		return err
	}
	r.desc, r.avail, r.used = memmap.UVA(a.Desc), memmap.UVA(a.Avail), memmap.UVA(a.Used)
	r.addrSet = true
	return nil
}

func (s *session) setVringBase(p []byte) error {
	st, r, err := s.vringState(vu.SetVringBase, p, true)
	if err != nil {
		return err
	}
	// Split rings use the low 16 bits; anything above them is not an
	// index this device can have produced.
	if st.Num > 0xffff {
		return fmt.Errorf("ring %d: base %#x out of range for a split ring", st.Index, st.Num)
	}
	// A non-zero base this session did not hand out means the driver ran
	// before, against a back-end (or session) that is gone: the device's
	// state is lost, and the device must tell the driver.
	if st.Num != 0 && !(r.ours && uint16(st.Num) == r.base) {
		s.resumed.Store(true)
	}
	r.base, r.ours = uint16(st.Num), false
	return nil
}

func (s *session) getVringBase(p []byte) ([]byte, error) {
	st, r, err := s.vringState(vu.GetVringBase, p, false)
	if err != nil {
		return nil, err
	}
	// "Stop the ring ... returns the next available index."
	base := r.stop()
	r.kick.Close()
	r.kick = nil
	s.suspendIfStopped()
	return vu.VringState{Index: st.Index, Num: uint32(base)}.Encode(), nil
}

// suspendIfStopped tells a Suspender that it is suspended once the
// front-end stopped its last started ring while the driver runs: QEMU
// stopping the VM (device.go, Suspender).
func (s *session) suspendIfStopped() {
	sp, ok := s.dev.(Suspender)
	if !ok || s.suspended || s.anyStarted() {
		return
	}
	if s.protocol&vu.ProtocolStatus != 0 && s.status&virtio.StatusDriverOK == 0 {
		return // the driver is not running: a reset, not a suspension
	}
	s.suspended = true
	sp.Suspend(true)
}

// resumeBeforeStart tells a Suspender that a ring starts while none is
// started. Precondition: the ring about to start is stopped.
func (s *session) resumeBeforeStart() {
	sp, ok := s.dev.(Suspender)
	if !ok || s.anyStarted() {
		return
	}
	s.suspended = false
	sp.Suspend(false)
}

// anyStarted reports whether a ring is started.
func (s *session) anyStarted() bool {
	for _, r := range s.rings {
		if r.started {
			return true
		}
	}
	return false
}

func (s *session) setVringFile(m *vu.Message) error {
	u, err := vu.DecodeU64(m.Payload)
	if err != nil {
		return err
	}
	index, noFd, err := vu.DecodeVringFile(u)
	if err != nil {
		return err
	}
	r, err := s.ring(uint32(index))
	if err != nil {
		return err
	}
	var e *eventfd.EventFD
	if !noFd {
		fd, err := m.TakeFd(0)
		if err != nil {
			return err
		}
		if e, err = eventfd.FromFd(fd); err != nil {
			return err
		}
	}
	switch m.Req() {
	case vu.SetVringKick:
		if noFd {
			return fmt.Errorf("%w: polled ring %d (no kick fd)", errUnsupported, index)
		}
		wasStarted := r.started
		r.stop()
		r.kick.Close()
		r.kick = e
		// "the ring is started upon receiving a kick": the worker starts
		// now and its first kick (sent by start) looks for buffers.
		if r.ready() {
			s.resumeBeforeStart()
			r.start()
		} else if wasStarted {
			return fmt.Errorf("ring %d: kick set before size and addresses", index)
		}
	case vu.SetVringCall:
		if e != nil && !s.interrupts(int(index)) {
			// Checked above, and not kept: the device never interrupts
			// this queue (Interrupter), and the descriptor would be one
			// more per queue for nothing.
			e.Close()
			e = nil
		}
		r.q.mu.Lock()
		old := r.call
		r.call = e
		r.q.mu.Unlock()
		old.Close()
	case vu.SetVringErr:
		r.q.mu.Lock()
		old := r.errfd
		r.errfd = e
		r.q.mu.Unlock()
		old.Close()
	}
	return nil
}

// interrupts reports whether the device may interrupt the driver on queue
// i (Interrupter; true for a device that does not say).
func (s *session) interrupts(i int) bool {
	in, ok := s.dev.(Interrupter)
	return !ok || in.Interrupts(i)
}

func (s *session) setVringEnable(p []byte) error {
	st, r, err := s.vringState(vu.SetVringEnable, p, false)
	if err != nil {
		return err
	}
	if s.features&vu.FeatureProtocolFeatures == 0 && !s.protocolSet {
		return fmt.Errorf("%w: SET_VRING_ENABLE without protocol features", errUnsupported)
	}
	if st.Num > 1 {
		return fmt.Errorf("ring %d: enable value %d is not 0 or 1", st.Index, st.Num)
	}
	r.enabled.Store(st.Num == 1)
	if st.Num == 1 && r.started {
		r.kick.Signal() // look for buffers made available while disabled
	}
	return nil
}
