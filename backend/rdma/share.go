package rdma

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/sched"
)

// Share is a device's part of the daemon's engine when devices compete
// for it (package sched): its weight in the deficit round robin that
// visits busy doorbell queues, and optional bounds on its data path.
// The zero Share is weight 1 and no bound.
type Share struct {
	// Weight scales the bytes a visit of one of the device's doorbell
	// queues may move before the next busy queue's turn: a device of
	// weight 4 gets four times the engine of a device of weight 1 while
	// both are busy. 0 means 1; at most MaxWeight.
	Weight uint32
	// MaxBytesPerSec bounds the payload the device's requesters move per
	// second (a token bucket holding one tenth of a second's worth, at
	// least one 4 MiB message); 0 means no bound.
	MaxBytesPerSec uint64
	// MaxOpsPerSec bounds the work requests its requesters execute per
	// second (a bucket of one tenth of a second's worth, at least 64); 0
	// means no bound.
	MaxOpsPerSec uint64
}

// MaxWeight bounds Share.Weight.
const MaxWeight = 1000

// MinBytesPerSec is the least non-zero Share.MaxBytesPerSec: a bucket must
// refill a page.
const MinBytesPerSec = 4096

// ErrBadShare is wrapped by the errors of Share.Check.
var ErrBadShare = errors.New("bad share")

// Check validates s.
func (s Share) Check() error {
	if s.Weight > MaxWeight {
		return fmt.Errorf("%w: weight %d above %d", ErrBadShare, s.Weight, MaxWeight)
	}
	if s.MaxBytesPerSec != 0 && s.MaxBytesPerSec < MinBytesPerSec {
		return fmt.Errorf("%w: max_bytes_per_s %d below %d", ErrBadShare, s.MaxBytesPerSec, MinBytesPerSec)
	}
	return nil
}

// weight is s.Weight with 0 meaning 1.
func (s Share) weight() int64 {
	if s.Weight == 0 {
		return 1
	}
	return int64(s.Weight)
}

// SetShare changes the device's share; the next visit of each of its
// doorbell queues uses it.
func (d *Device) SetShare(s Share) error {
	if err := s.Check(); err != nil {
		return err
	}
	d.share.Store(&s)
	d.mu.Lock()
	for _, db := range d.doorbells {
		db.task.SetWeight(s.weight())
		db.task.Wake() // a queue waiting for its bound's tokens looks again
	}
	d.mu.Unlock()
	return nil
}

// Share returns the device's share.
func (d *Device) Share() Share { return *d.share.Load() }

// bucket enforces a Share's rate bounds for all doorbell queues of a
// device: token buckets of bytes and work requests, refilled continuously,
// holding a tenth of a second's worth (at least one largest message, so a
// bound never stalls a message forever). A visit may overdraw it by its
// last message; the debt delays the next visits.
type bucket struct {
	mu    sync.Mutex
	bytes float64   // protected by mu; may be negative (debt)
	ops   float64   // protected by mu
	at    time.Time // protected by mu; last refill; zero: full
	was   Share     // protected by mu; the bounds the tokens were for
}

// burst is how much of a second's rate a bucket holds.
const burst = 0.1

// maxMessage is the bucket's least byte capacity: the largest message a
// queue may post (Limits.MaxMRSize bounds it far higher; a 4 MiB floor
// keeps a bound from serialising ordinary large messages).
const maxMessage = 4 << 20

func capacities(s Share) (bytes, ops float64) {
	return max(float64(s.MaxBytesPerSec)*burst, maxMessage), max(float64(s.MaxOpsPerSec)*burst, 64)
}

// refill brings the tokens to now. Precondition: mu held.
func (b *bucket) refill(s Share, now time.Time) {
	cb, co := capacities(s)
	if b.at.IsZero() || s != b.was {
		// First use, or new bounds: start full.
		b.bytes, b.ops, b.at, b.was = cb, co, now, s
		return
	}
	dt := now.Sub(b.at).Seconds()
	b.at = now
	if s.MaxBytesPerSec != 0 {
		b.bytes = min(b.bytes+dt*float64(s.MaxBytesPerSec), cb)
	}
	if s.MaxOpsPerSec != 0 {
		b.ops = min(b.ops+dt*float64(s.MaxOpsPerSec), co)
	}
}

// allow narrows a visit's budget to the tokens left. Without tokens it
// reports false and when there will be some.
func (b *bucket) allow(v *sched.Budget, s Share) (time.Time, bool) {
	if s.MaxBytesPerSec == 0 && s.MaxOpsPerSec == 0 {
		return time.Time{}, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	b.refill(s, now)
	var wait float64 // seconds
	if s.MaxBytesPerSec != 0 {
		if b.bytes < 1 {
			wait = max(wait, (1-b.bytes)/float64(s.MaxBytesPerSec))
		} else {
			v.Bytes = min(v.Bytes, int64(b.bytes))
		}
	}
	if s.MaxOpsPerSec != 0 {
		if b.ops < 1 {
			wait = max(wait, (1-b.ops)/float64(s.MaxOpsPerSec))
		} else {
			v.Ops = min(v.Ops, int(b.ops))
		}
	}
	if wait > 0 {
		return now.Add(time.Duration(wait * float64(time.Second))), false
	}
	return time.Time{}, true
}

// charge takes what a visit used from the tokens.
func (b *bucket) charge(bytes int64, ops int, s Share) {
	if s.MaxBytesPerSec == 0 && s.MaxOpsPerSec == 0 {
		return
	}
	b.mu.Lock()
	b.bytes -= float64(bytes)
	b.ops -= float64(ops)
	b.mu.Unlock()
}
