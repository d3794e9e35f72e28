package impair

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
)

// Defaults for the zero values of Config.
const (
	DefaultQueueLen       = 512
	DefaultMTU            = 1500
	DefaultReorderTimeout = 100 * time.Millisecond
)

const (
	// MaxQueueLen bounds Config.QueueLen.
	MaxQueueLen = 1 << 16
	// MaxPaths bounds the number of paths of a Hop.
	MaxPaths = 64
	// maxHeld bounds the packets one direction holds back for reordering
	// (also at most QueueLen/2, so reordering never starves the queue).
	maxHeld = 64
	// batch is how many queued packets the scheduler takes before it
	// looks at its timer again.
	batch = 64
	// errorPause is how long a reader waits after a read error that is
	// not the device closing, so a broken device cannot spin a core.
	errorPause = 10 * time.Millisecond
)

// Device is one end of a path as the hop sees it: Read returns one whole
// IP packet (blocking until there is one), Write takes one whole packet,
// Close makes a blocked Read return. A packet read from a Device is written
// back to the same Device, whose other side routes it on by its
// destination (netlab.MultiPath.Divert's TUNs do). An *os.File of a TUN
// device is a Device.
type Device interface {
	io.Reader
	io.Writer
	io.Closer
}

// Port is one path: the devices that yield what A sent and what B sent.
type Port struct {
	FromA, FromB Device
}

// Config configures a Hop.
type Config struct {
	// Seed seeds the random choices (loss, jitter, reordering); each
	// direction of each path draws from its own generator, seeded from
	// Seed, the path and the direction, so a run with the same packets
	// in the same order makes the same choices.
	Seed uint64
	// QueueLen is the number of packet buffers of each direction of each
	// path (0: DefaultQueueLen; at most MaxQueueLen): every packet the hop
	// holds (queued, delayed, held back) takes one. A packet read when
	// none is free is dropped and counted as QueueFull.
	QueueLen int
	// MTU is the size of a buffer (0: DefaultMTU, 1280..65535); it must
	// be at least the devices' MTU (Interpose sets the TUNs' MTU to it).
	MTU int
	// ReorderTimeout is how long a held-back packet waits at most for the
	// later packets it is to follow (0: DefaultReorderTimeout).
	ReorderTimeout time.Duration
	// Logger gets rate-limited warnings about device errors; nil
	// discards.
	Logger *logrus.Entry
}

// Hop forwards the packets of its paths' devices, each direction of each
// path impaired by its own Rule. Memory is bounded by
// paths × 2 × (QueueLen+1) × MTU bytes; goroutines by paths × 4.
type Hop struct {
	cfg   Config        // immutable, defaults filled in
	log   *logrus.Entry // immutable
	lanes []*lane       // immutable; lanes[2*path+int(dir)]

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error // written once in closeOnce
}

// packet is a buffer from a lane's free list and the length read into it.
type packet struct {
	buf []byte
	n   int
}

// timed is a packet in the delay line with the time it may leave.
type timed struct {
	packet
	due time.Time
}

// held is a packet held back for reordering.
type held struct {
	packet
	left     int       // later packets still to pass before it
	deadline time.Time // it goes at this time regardless
}

// lane is one direction of one path: a reader goroutine that moves packets
// from dev to in, and a scheduler goroutine that impairs them and writes
// them back to dev.
type lane struct {
	path int    // immutable
	dir  Dir    // immutable
	dev  Device // immutable; Read by the reader, Write by the scheduler

	rule atomic.Pointer[Rule] // never nil
	ctr  counters             // atomic

	// free holds the buffers not in use; with in, it has capacity
	// QueueLen, and a buffer is in exactly one of free, in, the reader,
	// or the scheduler (fifo, holding, or being handled), so neither
	// channel's send ever blocks.
	free chan []byte
	in   chan packet

	// Owned by the scheduler goroutine.
	rng      *rand.Rand
	fifo     []timed // ring of capacity QueueLen
	head     int     // index of fifo's oldest entry
	count    int     // entries in fifo
	holding  []held  // in arrival order, so deadlines are non-decreasing
	maxHeld  int
	lastDue  time.Time // due time of the last packet put in fifo
	lastTx   time.Time // when the last packet's transmission ends (RateBps)
	errShown uint64    // device errors logged so far (powers of two)
}

// New starts a hop over paths (1..MaxPaths of them). The Hop owns the
// devices from then on and closes them in Close; if New fails it has not
// touched them.
func New(cfg Config, paths []Port) (*Hop, error) {
	if cfg.QueueLen == 0 {
		cfg.QueueLen = DefaultQueueLen
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.ReorderTimeout == 0 {
		cfg.ReorderTimeout = DefaultReorderTimeout
	}
	switch {
	case cfg.QueueLen < 1 || cfg.QueueLen > MaxQueueLen:
		return nil, fmt.Errorf("%w: QueueLen %d not in [1, %d]", ErrConfig, cfg.QueueLen, MaxQueueLen)
	case cfg.MTU < 1280 || cfg.MTU > 65535:
		return nil, fmt.Errorf("%w: MTU %d not in [1280, 65535]", ErrConfig, cfg.MTU)
	case cfg.ReorderTimeout < 0 || cfg.ReorderTimeout > MaxDelay:
		return nil, fmt.Errorf("%w: ReorderTimeout %v not in (0, %v]", ErrConfig, cfg.ReorderTimeout, MaxDelay)
	case len(paths) < 1 || len(paths) > MaxPaths:
		return nil, fmt.Errorf("%w: %d paths (want 1..%d)", ErrConfig, len(paths), MaxPaths)
	}
	for i, p := range paths {
		if p.FromA == nil || p.FromB == nil {
			return nil, fmt.Errorf("%w: path %d has a nil device", ErrConfig, i)
		}
	}
	log := cfg.Logger
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = logrus.NewEntry(l)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Hop{cfg: cfg, log: log, ctx: ctx, cancel: cancel}
	for i, p := range paths {
		for _, d := range []struct {
			dir Dir
			dev Device
		}{{AtoB, p.FromA}, {BtoA, p.FromB}} {
			h.lanes = append(h.lanes, h.newLane(i, d.dir, d.dev))
		}
	}
	for _, ln := range h.lanes {
		h.wg.Add(2)
		go h.read(ln)
		go h.schedule(ln)
	}
	return h, nil
}

func (h *Hop) newLane(path int, dir Dir, dev Device) *lane {
	q := h.cfg.QueueLen
	ln := &lane{
		path: path, dir: dir, dev: dev,
		free: make(chan []byte, q),
		in:   make(chan packet, q),
		// PCG's two words: the seed, and the lane's number, so no two
		// lanes share a stream.
		rng:     rand.New(rand.NewPCG(h.cfg.Seed, uint64(2*path+int(dir)))),
		fifo:    make([]timed, q),
		maxHeld: min(maxHeld, q/2),
	}
	ln.rule.Store(&Rule{})
	for range q {
		ln.free <- make([]byte, h.cfg.MTU)
	}
	return ln
}

// Paths returns the number of paths.
func (h *Hop) Paths() int { return len(h.lanes) / 2 }

func (h *Hop) lane(path int, d Dir) (*lane, error) {
	if path < 0 || path >= h.Paths() || (d != AtoB && d != BtoA) {
		return nil, fmt.Errorf("%w: path %d %v of %d", ErrPath, path, d, h.Paths())
	}
	return h.lanes[2*path+int(d)], nil
}

// SetRule sets the rule of both directions of path. It takes effect for
// the next packet each direction handles (a Down also for the packets
// already queued).
func (h *Hop) SetRule(path int, r Rule) error {
	if err := h.SetRuleDir(path, AtoB, r); err != nil {
		return err
	}
	return h.SetRuleDir(path, BtoA, r)
}

// SetRuleDir sets the rule of one direction of path.
func (h *Hop) SetRuleDir(path int, d Dir, r Rule) error {
	if err := r.Validate(); err != nil {
		return err
	}
	ln, err := h.lane(path, d)
	if err != nil {
		return err
	}
	ln.rule.Store(&r)
	return nil
}

// Rule returns the rule of one direction of path (the zero Rule for a
// path that does not exist).
func (h *Hop) Rule(path int, d Dir) Rule {
	ln, err := h.lane(path, d)
	if err != nil {
		return Rule{}
	}
	return *ln.rule.Load()
}

// Counters returns the counters of path, both directions added.
func (h *Hop) Counters(path int) Counters {
	return h.CountersDir(path, AtoB).Add(h.CountersDir(path, BtoA))
}

// CountersDir returns the counters of one direction of path (zero for a
// path that does not exist).
func (h *Hop) CountersDir(path int, d Dir) Counters {
	ln, err := h.lane(path, d)
	if err != nil {
		return Counters{}
	}
	return ln.ctr.snapshot()
}

// Close stops the hop, closes its devices and waits for its goroutines;
// packets still queued are discarded (not counted). It is idempotent;
// later calls return the first result.
func (h *Hop) Close() error {
	h.closeOnce.Do(func() {
		h.cancel()
		var errs []error
		for _, ln := range h.lanes {
			if err := ln.dev.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
				errs = append(errs, fmt.Errorf("close path %d %v: %w", ln.path, ln.dir, err))
			}
		}
		h.wg.Wait()
		h.closeErr = errors.Join(errs...)
	})
	return h.closeErr
}

// closing reports whether err means the device is gone for good.
func (h *Hop) closing(err error) bool {
	return h.ctx.Err() != nil || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF)
}

// read is a lane's reader goroutine.
func (h *Hop) read(ln *lane) {
	defer h.wg.Done()
	scratch := make([]byte, h.cfg.MTU)
	for h.ctx.Err() == nil {
		var buf []byte
		select {
		case buf = <-ln.free:
		default:
		}
		dst := buf
		if dst == nil {
			dst = scratch
		}
		n, err := ln.dev.Read(dst)
		if err != nil {
			if buf != nil {
				ln.free <- buf
			}
			if h.closing(err) {
				return
			}
			ln.ctr.readErrors.Add(1)
			h.warn(ln, "read", err)
			select {
			case <-h.ctx.Done():
			case <-time.After(errorPause):
			}
			continue
		}
		ln.ctr.received.Add(1)
		if buf == nil {
			// None was free when the read began; one may be now.
			select {
			case buf = <-ln.free:
				copy(buf, scratch[:n])
			default:
				ln.ctr.queueFull.Add(1)
				continue
			}
		}
		ln.in <- packet{buf: buf, n: n} // never blocks: see lane.free
	}
}

// warn logs a device error when the lane's error count is a power of two.
func (h *Hop) warn(ln *lane, op string, err error) {
	c := ln.ctr.readErrors.Load() + ln.ctr.writeErrors.Load()
	if bits.OnesCount64(c) == 1 {
		h.log.WithFields(logrus.Fields{"path": ln.path, "dir": ln.dir.String(), "errors": c}).
			WithError(err).Warn("impair: device " + op)
	}
}

// schedule is a lane's scheduler goroutine: it owns the lane's rng, fifo
// and holding list.
func (h *Hop) schedule(ln *lane) {
	defer h.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case p := <-ln.in:
			h.handle(ln, p, time.Now())
		drain:
			for range batch - 1 {
				select {
				case p := <-ln.in:
					h.handle(ln, p, time.Now())
				default:
					break drain
				}
			}
		case <-timer.C:
		}
		now := time.Now()
		h.release(ln, now)
		// Go 1.23 timers: Reset and Stop leave no stale tick behind.
		if next, ok := ln.nextWake(); ok {
			timer.Reset(next.Sub(now))
		} else {
			timer.Stop()
		}
	}
}

// handle applies the lane's rule to a packet that just arrived.
func (h *Hop) handle(ln *lane, p packet, now time.Time) {
	r := ln.rule.Load()
	if r.Down {
		ln.drop(p, &ln.ctr.droppedDown)
		return
	}
	if r.Loss > 0 && ln.rng.Float64() < r.Loss {
		ln.drop(p, &ln.ctr.droppedLoss)
		return
	}
	if r.ReorderProb > 0 && len(ln.holding) < ln.maxHeld && ln.rng.Float64() < r.ReorderProb {
		after := max(r.ReorderAfter, 1)
		ln.holding = append(ln.holding, held{packet: p, left: after,
			deadline: now.Add(h.cfg.ReorderTimeout)})
		ln.ctr.reordered.Add(1)
		return
	}
	h.enqueue(ln, p, r, now)
	// A later packet passed each held one.
	for i := 0; i < len(ln.holding); {
		hp := &ln.holding[i]
		if hp.left--; hp.left > 0 {
			i++
			continue
		}
		p := hp.packet
		ln.holding = slices.Delete(ln.holding, i, i+1)
		h.enqueue(ln, p, r, now)
	}
}

// enqueue puts p into the delay line (or writes it at once when nothing
// makes it wait).
func (h *Hop) enqueue(ln *lane, p packet, r *Rule, now time.Time) {
	due := now
	if r.RateBps > 0 {
		start := now
		if ln.lastTx.After(start) {
			start = ln.lastTx
		}
		// n ≤ 65535, so n·8·1e9 < 2^63.
		ln.lastTx = start.Add(time.Duration(uint64(p.n) * 8 * uint64(time.Second) / r.RateBps))
		due = ln.lastTx
	}
	d := r.Delay
	if r.Jitter > 0 {
		d += time.Duration(ln.rng.Int64N(int64(r.Jitter) + 1))
	}
	due = due.Add(d)
	if due.Before(ln.lastDue) {
		due = ln.lastDue // no overtaking in the delay line
	}
	ln.lastDue = due
	if ln.count == 0 && !due.After(now) {
		h.send(ln, p)
		return
	}
	if due.After(now) {
		ln.ctr.delayed.Add(1)
	}
	// count < QueueLen: every entry holds one of the QueueLen buffers and
	// p holds another.
	ln.fifo[(ln.head+ln.count)%len(ln.fifo)] = timed{packet: p, due: due}
	ln.count++
}

// release lets go the held packets past their deadline and writes the
// packets whose time has come.
func (h *Hop) release(ln *lane, now time.Time) {
	for len(ln.holding) > 0 && !ln.holding[0].deadline.After(now) {
		p := ln.holding[0].packet
		ln.holding = slices.Delete(ln.holding, 0, 1)
		h.enqueue(ln, p, ln.rule.Load(), now)
	}
	for ln.count > 0 && !ln.fifo[ln.head].due.After(now) {
		p := ln.fifo[ln.head].packet
		ln.fifo[ln.head] = timed{}
		ln.head = (ln.head + 1) % len(ln.fifo)
		ln.count--
		h.send(ln, p)
	}
}

// nextWake returns when the scheduler has something to do next.
func (ln *lane) nextWake() (time.Time, bool) {
	var next time.Time
	ok := false
	if ln.count > 0 {
		next, ok = ln.fifo[ln.head].due, true
	}
	if len(ln.holding) > 0 {
		if d := ln.holding[0].deadline; !ok || d.Before(next) {
			next, ok = d, true
		}
	}
	return next, ok
}

// send writes p back to the device, unless the lane went down meanwhile.
func (h *Hop) send(ln *lane, p packet) {
	if ln.rule.Load().Down {
		ln.drop(p, &ln.ctr.droppedDown)
		return
	}
	if _, err := ln.dev.Write(p.buf[:p.n]); err != nil {
		ln.ctr.writeErrors.Add(1)
		if !h.closing(err) {
			h.warn(ln, "write", err)
		}
	} else {
		ln.ctr.forwarded.Add(1)
	}
	ln.free <- p.buf
}

func (ln *lane) drop(p packet, c *atomic.Uint64) {
	c.Add(1)
	ln.free <- p.buf
}
