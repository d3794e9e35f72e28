package impair

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Limits a Rule is checked against.
const (
	// MaxDelay bounds Rule.Delay and Rule.Jitter.
	MaxDelay = 10 * time.Second
	// MaxReorderAfter bounds Rule.ReorderAfter.
	MaxReorderAfter = 1024
)

// Errors of the package; the typed errors match them with errors.Is.
var (
	// ErrRule: a Rule outside its limits.
	ErrRule = errors.New("impair: bad rule")
	// ErrConfig: a Config or a path list New does not accept.
	ErrConfig = errors.New("impair: bad config")
	// ErrPath: a path index out of range.
	ErrPath = errors.New("impair: no such path")
	// ErrClosed: the Hop was closed.
	ErrClosed = errors.New("impair: hop closed")
)

// RuleError names the Rule field that is out of its limits.
type RuleError struct {
	Field  string
	Reason string
}

func (e *RuleError) Error() string        { return fmt.Sprintf("impair: rule %s: %s", e.Field, e.Reason) }
func (e *RuleError) Is(target error) bool { return target == ErrRule }

// Rule is what one direction of a path does to the packets it forwards.
// The zero Rule forwards everything at once. The stages run in this order:
// down, loss, reorder, rate, delay.
type Rule struct {
	// Down drops every packet, including those already queued when it is
	// set (they are dropped when they would leave).
	Down bool
	// Loss is the probability in [0, 1] that a packet is dropped.
	Loss float64
	// ReorderProb is the probability in [0, 1] that a packet is held back
	// and let go after ReorderAfter later packets of the same direction
	// have passed (0 means 1), or after Config.ReorderTimeout if fewer
	// come. At most Config.QueueLen/2 (and 64) packets are held at once;
	// past that a packet passes in order.
	ReorderProb  float64
	ReorderAfter int
	// RateBps, bits per second, limits the rate packets leave at (0: no
	// limit); a packet waits for the ones before it to be "sent". The
	// queue is Config.QueueLen packets; what does not fit is dropped and
	// counted as QueueFull.
	RateBps uint64
	// Delay is added to every packet, plus a uniform random amount in
	// [0, Jitter]. Packets never overtake one another here: a packet
	// leaves no earlier than the one before it (only ReorderProb
	// reorders).
	Delay, Jitter time.Duration
}

// Validate checks r against its limits.
func (r Rule) Validate() error {
	prob := func(field string, p float64) error {
		if math.IsNaN(p) || p < 0 || p > 1 {
			return &RuleError{Field: field, Reason: fmt.Sprintf("%v is not a probability", p)}
		}
		return nil
	}
	if err := prob("Loss", r.Loss); err != nil {
		return err
	}
	if err := prob("ReorderProb", r.ReorderProb); err != nil {
		return err
	}
	if r.ReorderAfter < 0 || r.ReorderAfter > MaxReorderAfter {
		return &RuleError{Field: "ReorderAfter", Reason: fmt.Sprintf("%d not in [0, %d]", r.ReorderAfter, MaxReorderAfter)}
	}
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"Delay", r.Delay}, {"Jitter", r.Jitter}} {
		if d.v < 0 || d.v > MaxDelay {
			return &RuleError{Field: d.field, Reason: fmt.Sprintf("%v not in [0, %v]", d.v, MaxDelay)}
		}
	}
	return nil
}

// Dir is the direction of a path.
type Dir int

const (
	// AtoB is what host A sends to host B.
	AtoB Dir = iota
	// BtoA is what host B sends to host A.
	BtoA
)

func (d Dir) String() string {
	switch d {
	case AtoB:
		return "A->B"
	case BtoA:
		return "B->A"
	}
	return fmt.Sprintf("Dir(%d)", int(d))
}

// Counters count the packets of one direction of a path (or, from
// Hop.Counters, of both). When nothing is in flight,
//
//	Received = Forwarded + DroppedLoss + DroppedDown + QueueFull + WriteErrors
//
// Delayed and Reordered count packets that were held (and are also counted
// where they ended).
type Counters struct {
	// Received: packets read from the device.
	Received uint64
	// Forwarded: packets written back.
	Forwarded uint64
	// DroppedLoss: dropped by Rule.Loss.
	DroppedLoss uint64
	// DroppedDown: dropped because the direction was Down.
	DroppedDown uint64
	// Delayed: packets that waited (Delay, Jitter, RateBps, or a packet
	// ahead that waited).
	Delayed uint64
	// Reordered: packets held back by ReorderProb.
	Reordered uint64
	// QueueFull: dropped because all Config.QueueLen buffers of the
	// direction were in use.
	QueueFull uint64
	// ReadErrors and WriteErrors are device errors (a failed write drops
	// its packet).
	ReadErrors, WriteErrors uint64
}

// Add returns the field-wise sum of c and d.
func (c Counters) Add(d Counters) Counters {
	return Counters{
		Received: c.Received + d.Received, Forwarded: c.Forwarded + d.Forwarded,
		DroppedLoss: c.DroppedLoss + d.DroppedLoss, DroppedDown: c.DroppedDown + d.DroppedDown,
		Delayed: c.Delayed + d.Delayed, Reordered: c.Reordered + d.Reordered,
		QueueFull: c.QueueFull + d.QueueFull, ReadErrors: c.ReadErrors + d.ReadErrors,
		WriteErrors: c.WriteErrors + d.WriteErrors,
	}
}

// counters are a lane's Counters; every field is atomic.
type counters struct {
	received, forwarded, droppedLoss, droppedDown, delayed, reordered,
	queueFull, readErrors, writeErrors atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		Received: c.received.Load(), Forwarded: c.forwarded.Load(),
		DroppedLoss: c.droppedLoss.Load(), DroppedDown: c.droppedDown.Load(),
		Delayed: c.delayed.Load(), Reordered: c.reordered.Load(),
		QueueFull: c.queueFull.Load(), ReadErrors: c.readErrors.Load(),
		WriteErrors: c.writeErrors.Load(),
	}
}
