package sched

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Config configures a Pool.
type Config struct {
	// Workers is the number of engine workers; 0 means
	// runtime.GOMAXPROCS(0), the CPUs the process may use.
	Workers int
	// CPUs, when set, pins worker i to CPUs[i%len(CPUs)] (each worker
	// locks its OS thread and sets the thread's affinity).
	CPUs []int
	// Quantum is the engine time (Budget.Bytes) a visit of a task of
	// weight 1 may spend before the next busy task's turn; 0 means
	// DefaultQuantum.
	Quantum int64
	// Ops bounds the work requests of one visit (times the weight, up to
	// 64×); 0 means DefaultOps.
	Ops int
	// Spin is how long a worker that found no task keeps looking before it
	// parks; 0 means DefaultSpin, a negative value not at all.
	Spin time.Duration
}

// Defaults of Config.
const (
	DefaultQuantum = 2 << 20
	DefaultOps     = 64
	DefaultSpin    = 20 * time.Microsecond
	// MaxWorkers bounds Config.Workers.
	MaxWorkers = 1024
)

// yieldEvery bounds how long a worker runs visits back to back before it
// lets the Go scheduler run someone else (a kick's goroutine, the control
// API): the runtime preempts a goroutine that never blocks only after
// 10 ms.
const yieldEvery = time.Millisecond

// ErrClosed is returned by NewTask on a closed pool.
var ErrClosed = errors.New("sched: pool closed")

// Pool is a bounded set of workers serving tasks in round robin.
type Pool struct {
	cfg Config

	mu       sync.Mutex
	cond     sync.Cond
	runq     []*Task // protected by mu; a FIFO ring of queued tasks
	head     int     // protected by mu
	n        int     // protected by mu
	parked   int     // protected by mu; workers waiting on cond
	closed   bool    // protected by mu
	queued   atomic.Int64
	spinning atomic.Int32 // workers spinning in pop (at most one)
	closing  atomic.Bool  // = closed, for workers between visits
	inline   atomic.Bool  // a Kick runs a task's turns itself
	tasks    atomic.Int64
	visits   atomic.Uint64
	skipped  atomic.Uint64
	wg       sync.WaitGroup
	pinErr   chan error
}

// New starts a pool of workers.
func New(cfg Config) (*Pool, error) {
	if cfg.Workers == 0 {
		cfg.Workers = runtime.GOMAXPROCS(0)
	}
	if cfg.Workers < 1 || cfg.Workers > MaxWorkers {
		return nil, fmt.Errorf("sched: %d workers out of range [1, %d]", cfg.Workers, MaxWorkers)
	}
	if cfg.Quantum == 0 {
		cfg.Quantum = DefaultQuantum
	}
	if cfg.Ops == 0 {
		cfg.Ops = DefaultOps
	}
	if cfg.Quantum < 0 || cfg.Ops < 0 {
		return nil, errors.New("sched: negative quantum")
	}
	if cfg.Spin == 0 {
		cfg.Spin = DefaultSpin
	}
	for _, c := range cfg.CPUs {
		if c < 0 || c >= maxCPU {
			return nil, fmt.Errorf("sched: CPU %d out of range", c)
		}
	}
	cfg.CPUs = append([]int(nil), cfg.CPUs...)
	p := &Pool{cfg: cfg, runq: make([]*Task, 64), pinErr: make(chan error, cfg.Workers)}
	p.cond.L = &p.mu
	p.wg.Add(cfg.Workers)
	for i := range cfg.Workers {
		go p.worker(i)
	}
	if len(cfg.CPUs) > 0 {
		// Each pinned worker reports whether its affinity took.
		var errs []error
		for range cfg.Workers {
			if err := <-p.pinErr; err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// maxCPU bounds a CPU number: unix.CPUSet holds 1024.
const maxCPU = 1024

var (
	defaultOnce sync.Once
	defaultPool *Pool
)

// Default returns the process-wide pool (GOMAXPROCS workers), started on
// first use; it is never closed.
func Default() *Pool {
	defaultOnce.Do(func() {
		p, err := New(Config{})
		if err != nil {
			panic(err) // New(Config{}) fails only on a broken runtime
		}
		defaultPool = p
	})
	return defaultPool
}

// Workers is the number of workers.
func (p *Pool) Workers() int { return p.cfg.Workers }

// Stats are a pool's counters.
type Stats struct {
	Workers int
	Tasks   int64  // tasks not stopped
	Queued  int64  // tasks waiting for a worker now
	Visits  uint64 // visits run
	Skipped uint64 // turns passed over because the task had spent its share
}

// Stats returns the pool's counters.
func (p *Pool) Stats() Stats {
	return Stats{Workers: p.cfg.Workers, Tasks: p.tasks.Load(), Queued: p.queued.Load(),
		Visits: p.visits.Load(), Skipped: p.skipped.Load()}
}

// Close stops the workers once they finish their visits; tasks still
// registered are never run again. Close waits for the workers.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	p.closing.Store(true)
	p.cond.Broadcast()
	p.mu.Unlock()
	p.wg.Wait()
}

// push appends t to the run queue. Precondition: t's state was set to
// queued by the caller.
func (p *Pool) push(t *Task) {
	p.mu.Lock()
	if p.n == len(p.runq) {
		// Grow: at most one entry per task (a task is queued once).
		nq := make([]*Task, 2*len(p.runq))
		for i := range p.n {
			nq[i] = p.runq[(p.head+i)%len(p.runq)]
		}
		p.runq, p.head = nq, 0
	}
	p.runq[(p.head+p.n)%len(p.runq)] = t
	p.n++
	p.queued.Store(int64(p.n))
	if p.parked > 0 {
		p.cond.Signal()
	}
	p.mu.Unlock()
}

// pop takes the next task, waiting for one; nil when the pool is closed.
func (p *Pool) pop() *Task {
	if p.cfg.Spin > 0 && p.queued.Load() == 0 && p.spinning.CompareAndSwap(0, 1) {
		// Look for a while before parking: a wake-up costs the next
		// task's latency more than the spin costs the idle core. One
		// worker spins at a time (as the Go runtime's Ps do): more would
		// only take processors from the rest of the process.
		for end := time.Now().Add(p.cfg.Spin); p.queued.Load() == 0 && time.Now().Before(end); {
			runtime.Gosched()
		}
		p.spinning.Store(0)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.n == 0 {
		if p.closed {
			return nil
		}
		p.parked++
		p.cond.Wait()
		p.parked--
	}
	if p.closed {
		return nil
	}
	t := p.runq[p.head]
	p.runq[p.head] = nil
	p.head = (p.head + 1) % len(p.runq)
	p.n--
	p.queued.Store(int64(p.n))
	return t
}

// others reports whether tasks wait besides the one being visited.
func (p *Pool) others() bool { return p.queued.Load() > 0 }

func (p *Pool) worker(i int) {
	defer p.wg.Done()
	if len(p.cfg.CPUs) > 0 {
		runtime.LockOSThread()
		cpu := p.cfg.CPUs[i%len(p.cfg.CPUs)]
		var set unix.CPUSet
		set.Set(cpu)
		err := unix.SchedSetaffinity(0, &set)
		if err != nil {
			err = fmt.Errorf("sched: pin worker %d to CPU %d: %w", i, cpu, err)
		}
		p.pinErr <- err
		if err != nil {
			return
		}
	}
	ran := time.Now()
	for {
		t := p.pop()
		if t == nil {
			return
		}
		p.turns(t, &ran)
	}
}

// turns visits t until it wants no more, or requeues it when another task
// waits. A task that wants more is visited again at once while no other
// waits: handing it to the run queue would wake a parked worker to take
// it, and the two would pass it back and forth. *ran is when the caller
// last let the Go scheduler run someone else. Precondition: t was popped
// (state queued).
func (p *Pool) turns(t *Task, ran *time.Time) {
	for {
		more, worked := p.visit(t)
		if !worked || time.Since(*ran) > yieldEvery {
			runtime.Gosched()
			*ran = time.Now()
		}
		if !more {
			return
		}
		if p.others() || p.isClosed() {
			p.requeue(t)
			return
		}
	}
}

// isClosed reports whether Close was called.
func (p *Pool) isClosed() bool { return p.closing.Load() }
