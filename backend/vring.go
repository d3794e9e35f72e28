package backend

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
)

// ErrQueueStopped is returned by Queue.Run when the ring is not running.
var ErrQueueStopped = errors.New("queue not running")

// vring is the session's state for one ring. Its configuration fields are
// written only by the session goroutine, and only while no worker runs
// (the worker is started by start and joined by stop), so the worker reads
// them without a lock.
type vring struct {
	s *session // immutable
	q *Queue   // immutable

	// Configuration (session goroutine; read by the worker while it runs,
	// see above).
	num      uint16
	desc     memmap.UVA
	avail    memmap.UVA
	used     memmap.UVA
	addrSet  bool
	base     uint16                          // next avail index, from SET_VRING_BASE / GET_VRING_BASE
	ours     bool                            // base is what this session's GET_VRING_BASE returned
	kick     *eventfd.EventFD                // replaced only while stopped
	wakeFd   atomic.Pointer[eventfd.EventFD] // atomic; = kick while started, for Wake from any goroutine
	call     *eventfd.EventFD                // protected by q.mu (written by the session, read by workers)
	errfd    *eventfd.EventFD                // protected by q.mu
	started  bool                            // session goroutine
	paused   bool                            // session goroutine; started, its worker stopped by pause (handover.go)
	adoptErr error                           // session goroutine; why Adopt could not make the device queue (adopt.go)
	enabled  atomic.Bool                     // atomic
	logUsed  bool                            // protected by q.mu: VHOST_VRING_F_LOG, log used-ring writes
	logAddr  uint64                          // protected by q.mu: log_guest_addr, where the used ring is logged
	brokenAt atomic.Pointer[error]           // atomic; the error that broke the ring, until it is set up again

	stopping atomic.Bool     // atomic; set by stop and read by the worker and handlers (Queue.Stopping)
	done     chan struct{}   // session goroutine; closed when the worker exits; nil when none runs
	gen      uint64          // memory generation the rings were translated for: set by start, then protected by q.mu
	wg       *sync.WaitGroup // immutable; the session's count of running workers
}

// ready reports whether the ring has what it needs to start.
func (r *vring) ready() bool { return r.num != 0 && r.addrSet && r.kick != nil }

// start creates the device queue and the worker. Precondition: session
// goroutine, ring not started.
func (r *vring) start() {
	r.started = true
	r.brokenAt.Store(nil)
	r.stopping.Store(false)
	r.kick.Rearm()
	cfg := virtio.DeviceQueueConfig{
		Index:     r.q.index,
		Size:      r.num,
		EventIdx:  r.s.features&virtio.FeatureEventIdx != 0,
		Indirect:  r.s.features&virtio.FeatureIndirectDesc != 0,
		LastAvail: r.base,
	}
	t := r.s.mem.Acquire()
	rings, err := r.translate(t)
	var vq *virtio.DeviceQueue
	if err == nil {
		// NewDeviceQueue reads the used index: guest memory, which the
		// front-end may have truncated under us (SIGBUS, contained).
		if gerr := memmap.Guard(func() { vq, err = virtio.NewDeviceQueue(cfg, rings) }); gerr != nil {
			vq, err = nil, gerr
		}
	}
	r.gen = r.s.mem.Generation()
	t.Release()
	r.q.mu.Lock()
	r.q.vq = vq
	r.wakeFd.Store(r.kick)
	r.q.mu.Unlock()
	if err != nil {
		r.breakRing(fmt.Errorf("start ring: %w", err))
	}
	r.done = make(chan struct{})
	r.wg.Add(1)
	go r.worker(r.done)
	// Buffers may already be waiting (a restart after GET_VRING_BASE).
	r.kick.Signal()
}

// wake signals the kick eventfd, as the driver would.
func (r *vring) wake() {
	if k := r.wakeFd.Load(); k != nil {
		k.Signal() // after a concurrent stop this fails harmlessly (closed file)
	}
}

// stop stops the worker and returns the next avail index. Precondition:
// session goroutine.
func (r *vring) stop() uint16 {
	if !r.started {
		return r.base
	}
	if !r.paused {
		r.halt()
	}
	r.paused = false
	r.started = false
	r.q.mu.Lock()
	if r.q.vq != nil {
		r.base = r.q.vq.LastAvail()
		r.ours = true
		r.q.vq = nil
	}
	r.wakeFd.Store(nil)
	r.q.mu.Unlock()
	return r.base
}

// halt stops the worker and joins it; the device queue stays. Kicks that
// arrive from now on stay in the kick eventfd. Precondition: session
// goroutine, ring started and its worker running.
func (r *vring) halt() {
	r.stopping.Store(true)
	r.kick.Interrupt()
	<-r.done
	r.done = nil
}

// pause stops a started ring's worker without stopping the ring: its
// device queue, indices and broken state stay as they are, and Queue.Run
// returns ErrQueueStopped until resume. Precondition: session goroutine.
func (r *vring) pause() {
	if !r.started || r.paused {
		return
	}
	r.halt()
	r.paused = true
}

// resume starts the worker of a paused ring again; it looks at the ring
// once, as after a kick. Precondition: session goroutine.
func (r *vring) resume() {
	if !r.paused {
		return
	}
	r.paused = false
	r.stopping.Store(false)
	r.kick.Rearm()
	r.done = make(chan struct{})
	r.wg.Add(1)
	go r.worker(r.done)
	r.kick.Signal()
}

// translate maps the three ring parts through the memory table.
func (r *vring) translate(t *memmap.Table) (virtio.Rings, error) {
	var rings virtio.Rings
	var err error
	if rings.Desc, err = t.SliceUser(r.desc, virtio.DescTableSize(r.num)); err != nil {
		return rings, fmt.Errorf("descriptor table: %w", err)
	}
	if rings.Avail, err = t.SliceUser(r.avail, virtio.AvailRingSize(r.num)); err != nil {
		return rings, fmt.Errorf("available ring: %w", err)
	}
	if rings.Used, err = t.SliceUser(r.used, virtio.UsedRingSize(r.num)); err != nil {
		return rings, fmt.Errorf("used ring: %w", err)
	}
	return rings, nil
}

// breakRing puts the ring in the broken state (precondition: q.mu held, or
// the session goroutine): no more processing until the
// front-end sets it up again. The front-end hears of it through the error
// eventfd; the daemon and every other ring go on.
func (r *vring) breakRing(err error) {
	if !r.brokenAt.CompareAndSwap(nil, &err) {
		return
	}
	r.s.stats.ringErrors.Add(1)
	r.s.log.WithField("queue", r.q.index).WithError(err).Warn("ring broken")
	if r.errfd != nil {
		r.errfd.Signal()
	}
}

func (r *vring) broken() error {
	if p := r.brokenAt.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *vring) worker(done chan struct{}) {
	defer r.wg.Done()
	defer close(done)
	for {
		if _, err := r.kick.Wait(); err != nil {
			if !errors.Is(err, eventfd.ErrInterrupted) {
				r.q.mu.Lock()
				r.breakRing(fmt.Errorf("kick: %w", err))
				r.q.mu.Unlock()
			}
			return
		}
		if r.stopping.Load() {
			return
		}
		if !r.enabled.Load() || r.broken() != nil {
			continue
		}
		if kr, ok := r.s.dev.(KickReceiver); ok && kr.Kicked(r.q) {
			continue
		}
		r.process()
	}
}

// process handles the ring until the driver has nothing more for it,
// re-enabling notifications before it sleeps. It goes round again when the
// driver published buffers after the round began: they may have arrived
// after the handler looked, while kicks were suppressed. A queue whose
// buffers the device keeps posted (the event queue) is therefore not spun
// on: its index does not move by itself.
func (r *vring) process() {
	for {
		again := false
		err := r.run(func(q *Queue) error {
			q.vq.DisableNotify()
			start := q.vq.AvailIdx()
			if err := r.s.dev.HandleQueue(q); err != nil {
				return err
			}
			q.vq.EnableNotify() // a full barrier: the reading below is fresh
			again = q.vq.AvailIdx() != start
			return q.vq.Err()
		})
		if err != nil || !again || r.stopping.Load() {
			return
		}
	}
}

// run is Queue.Run: fn with the queue locked and a memory table held.
func (r *vring) run(fn func(q *Queue) error) error {
	q := r.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.vq == nil || r.stopping.Load() {
		return ErrQueueStopped
	}
	if err := r.broken(); err != nil {
		return err
	}
	t := r.s.mem.Acquire()
	defer t.Release()
	if gen := r.s.mem.Generation(); gen != r.gen {
		// The memory table changed: the ring addresses are front-end
		// virtual addresses and must be translated again.
		rings, err := r.translate(t)
		if err == nil {
			err = q.vq.SetRings(rings)
		}
		if err != nil {
			err = fmt.Errorf("remap ring: %w", err)
			r.breakRing(err)
			return err
		}
		r.gen = gen
	}
	q.table = t
	q.dirty = false
	q.vq.SetUsedLog(r) // LogUsed: the used ring's stores are marked at its log address
	var ferr error
	gerr := memmap.Guard(func() { ferr = fn(q) })
	q.table = nil
	if gerr != nil {
		ferr = gerr
	}
	if ferr == nil {
		ferr = q.vq.Err()
	}
	r.notify()
	if ferr != nil {
		r.breakRing(ferr)
	}
	return ferr
}

// notify signals the call eventfd if chains were pushed since the last
// notification and the driver wants an interrupt. Precondition: q.mu held.
func (r *vring) notify() {
	q := r.q
	if !q.dirty {
		return
	}
	q.dirty = false
	if q.vq.NeedsNotify() && r.call != nil {
		r.s.stats.interrupts.Add(1)
		r.call.Signal()
	}
}

// closeFds closes the ring's eventfds. Precondition: stopped.
func (r *vring) closeFds() {
	r.kick.Close()
	r.call.Close()
	r.errfd.Close()
	r.kick, r.call, r.errfd = nil, nil, nil
}

// reset returns the ring to its initial state. Precondition: stopped.
func (r *vring) reset() {
	r.closeFds()
	r.num, r.desc, r.avail, r.used, r.addrSet, r.base, r.ours = 0, 0, 0, 0, false, 0, false
	r.q.mu.Lock()
	r.logUsed, r.logAddr = false, 0
	r.q.mu.Unlock()
	r.enabled.Store(false)
	r.brokenAt.Store(nil)
}
