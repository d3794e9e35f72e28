package sched

import (
	"sync"
	"sync/atomic"
	"time"
)

// Budget is what one visit of a task may do: spend Bytes of engine time,
// counted as payload bytes plus OpCost per work request, and execute at
// most Ops work requests. The task spends it as it works; a message larger
// than what is left may still run and take Bytes below zero, a debt that
// the task's next turns repay (deficit round robin).
type Budget struct {
	Bytes int64
	Ops   int
}

// OpCost is what a work request costs besides its payload, in bytes: about
// what the engine spends on a WQE (reading and checking it, the CQE, the
// indices) in the time it copies 1 KiB. Without it a tenant posting 64 B
// messages would get a sixty-fourth of the engine time of one posting
// 4 KiB ones for the same bytes.
const OpCost = 1024

// Spent reports whether b is used up.
func (b *Budget) Spent() bool { return b.Bytes <= 0 || b.Ops <= 0 }

// Charge takes one work request of n payload bytes from b.
func (b *Budget) Charge(n uint64) {
	b.Ops--
	b.Bytes -= int64(min(n, 1<<62)) + OpCost
}

// Next is what a task asks for after a visit.
type Next struct {
	// More: the task has work left (or is spinning on its driver's next
	// post) and wants another turn.
	More bool
	// At, when More is false and At is not zero, wakes the task at that
	// time (an RNR retry, a rate bound's refill) unless a Wake comes
	// first.
	At time.Time
}

// Task states.
const (
	idle    uint32 = iota // waiting for Wake
	queued                // in the run queue
	running               // being visited
	rewoken               // being visited, and woken meanwhile: visit again
)

// Task is one unit of work the pool visits in turn: a doorbell queue of a
// device. Its run function does a bounded amount of work within the
// budget it is given and says whether it wants another turn.
type Task struct {
	p      *Pool
	run    func(b *Budget) Next
	weight atomic.Int64 // quantum multiplier, ≥ 1

	state   atomic.Uint32
	stopped atomic.Bool
	runMu   sync.Mutex // held during a visit; Stop takes it to wait one out

	// Owned by the visiting worker (one at a time, under runMu).
	deficit int64

	timerMu sync.Mutex
	timer   *time.Timer // protected by timerMu
}

// NewTask registers a task that is visited after its first Wake. run is
// called by one worker at a time.
func (p *Pool) NewTask(run func(b *Budget) Next) (*Task, error) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	t := &Task{p: p, run: run}
	t.weight.Store(1)
	p.tasks.Add(1)
	return t, nil
}

// SetWeight sets the task's share of the workers while tasks compete:
// each turn grants it weight × the pool's quantum. Values below 1 mean 1.
func (t *Task) SetWeight(w int64) { t.weight.Store(max(w, 1)) }

// Wake makes the task visited soon. Safe from any goroutine, cheap when
// the task is already queued or running; a no-op after Stop.
func (t *Task) Wake() {
	for {
		switch s := t.state.Load(); s {
		case idle:
			if t.stopped.Load() {
				return
			}
			if t.state.CompareAndSwap(idle, queued) {
				t.p.push(t)
				return
			}
		case running:
			if t.state.CompareAndSwap(running, rewoken) {
				return
			}
		default: // queued, rewoken
			return
		}
	}
}

// Kick is Wake from the goroutine that received the task's notification
// (its kick eventfd). When nothing is queued, that goroutine runs the
// task's turns itself, until the task wants no more or another task
// waits, instead of handing it to a worker: the hand-off added a
// goroutine wake-up to every message of a lightly loaded daemon (perftest
// ib_write_lat between two TCG guests took 46 µs instead of 25). One
// caller at a time does so, so at most Workers+1 visits run at once. Kick
// must not be called with locks held that a task's run function takes.
func (t *Task) Kick() {
	p := t.p
	if p.queued.Load() == 0 && !t.stopped.Load() && p.inline.CompareAndSwap(false, true) {
		if t.state.CompareAndSwap(idle, queued) {
			ran := time.Now()
			p.turns(t, &ran)
			p.inline.Store(false)
			return
		}
		p.inline.Store(false)
	}
	t.Wake()
}

// Stop unregisters the task: it is not visited again, and Stop returns
// after a visit in progress ends. Stop must not be called from the task's
// own run function.
func (t *Task) Stop() {
	if t.stopped.Swap(true) {
		return
	}
	t.timerMu.Lock()
	if t.timer != nil {
		t.timer.Stop()
	}
	t.timerMu.Unlock()
	t.runMu.Lock()
	t.runMu.Unlock() //nolint:staticcheck // waits out a visit in progress
	t.p.tasks.Add(-1)
}

// wakeAt arms the task's timer.
func (t *Task) wakeAt(at time.Time) {
	d := time.Until(at)
	t.timerMu.Lock()
	defer t.timerMu.Unlock()
	if t.stopped.Load() {
		return
	}
	if t.timer == nil {
		t.timer = time.AfterFunc(d, t.Wake)
		return
	}
	t.timer.Reset(d)
}

// visit runs one turn of t. It reports whether the task wants another
// turn (it is then still marked running: the caller visits it again or
// requeues it) and whether the turn did work. Precondition: t was popped
// from the run queue or just visited by this worker.
func (p *Pool) visit(t *Task) (more, worked bool) {
	t.runMu.Lock()
	if t.stopped.Load() {
		t.state.Store(idle)
		t.runMu.Unlock()
		return false, false
	}
	t.state.Store(running) // a Wake since the last turn is this turn
	grant := p.cfg.Quantum * t.weight.Load()
	if t.deficit <= 0 {
		t.deficit += grant
	}
	if t.deficit <= 0 {
		if p.others() {
			// Still repaying a large message while others wait: pass.
			t.runMu.Unlock()
			p.skipped.Add(1)
			return true, false
		}
		t.deficit = grant // nobody else wants the workers
	}
	ops := p.cfg.Ops * int(min(t.weight.Load(), 64))
	b := Budget{Bytes: t.deficit, Ops: ops}
	next := t.run(&b)
	p.visits.Add(1)
	worked = b.Ops != ops
	if next.More {
		t.deficit = b.Bytes
		if !b.Spent() {
			// The turn ended before the grant did: the task ran out of
			// work, so it carries nothing over (deficit round robin).
			t.deficit = 0
		}
		t.runMu.Unlock()
		return true, worked
	}
	t.deficit = min(b.Bytes, 0) // an idle task keeps only its debt
	if !next.At.IsZero() {
		t.wakeAt(next.At)
	}
	if !t.state.CompareAndSwap(running, idle) {
		// Woken during the visit: another turn.
		t.runMu.Unlock()
		return true, worked
	}
	t.runMu.Unlock()
	return false, worked
}

// requeue puts a task that wants another turn at the back of the run
// queue.
func (p *Pool) requeue(t *Task) {
	t.state.Store(queued)
	p.push(t)
}
