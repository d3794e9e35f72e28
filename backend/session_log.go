package backend

import (
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// Dirty logging for live migration (vhost-user "Migration"): the front-end
// gives a log (SET_LOG_BASE, with LOG_SHMFD), acks VHOST_F_LOG_ALL
// (SET_FEATURES) while it migrates, and sets VHOST_VRING_F_LOG on each ring
// (SET_VRING_ADDR) so that used-ring writes are logged at the ring's
// log_guest_addr. Logging is on while LOG_ALL is acked and a log is set:
// the session installs the log in the Memory (memmap.Memory.SetLog), every
// table the workers acquire from then on marks into it, and the answer to
// the message that turned it on or changed it waits until no worker holds
// a table from before (drain). doc.go, "Dirty logging", has the whole
// picture.

// DirtyLogger is implemented by a Device that marks every write it makes
// into guest memory in the table's dirty log (memmap.Table.MarkDirty, or
// through virtio.Chain.Scatter): the session offers VHOST_F_LOG_ALL only
// when LogsDirty returns true. A device that lets anything else write
// guest memory (a host NIC's DMA) must say false: the front-end then
// knows the device cannot be migrated.
type DirtyLogger interface {
	LogsDirty() bool
}

// logDrainTimeout bounds how long a message that turns logging on or
// changes the log waits for the workers' tables from before: a handler
// that holds its table longer (a driver flooding the control queue) is
// logged from its next table on, and the wait is reported.
const logDrainTimeout = time.Second

// logsDirty reports whether the device offers VHOST_F_LOG_ALL.
func (s *session) logsDirty() bool {
	l, ok := s.dev.(DirtyLogger)
	return ok && l.LogsDirty()
}

// setLogBase is SET_LOG_BASE: "Sets logging shared memory space. When the
// back-end has VHOST_USER_PROTOCOL_F_LOG_SHMFD protocol feature, the log
// memory fd is provided in the ancillary data of VHOST_USER_SET_LOG_BASE
// message, the size and offset of shared memory area provided in the
// message." The log must cover every region of the memory table and the
// used ring of every ring that logs it ("the bit offset of the last byte
// of the ring must fall within the size supplied by VhostUserLog");
// anything else is refused and the previous log stays.
func (s *session) setLogBase(m *vu.Message) error {
	if s.protocol&vu.ProtocolLogShmfd == 0 {
		return fmt.Errorf("%w: LOG_SHMFD not negotiated", errUnsupported)
	}
	li, err := vu.DecodeLogInfo(m.Payload)
	if err != nil {
		return err
	}
	fd, err := m.TakeFd(0)
	if err != nil {
		return err
	}
	l, err := memmap.MapDirtyLog(fd, li.MmapSize, li.MmapOffset)
	if err != nil {
		return err
	}
	if err := s.logCovers(l, s.mem.Acquire(), -1, 0, 0); err != nil {
		l.Release()
		return err
	}
	old := s.logBase
	s.logBase = l
	s.applyLog()
	if old != nil {
		old.Release() // tables still holding it keep their own references
	}
	return nil
}

// logCovers checks that l covers every region of t and the used ring of
// every ring that logs it; it releases t. A ring index skip (≥ 0) is
// checked with the log address and size given instead of its own
// (SET_VRING_ADDR before it takes effect).
func (s *session) logCovers(l *memmap.DirtyLog, t *memmap.Table, skip int, addr uint64, num uint16) error {
	defer t.Release()
	if !l.CoversTable(t) {
		return fmt.Errorf("dirty log of %#x bytes does not cover the memory table: %w", l.Size(), memmap.ErrBadLog)
	}
	for i, r := range s.rings {
		r.q.mu.Lock()
		on, a, n := r.logUsed, r.logAddr, r.num
		r.q.mu.Unlock()
		if i == skip {
			on, a, n = true, addr, num
		}
		if on && !l.Covers(abi.GPA(a), virtio.UsedRingSize(max(n, 1))) {
			return fmt.Errorf("dirty log of %#x bytes does not cover ring %d's used ring at %#x: %w",
				l.Size(), i, a, memmap.ErrBadLog)
		}
	}
	return nil
}

// setLogFd is SET_LOG_FD: "an optional message with an eventfd in
// ancillary data, it may be used to inform the front-end that the log has
// been modified". The back-end does not use it: the front-end reads the
// log when it syncs. The descriptor is checked and closed.
func (s *session) setLogFd(m *vu.Message) error {
	if s.protocol&vu.ProtocolLogShmfd == 0 {
		return fmt.Errorf("%w: LOG_SHMFD not negotiated", errUnsupported)
	}
	fd, err := m.TakeFd(0)
	if err != nil {
		return err
	}
	e, err := eventfd.FromFd(fd)
	if err != nil {
		return fmt.Errorf("log fd: %w", err)
	}
	e.Close()
	return nil
}

// setLogAll follows SET_FEATURES: logging starts or stops with
// VHOST_F_LOG_ALL. Turning it off drops the log altogether: QEMU sends a
// new SET_LOG_BASE before it turns logging on again, and the log's file is
// released as soon as no worker holds a table marking into it. Turning it
// on without a log is accepted (QEMU's vhost_dev_start sends the features
// before the log base): logging starts with SET_LOG_BASE.
// Precondition: session goroutine.
func (s *session) setLogAll(was uint64) {
	if was&virtio.FeatureLogAll != 0 && s.features&virtio.FeatureLogAll == 0 && s.logBase != nil {
		s.logBase.Release()
		s.logBase = nil
	}
	s.applyLog()
}

// applyLog installs the log the acked features and the last SET_LOG_BASE
// call for, if it is not the one installed, and waits for the drain.
// Precondition: session goroutine.
func (s *session) applyLog() {
	want := s.logBase
	if s.features&virtio.FeatureLogAll == 0 {
		want = nil
	}
	if want == s.mem.Log() {
		return
	}
	idle := s.mem.SetLog(want)
	timer := time.NewTimer(logDrainTimeout)
	defer timer.Stop()
	select {
	case <-idle:
	case <-timer.C:
		s.log.WithError(errLogDrain).Warn("dirty log switched while a worker still holds its table")
	}
}

// errLogDrain reports a drain that timed out.
var errLogDrain = errors.New("workers still hold the previous memory table")

// dropLog releases the log and turns logging off without waiting (reset,
// teardown: the workers are stopped or about to be).
func (s *session) dropLog() {
	if s.mem.Log() != nil {
		s.mem.SetLog(nil)
	}
	if s.logBase != nil {
		s.logBase.Release()
		s.logBase = nil
	}
}

// setVringLog applies the VHOST_VRING_F_LOG part of SET_VRING_ADDR: "When
// logging modifications to the used ring (when VHOST_VRING_F_LOG is set
// for this ring), log_guest_addr should be used to calculate the log
// offset: the write to first byte of the used ring is logged at this
// offset from log start." With a log set, the ring's used ring must lie in
// it. It may be sent while the ring runs (QEMU does, when migration
// starts and ends): the worker reads the fields under q.mu.
func (s *session) setVringLog(r *vring, a vu.VringAddr) error {
	on := a.Flags&vu.VringAddrFLog != 0
	if on {
		if _, ok := abi.GPA(a.Log).Add(virtio.UsedRingSize(max(r.num, 1))); !ok {
			return fmt.Errorf("ring %d: log address %#x: %w", a.Index, a.Log, memmap.ErrOverflow)
		}
		if s.logBase != nil {
			if err := s.logCovers(s.logBase, s.mem.Acquire(), r.q.index, a.Log, r.num); err != nil {
				return err
			}
		}
	}
	r.q.mu.Lock()
	r.logUsed, r.logAddr = on, a.Log
	r.q.mu.Unlock()
	return nil
}

// LogUsed marks a store into the ring's used ring at its log address
// (virtio.UsedLog). Precondition: q.mu held and q.table set (inside run:
// every store into a used ring happens there).
func (r *vring) LogUsed(off, n uint64) {
	if t := r.q.table; t != nil && r.logUsed {
		t.MarkDirty(abi.GPA(r.logAddr+off), n)
	}
}

// checkLogCoversTable refuses a memory-table message whose regions the
// installed log would not cover (QEMU grows the log before it grows
// memory). Precondition: session goroutine.
func (s *session) checkLogCoversTable(m *vu.Message) error {
	l := s.logBase
	if l == nil {
		return nil
	}
	var regions []vu.MemoryRegion
	switch m.Req() {
	case vu.SetMemTable:
		mt, err := vu.DecodeMemTable(m.Payload)
		if err != nil {
			return err
		}
		regions = mt.Regions
	case vu.AddMemReg:
		rm, err := vu.DecodeMemRegionMsg(m.Payload)
		if err != nil {
			return err
		}
		regions = []vu.MemoryRegion{rm.Region}
	}
	for _, r := range regions {
		if !l.Covers(abi.GPA(r.GuestAddr), r.Size) {
			return fmt.Errorf("region %#x+%#x beyond the dirty log of %#x bytes: %w",
				r.GuestAddr, r.Size, l.Size(), memmap.ErrBadLog)
		}
	}
	return nil
}
