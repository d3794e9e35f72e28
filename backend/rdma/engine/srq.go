package engine

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Shared receive queues (docs/spec.md § CREATE_SRQ, § Shared receive
// queues). An SRQ's WQEs are consumed one at a time, in ring order, by
// whichever of its QPs a message arrives for: the QPs may belong to
// different doorbell queues (so to different engines) and to the network
// transport's goroutines, so consumption is serialised by the SRQ's own
// mutex, taken under the consuming QP's rqMu. A WQE is copied and ci
// advanced in one step; the message is placed into the copy's SGEs after
// the lock is released, so messages of different QPs are copied in
// parallel.

// SRQ is a shared receive queue. The exported fields are immutable after
// AddSRQ.
type SRQ struct {
	Num           uint32
	PD            uint32 // the PD whose MRs the receive SGEs name
	Dev           *RNIC
	Ring          Ring // Depth is max_wr, Stride 1 << wqe_shift
	Record        abi.GPA
	MaxSGE        uint32
	DoorbellQueue int // the doorbell queue a post notifies when notify asks for it

	// Users counts the QPs created with the SRQ (RemoveSRQ answers
	// ErrSRQBusy while it is not zero). Changed under RNIC.mu.
	Users atomic.Int32

	// waiting is set while waiters is not empty: the doorbell queue's
	// poll reads it without the lock (a hint; kick looks again under mu).
	waiting atomic.Bool

	mu        sync.Mutex
	ci        uint32 // next WQE (protected by mu)
	piSeen    uint32 // the record's pi as last read (protected by mu)
	limit     uint32 // armed SRQ limit, 0: not armed (protected by mu)
	stopped   bool   // pi ran more than max_wr ahead, or the ring left guest memory (protected by mu)
	dead      bool   // destroyed (protected by mu)
	notifyPub uint32 // the record's notify word as last stored (protected by mu)
	// waiters are the requester QPs whose messages found the SRQ empty,
	// kicked when a WQE is posted (protected by mu; at most maxWaiters,
	// each once).
	waiters []*QP
}

// maxWaiters bounds an SRQ's waiter list: a requester not recorded still
// retries after min_rnr_timer.
const maxWaiters = 256

// takeResult is what taking a receive WQE for a message came to.
type takeResult int

const (
	takeOK      takeResult = iota // a WQE, decoded
	takeEmpty                     // none posted: receiver not ready
	takeStopped                   // an SRQ that stopped: receiver not ready, for good
	takeBroken                    // the QP's own receive queue is broken: the QP's error
	takeBad                       // a WQE that does not decode (consumed from an SRQ)
)

func (s *SRQ) String() string { return fmt.Sprintf("srq %d", s.Num) }

// InitRecord clears the record's notify word (nothing waits for a
// receive yet). t is the table of s.Dev; call it before the SRQ is
// reachable.
func (s *SRQ) InitRecord(t *memmap.Table) {
	if t == nil {
		return
	}
	if rec, err := t.Slice(s.Record, abi.SRQRecordSize); err == nil {
		s.storeSRQ(t, rec, abi.SRQRecordNotify, 0)
	}
	s.notifyPub = 0
}

// SetLimit arms the SRQ limit event at limit WQEs (0 disarms): "After the
// device consumed a WQE, if the SRQ has a limit armed and holds fewer WQEs
// than the limit, the device posts SRQ_LIMIT_REACHED and disarms the
// limit." The caller checked limit ≤ max_wr.
func (s *SRQ) SetLimit(limit uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.limit = limit
}

// Limit returns the armed limit (0 once the event fired).
func (s *SRQ) Limit() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit
}

// updateNotifyLocked stores the record's notify word if it changed: 1
// while a requester waits for a WQE. Sequentially consistent, as
// QP.updateRQNotify's. Precondition: mu held; rec is the whole record on
// t, s.Dev's table.
func (s *SRQ) updateNotifyLocked(t *memmap.Table, rec []byte) {
	v := uint32(0)
	if len(s.waiters) > 0 {
		v = 1
	}
	if v != s.notifyPub {
		s.storeSRQ(t, rec, abi.SRQRecordNotify, v)
		s.notifyPub = v
	}
}

// addWaiterLocked records w as waiting for a WQE. Precondition: mu held.
func (s *SRQ) addWaiterLocked(t *memmap.Table, w *QP, rec []byte) {
	for _, o := range s.waiters {
		if o == w {
			return
		}
	}
	if len(s.waiters) < maxWaiters {
		s.waiters = append(s.waiters, w)
		s.waiting.Store(true)
	}
	s.updateNotifyLocked(t, rec)
}

// removeWaiterLocked forgets w. Precondition: mu held.
func (s *SRQ) removeWaiterLocked(t *memmap.Table, w *QP, rec []byte) {
	for i, o := range s.waiters {
		if o == w {
			s.waiters = append(s.waiters[:i], s.waiters[i+1:]...)
			break
		}
	}
	if len(s.waiters) == 0 {
		s.waiters = nil
		s.waiting.Store(false)
	}
	s.updateNotifyLocked(t, rec)
}

// take consumes the SRQ's next WQE for a message: it copies the WQE into
// buf once, advances ci (stored at once: the copy is all the device uses
// afterwards) and decodes the copy into sges. Without a WQE it answers
// takeEmpty, after recording w (when not nil) as a waiter to kick on the
// next post and reading pi once more (the notify protocol of
// vrdma_qp_notify_record, with notify for rq_notify). A pi more than
// max_wr ahead of ci, or a ring or record outside guest memory, stops the
// SRQ for good (takeStopped): "the device stops consuming from it (its QPs
// answer receiver-not-ready) and posts no more of its completions". The
// limit event is posted here. Precondition: the consuming QP's rqMu held;
// t is s.Dev's table.
func (s *SRQ) take(t *memmap.Table, buf []byte, sges []abi.SGE, w *QP) (wrID uint64, n int, res takeResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.stopped {
		return 0, 0, takeStopped
	}
	rec, err := t.Slice(s.Record, abi.SRQRecordSize)
	if err != nil {
		s.stopLocked()
		return 0, 0, takeStopped
	}
	pi := s.piSeen
	if pi-s.ci-1 >= s.Ring.Depth {
		// Not known to be ahead: read the driver's pi (only then, as
		// a QP's rq_pi).
		pi = abi.LoadUint32(rec, abi.SRQRecordPI)
		s.piSeen = pi
	}
	if pi == s.ci {
		if w == nil {
			return 0, 0, takeEmpty
		}
		s.addWaiterLocked(t, w, rec)
		pi = abi.LoadUint32(rec, abi.SRQRecordPI)
		s.piSeen = pi
		if pi == s.ci {
			return 0, 0, takeEmpty
		}
		s.removeWaiterLocked(t, w, rec) // posted meanwhile
	}
	if pi-s.ci > s.Ring.Depth {
		s.stopLocked()
		return 0, 0, takeStopped
	}
	slot, err := s.Ring.Slot(t, s.ci)
	if err != nil {
		s.stopLocked()
		return 0, 0, takeStopped
	}
	k := copy(buf, slot)
	s.ci++
	s.storeSRQ(t, rec, abi.SRQRecordCI, s.ci)
	wrID, n, ok := decodeRecv(buf[:k], min(s.MaxSGE, maxRecvSGEs), sges)
	if s.limit != 0 {
		// The exact count: pi as the driver has it now.
		if p := abi.LoadUint32(rec, abi.SRQRecordPI); p-s.ci <= s.Ring.Depth {
			s.piSeen = p
			if p-s.ci < s.limit {
				s.limit = 0
				if s.Dev != nil {
					s.Dev.postEvent(abi.EventSRQLimit, s.Num)
				}
			}
		}
	}
	if !ok {
		return wrID, 0, takeBad
	}
	return wrID, n, takeOK
}

// stopLocked stops the SRQ for good; its waiters are forgotten (they
// retry on their RNR timers and find it stopped). Precondition: mu held.
func (s *SRQ) stopLocked() {
	if !s.stopped && s.Dev != nil {
		s.Dev.log.WithField("srq", s.Num).Debug("SRQ stopped: producer index more than max_wr ahead, or ring outside guest memory")
	}
	s.stopped = true
	s.waiters = nil
	s.waiting.Store(false)
}

// kick ends the RNR waits of the requesters waiting on the SRQ once a WQE
// is posted: it clears the waiters (and notify), then sets each
// requester's rnrKick and wakes its engine. Run by the poll of the SRQ's
// doorbell queue, which the driver's notification wakes. t is s.Dev's
// table.
func (s *SRQ) kick(t *memmap.Table) {
	if !s.waiting.Load() {
		return
	}
	for _, w := range s.takeWaiters(t) {
		w.rnrKick.Store(true)
		if w.Dev != nil {
			w.Dev.wakeQueue(w.DoorbellQueue)
		}
	}
}

// takeWaiters returns and forgets the waiters if a WQE is posted.
func (s *SRQ) takeWaiters(t *memmap.Table) []*QP {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || len(s.waiters) == 0 {
		return nil
	}
	rec, err := t.Slice(s.Record, abi.SRQRecordSize)
	if err != nil {
		return nil
	}
	pi := abi.LoadUint32(rec, abi.SRQRecordPI)
	if pi == s.ci {
		return nil
	}
	ws := s.waiters
	s.waiters = nil
	s.waiting.Store(false)
	s.updateNotifyLocked(t, rec)
	return ws
}

// stash is a receive WQE a QP with an SRQ consumed for a message that its
// requester then abandoned (its own memory failed under the copy): the
// WQE left the SRQ, so it serves the QP's next message, or completes with
// WR_FLUSH_ERR when the QP flushes. Protected by the QP's rqMu.
type stash struct {
	wrID uint64
	sge  []abi.SGE
}

// Registry errors of SRQs.
var (
	ErrNoSRQ   = errors.New("no such shared receive queue")
	ErrSRQBusy = errors.New("shared receive queue in use")
)

// AddSRQ makes s reachable by its number and by the poll of its doorbell
// queue; it holds its PD (ErrNoPD if s.PD does not exist, and then nothing
// changes). s.Dev must be d.
func (d *RNIC) AddSRQ(s *SRQ) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.holdPDLocked(s.PD); err != nil {
		return err
	}
	d.srqs[s.Num] = s
	old := d.srqByDBQ[s.DoorbellQueue]
	list := make([]*SRQ, len(old), len(old)+1)
	copy(list, old)
	d.srqByDBQ[s.DoorbellQueue] = append(list, s)
	return nil
}

// LookupSRQ returns the SRQ with num, or nil.
func (d *RNIC) LookupSRQ(num uint32) *SRQ {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.srqs[num]
}

// RemoveSRQ destroys the SRQ with num and returns it: ErrNoSRQ if there
// is none, ErrSRQBusy (and nothing changes) while a QP was created with
// it. Once it returns, the device neither reads the SRQ's ring and record
// nor consumes from them (its QPs are gone, and a consumer in flight held
// the SRQ's lock, which RemoveSRQ takes after).
func (d *RNIC) RemoveSRQ(num uint32) (*SRQ, error) {
	d.mu.Lock()
	s := d.srqs[num]
	switch {
	case s == nil:
		d.mu.Unlock()
		return nil, ErrNoSRQ
	case s.Users.Load() > 0:
		d.mu.Unlock()
		return nil, ErrSRQBusy
	}
	delete(d.srqs, num)
	d.releasePDLocked(s.PD)
	old := d.srqByDBQ[s.DoorbellQueue]
	list := make([]*SRQ, 0, len(old))
	for _, o := range old {
		if o != s {
			list = append(list, o)
		}
	}
	if len(list) == 0 {
		delete(d.srqByDBQ, s.DoorbellQueue)
	} else {
		d.srqByDBQ[s.DoorbellQueue] = list
	}
	d.mu.Unlock()
	s.mu.Lock()
	s.dead = true
	s.waiters = nil
	s.waiting.Store(false)
	s.mu.Unlock()
	return s, nil
}

// queueSRQs returns the SRQs of doorbell queue dbq (an immutable slice).
func (d *RNIC) queueSRQs(dbq int) []*SRQ {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.srqByDBQ[dbq]
}
