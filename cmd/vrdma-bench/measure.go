package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// settings bound the run.
type settings struct {
	rowTime   time.Duration // one repeat of a time-boxed row
	repeats   int
	sizes     []uint64 // bandwidth message sizes
	guestMems []uint64 // start-up guest sizes
	regSize   uint64   // REG_MR cold/cached size
	pairs     []int    // scaling
	spin      bool     // clients never yield (--spin-clients)
	quick     bool     // --quick: fewer points where a section sweeps
}

// repeat runs f s.repeats times and returns the median of its results.
func (s settings) repeat(f func() (float64, error)) (float64, error) {
	var xs []float64
	for range s.repeats {
		x, err := f()
		if err != nil {
			return 0, err
		}
		xs = append(xs, x)
	}
	return median(xs), nil
}

// bwPoint is one size of the bandwidth sweep, in GB/s.
type bwPoint struct {
	size               uint64
	write, read, memcp float64
}

// bandwidth measures WRITE and READ between two devices against
// single-thread memcpy of the same sizes between the same buffers.
func bandwidth(s settings, p *pair) ([]bwPoint, error) {
	var pts []bwPoint
	for _, size := range s.sizes {
		p.setSize(size)
		pt := bwPoint{size: size}
		var err error
		for _, m := range []struct {
			op  int
			dst *float64
		}{{abi.WROpRDMAWrite, &pt.write}, {abi.WROpRDMARead, &pt.read}} {
			if *m.dst, err = s.repeat(func() (float64, error) {
				n, d, err := p.stream(m.op, s.rowTime)
				return float64(n) * float64(size) / d.Seconds() / 1e9, err
			}); err != nil {
				return nil, fmt.Errorf("%s bandwidth: %w", sizeName(size), err)
			}
		}
		pt.memcp, _ = s.repeat(func() (float64, error) {
			return memcpyBW(p.a.mr.Bytes(), p.b.mr.Bytes(), size, p.slots, s.rowTime), nil
		})
		pts = append(pts, pt)
	}
	return pts, nil
}

// memcpyBW copies size-byte messages from src slots to dst slots for d,
// one thread, and returns GB/s.
func memcpyBW(src, dst []byte, size uint64, slots int, d time.Duration) float64 {
	start := time.Now()
	var n uint64
	for i := 0; ; i++ {
		k := uint64(i%slots) * size
		copy(dst[k:k+size], src[k:k+size])
		n++
		if i&7 == 7 && time.Since(start) >= d {
			break
		}
	}
	return float64(n) * float64(size) / time.Since(start).Seconds() / 1e9
}

// handoff is the baseline for message rate and latency: the least any
// software queue between two cores costs. A consumer goroutine busy-polls
// a producer index, copies each 64-byte entry to a destination and
// publishes a completion index, which the producer polls, with inflight
// entries outstanding. It returns ops/s and, for inflight 1, the round
// trips.
func handoff(inflight int, d time.Duration, maxSamples int) (float64, []time.Duration) {
	const slots, size = 64, 64
	src, dst := make([]byte, slots*size), make([]byte, slots*size)
	var pi, ci atomic.Uint64
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var c uint64
		for spins := 0; !stop.Load(); spins++ {
			p := pi.Load()
			for ; c < p; c++ {
				k := (c % slots) * size
				copy(dst[k:k+size], src[k:k+size])
			}
			ci.Store(c)
			if spins&4095 == 4095 {
				runtime.Gosched()
			}
		}
	}()
	var lat []time.Duration
	start := time.Now()
	end := start.Add(d)
	var posted uint64
	for i := 0; ; i++ {
		if i&15 == 0 && !time.Now().Before(end) && (inflight > 1 || len(lat) >= 100) || len(lat) >= maxSamples && inflight == 1 {
			break
		}
		t0 := time.Now()
		for posted-ci.Load() >= uint64(inflight) {
		}
		posted++
		pi.Store(posted)
		if inflight == 1 {
			for ci.Load() < posted {
			}
			lat = append(lat, time.Since(t0))
		}
	}
	for ci.Load() < posted {
	}
	rate := float64(posted) / time.Since(start).Seconds()
	stop.Store(true)
	wg.Wait()
	return rate, lat
}

// msgRate measures 64 B WRITE and SEND operations per second.
func msgRate(s settings, p *pair, op int) (float64, error) {
	p.setSize(64)
	return s.repeat(func() (float64, error) {
		n, d, err := p.stream(op, s.rowTime)
		return float64(n) / d.Seconds(), err
	})
}

// latencies measures 64 B one-at-a-time latency and returns p50 and p99 in
// µs (medians over the repeats).
func latencies(s settings, p *pair, op int) (p50, p99 float64, err error) {
	p.setSize(64)
	var a, b []float64
	for range s.repeats {
		lat, err := p.latency(op, s.rowTime, 200000)
		if err != nil {
			return 0, 0, err
		}
		slices.Sort(lat)
		a = append(a, us(percentile(lat, 50)))
		b = append(b, us(percentile(lat, 99)))
	}
	return median(a), median(b), nil
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// regResult is the registration measurement in seconds.
type regResult struct {
	cold, cached, mlock float64
}

// registration measures REG_MR of s.regSize bytes cold, again from the map
// cache after DEREG_MR, and, as the baseline, mlock of the same bytes of
// guest memory in a mapping of their own.
//
// Cold is what a guest registers: a buffer it has written (the verbs
// library's allocator zeroes it), whose pages the daemon has never mapped,
// so the daemon faults every page into its own page tables and locks it.
// The baseline does exactly that work in this process: a new mapping of
// the front-end's memfd over the buffer, mlocked. It goes first because it
// munlocks and unmaps when done, leaving the pages as it found them: the
// first mlock of a page also moves it to the unevictable LRU list, which a
// second locker finds done, so the baseline after REG_MR (whose map cache
// keeps the pages locked) would be timed without that work. Both are
// page-fault bound and a shared machine's noise moves them by ±20 %, so the
// median is of at least regRepeats trials (a trial costs about a second).
func registration(s settings, r *rig) (regResult, error) {
	var cold, cached, ml []float64
	for range max(s.repeats, regRepeats) {
		sock, err := r.device()
		if err != nil {
			return regResult{}, err
		}
		c, f, err := dial(sock, s.regSize+memOverhead)
		if err != nil {
			return regResult{}, err
		}
		err = func() error {
			defer f.Close()
			defer c.Close()
			pd, err := c.AllocPD()
			if err != nil {
				return err
			}
			buf, err := c.AllocBuffer(int(s.regSize))
			if err != nil {
				return err
			}
			baseline := func() error {
				t, err := mlockTime(f, buf.Addr, s.regSize)
				ml = append(ml, t)
				return err
			}
			reg := func() error {
				t0 := time.Now()
				mr, err := pd.RegMR(buf, 0, int(s.regSize), abi.AccessLocalWrite)
				cold = append(cold, time.Since(t0).Seconds())
				if err != nil {
					return fmt.Errorf("cold reg mr: %w", err)
				}
				if err := mr.Dereg(); err != nil {
					return err
				}
				t0 = time.Now()
				mr, err = pd.RegMR(buf, 0, int(s.regSize), abi.AccessLocalWrite)
				cached = append(cached, time.Since(t0).Seconds())
				if err != nil {
					return fmt.Errorf("cached reg mr: %w", err)
				}
				return mr.Dereg()
			}
			if err := baseline(); err != nil {
				return err
			}
			return reg()
		}()
		if err != nil {
			return regResult{}, err
		}
	}
	return regResult{cold: median(cold), cached: median(cached), mlock: median(ml)}, nil
}

// regRepeats is the least number of registration trials.
const regRepeats = 7

// mlockTime maps the size bytes of f's guest memory at gpa in a new mapping
// of its memfd and times mlock of all of it.
func mlockTime(f *frontend.Frontend, gpa abi.GPA, size uint64) (float64, error) {
	mr := f.MemoryRegion()
	if uint64(gpa) < mr.GuestAddr || size > mr.Size || uint64(gpa)-mr.GuestAddr > mr.Size-size {
		return 0, fmt.Errorf("gpa %#x+%#x outside guest memory", gpa, size)
	}
	off := mr.MmapOffset + uint64(gpa) - mr.GuestAddr
	fd, err := unix.FcntlInt(uintptr(f.MemFd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("dup memfd: %w", err)
	}
	reg, err := memmap.MapRegion(fd, memmap.RegionSpec{Size: size, MmapOffset: off}) // owns fd
	if err != nil {
		return 0, err
	}
	defer reg.Release()
	t0 := time.Now()
	err = unix.Mlock(reg.Bytes())
	dt := time.Since(t0).Seconds()
	if err != nil {
		return 0, fmt.Errorf("mlock: %w", err)
	}
	unix.Munlock(reg.Bytes())
	return dt, nil
}

func dial(sock string, mem uint64) (*verbs.Context, *frontend.Frontend, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*stall)
	defer cancel()
	return frontend.OpenRDMA(ctx, sock, mem)
}

// startup times connect → device ready → first MR (64 KiB) registered for
// a guest of mem bytes on a fresh device of r.
func startup(r *rig, mem uint64) (float64, error) {
	sock, err := r.device()
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	c, f, err := dial(sock, mem)
	if err != nil {
		return 0, err
	}
	pd, err := c.AllocPD()
	if err == nil {
		var buf *verbs.Buffer
		if buf, err = c.AllocBuffer(64 << 10); err == nil {
			_, err = pd.RegMR(buf, 0, 64<<10, abi.AccessAll)
		}
	}
	dt := time.Since(t0).Seconds()
	c.Close()
	f.Close()
	if err != nil {
		return 0, fmt.Errorf("first mr: %w", err)
	}
	return dt, r.waitUnpinned()
}

// memAvailable reads MemAvailable from /proc/meminfo in bytes.
func memAvailable() (uint64, error) {
	b, err := readFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	var kb uint64
	for _, line := range splitLines(b) {
		if n, _ := fmt.Sscanf(line, "MemAvailable: %d kB", &kb); n == 1 {
			return kb << 10, nil
		}
	}
	return 0, errors.New("no MemAvailable in /proc/meminfo")
}

// controlResult holds the control-path rates, per second.
type controlResult struct {
	qp   float64 // CREATE_QP + DESTROY_QP of one QP
	qp2  float64 // a QP on each of two devices created, then both destroyed
	regs float64 // REG_MR 4 KiB (warm map cache)
	null float64 // QUERY_PORT: the bare round trip
}

// control measures the control path: create+destroy of a QP, the same
// for a QP on each device of the pair, and REG_MR of 4 KiB, beside the
// rate of a bare control round trip (QUERY_PORT).
func control(s settings, p *pair) (r controlResult, err error) {
	a, b := p.a, p.b
	r.null, err = s.repeat(func() (float64, error) {
		n, start := 0, time.Now()
		for ; n < 100 || time.Since(start) < s.rowTime; n++ {
			if _, err := a.c.QueryPort(); err != nil {
				return 0, err
			}
		}
		return float64(n) / time.Since(start).Seconds(), nil
	})
	if err != nil {
		return r, fmt.Errorf("query port: %w", err)
	}
	qattr := func(cq *verbs.CQ) verbs.QPInitAttr {
		return verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	}
	r.qp, err = s.repeat(func() (float64, error) {
		n, start := 0, time.Now()
		for ; n < 50 || time.Since(start) < s.rowTime; n++ {
			q, err := a.pd.CreateQP(qattr(a.cq))
			if err != nil {
				return 0, err
			}
			if err := q.Destroy(); err != nil {
				return 0, err
			}
		}
		return float64(n) / time.Since(start).Seconds(), nil
	})
	if err != nil {
		return r, fmt.Errorf("qp create+destroy: %w", err)
	}
	r.qp2, err = s.repeat(func() (float64, error) {
		n, start := 0, time.Now()
		for ; n < 50 || time.Since(start) < s.rowTime; n++ {
			q1, err := a.pd.CreateQP(qattr(a.cq))
			if err != nil {
				return 0, err
			}
			q2, err := b.pd.CreateQP(qattr(b.cq))
			if err != nil {
				return 0, err
			}
			if err := q1.Destroy(); err != nil {
				return 0, err
			}
			if err := q2.Destroy(); err != nil {
				return 0, err
			}
		}
		return float64(n) / time.Since(start).Seconds(), nil
	})
	if err != nil {
		return r, fmt.Errorf("qp pairs: %w", err)
	}
	const pool = 64
	bufs := make([]*verbs.Buffer, pool)
	for i := range bufs {
		if bufs[i], err = a.c.AllocBuffer(4096); err != nil {
			return r, err
		}
	}
	defer func() {
		for _, b := range bufs {
			b.Free()
		}
	}()
	r.regs, err = s.repeat(func() (float64, error) {
		var in time.Duration
		n := 0
		for start := time.Now(); n < 50 || time.Since(start) < s.rowTime; n++ {
			t0 := time.Now()
			mr, err := a.pd.RegMR(bufs[n%pool], 0, 4096, abi.AccessLocalWrite)
			in += time.Since(t0)
			if err != nil {
				return 0, err
			}
			if err := mr.Dereg(); err != nil {
				return 0, err
			}
		}
		return float64(n) / in.Seconds(), nil
	})
	if err != nil {
		return r, fmt.Errorf("reg mr 4 KiB: %w", err)
	}
	return r, nil
}
