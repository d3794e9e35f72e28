package rdma

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/backend/rdma/sched"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The doorbell queues: each wakes the engine for the QPs bound to it
// (docs/spec.md, § Doorbell queues and the data path). A doorbell queue is
// a task of the daemon's engine pool (package sched): the queue's kick
// only wakes the task, and whichever pool worker takes it polls the
// queue's QPs within the budget the pool grants, while there is work and
// for a short spin after; then it publishes that it sleeps (used flags)
// and looks once more before the task goes idle until the next kick.

// doorbell is one doorbell queue of an attached device.
type doorbell struct {
	d    *Device
	dbq  int
	q    *backend.Queue // immutable while attached
	task *sched.Task

	// visitMu is held for a whole visit: Quiesce takes it to wait out
	// the visit in progress. missed: a visit found the device quiesced
	// (a kick or wake to serve at Unquiesce).
	visitMu sync.Mutex
	missed  atomic.Bool

	// Owned by the visiting worker (the pool visits a task with one
	// worker at a time).
	sw      spinWindow
	window  time.Duration // this wake-up's spin window
	last    time.Time     // last work found in this wake-up; zero: none yet
	idle    bool          // a look since the last work found nothing
	polling bool          // the used flags say the engine polls
}

// startDoorbells creates the doorbell queues' tasks. Precondition: d.mu
// held, attaching to h.
func (d *Device) startDoorbells(h backend.Host) error {
	d.doorbells = make([]*doorbell, d.cfg.DoorbellQueues)
	for i := range d.doorbells {
		q := h.Queue(abi.FirstDoorbellQueue + i)
		if q == nil {
			return fmt.Errorf("doorbell queue %d missing", i)
		}
		db := &doorbell{d: d, dbq: i, q: q}
		db.sw.window = d.cfg.Spin
		t, err := d.pool.NewTask(db.visit)
		if err != nil {
			return err
		}
		t.SetWeight(d.Share().weight())
		db.task = t
		d.doorbells[i] = db
	}
	return nil
}

// stopDoorbells stops the tasks and waits out visits in progress.
// Precondition: d.mu held.
func (d *Device) stopDoorbells() {
	for _, db := range d.doorbells {
		if db != nil && db.task != nil {
			db.task.Stop()
		}
	}
	d.doorbells = nil
}

// Kicked implements backend.KickReceiver: a doorbell queue's kick wakes
// its task.
func (d *Device) Kicked(q *backend.Queue) bool {
	dbq := q.Index() - abi.FirstDoorbellQueue
	if dbq < 0 {
		return false
	}
	dbs := d.doorbellsp.Load()
	if dbs != nil && dbq < len(*dbs) {
		(*dbs)[dbq].task.Kick() // may run the queue's turns here
	}
	return true
}

// wakeDoorbell wakes doorbell queue dbq's task (a kick, an RNR retry, a
// peer's state change).
func (d *Device) wakeDoorbell(dbq int) {
	dbs := d.doorbellsp.Load()
	if dbs == nil || dbq < 0 || dbq >= len(*dbs) {
		return
	}
	(*dbs)[dbq].task.Wake()
}

// visit is one turn of the queue's task: it polls the queue's QPs within
// b and decides whether the task wants another turn (work found, or
// spinning for the driver's next post) or sleeps.
func (db *doorbell) visit(b *sched.Budget) sched.Next {
	db.visitMu.Lock()
	defer db.visitMu.Unlock()
	if db.d.quiesced.Load() {
		db.missed.Store(true)
		return sched.Next{}
	}
	if db.d.eng.MigratedOut() {
		// Its QPs' numbers and peers are the destination's: its engine
		// runs no more (identity.go).
		return sched.Next{}
	}
	var next sched.Next
	err := db.q.Run(func(q *backend.Queue) error {
		next = db.poll(q, b)
		return nil
	})
	if err != nil {
		// Stopped or broken: the ring's restart kicks the queue again.
		db.polling = false
		return sched.Next{}
	}
	return next
}

// poll is visit with the queue locked and its memory held.
func (db *doorbell) poll(q *backend.Queue, b *sched.Budget) sched.Next {
	d := db.d
	if q.Stopping() {
		db.polling = false // a restarted ring starts with the flags clear
		return sched.Next{}
	}
	if !db.polling {
		// A wake-up: the spin follows work only, so a kick that finds
		// none (a driver posting receives, which the peer's requester
		// consumes; a timer) goes back to sleep at once instead of taking
		// a worker for the window.
		q.SetPolling(true)
		db.polling = true
		db.window = db.sw.start(d.cfg.Spin)
		db.last, db.idle = time.Time{}, false
	}
	if at, ok := d.rate.allow(b, d.Share()); !ok {
		return sched.Next{At: at} // the used flags stay set: nobody kicks
	}
	t := q.Memory()
	eb := engine.Budget{Bytes: b.Bytes, Ops: b.Ops, OpCost: sched.OpCost}
	// RNR deadlines are the engine's own timers' (they wake the task).
	worked, _ := d.eng.PollBudget(db.dbq, t, &eb)
	d.rate.charge(int64(min(eb.Moved, 1<<62)), b.Ops-eb.Ops, d.Share())
	b.Bytes, b.Ops = eb.Bytes, eb.Ops
	if worked {
		if db.idle && !db.last.IsZero() {
			db.window = db.sw.hit(d.cfg.Spin) // the spin found the next post
		}
		db.idle = false
		db.last = time.Now()
		return sched.Next{More: true}
	}
	db.idle = true
	if !db.last.IsZero() && time.Since(db.last) < db.window {
		return sched.Next{More: true} // spin: the pool visits others meanwhile
	}
	if !db.last.IsZero() && db.window > 0 {
		db.window = db.sw.miss()
	}
	q.SetPolling(false)
	db.polling = false
	abi.Fence()
	eb = engine.Budget{Bytes: max(b.Bytes, 1), Ops: max(b.Ops, 1), OpCost: sched.OpCost}
	if worked, _ := d.eng.PollBudget(db.dbq, t, &eb); worked {
		q.SetPolling(true)
		db.polling = true
		db.last, db.idle = time.Now(), false
		return sched.Next{More: true}
	}
	return sched.Next{}
}

// spinWindow is how long a doorbell queue's engine spins after work, and
// how that adapts to whether spinning pays. Spinning pays when the driver
// posts again within the window: it saves the driver a kick and the engine
// a wake-up. It costs a core, and when that is the core the driver's vCPU
// needs (two busy-polling vCPUs and the engine on two host cores), the
// driver's next post comes only after the spin ends: every spin is then
// added to the latency and saves nothing. So a window that expires without
// work missesToShrink times in a row halves, down to zero below
// minSpinWindow; work found during a window restores the full Spin; at
// zero, every probeEvery-th wake-up spins the full Spin once to find out
// whether spinning pays again (a probe that misses goes back to zero).
// Like KVM's adaptive halt-polling (halt_poll_ns grow/shrink), in user
// space, where single_task_running() is not available.
type spinWindow struct {
	window time.Duration // current window; 0: no spin
	misses int           // windows expired without work in a row
	wakes  int           // wake-ups at window 0, for probing
}

const (
	missesToShrink = 4
	probeEvery     = 32
	minSpinWindow  = 2 * time.Microsecond
)

// start returns the window for a wake-up of the engine.
func (w *spinWindow) start(max time.Duration) time.Duration {
	if w.window > 0 {
		return w.window
	}
	w.wakes++
	if w.wakes%probeEvery == 0 {
		return max
	}
	return 0
}

// hit records work found during a window and returns the new window.
func (w *spinWindow) hit(max time.Duration) time.Duration {
	w.misses = 0
	w.window = max
	return w.window
}

// miss records a window that expired without work and returns the new
// window.
func (w *spinWindow) miss() time.Duration {
	if w.window == 0 { // a probe
		return 0
	}
	w.misses++
	if w.misses >= missesToShrink {
		w.misses = 0
		w.window /= 2
		if w.window < minSpinWindow {
			w.window = 0
		}
	}
	return w.window
}
