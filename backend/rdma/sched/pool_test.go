package sched

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newPool(t *testing.T, cfg Config) *Pool {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func newTask(t *testing.T, p *Pool, run func(b *Budget) Next) *Task {
	t.Helper()
	k, err := p.NewTask(run)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Stop)
	return k
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWakeRunsOnceAndAgainIfWokenDuringVisit(t *testing.T) {
	p := newPool(t, Config{Workers: 2})
	var visits atomic.Int32
	entered := make(chan struct{})
	release := make(chan struct{})
	var k *Task
	k = newTask(t, p, func(b *Budget) Next {
		if visits.Add(1) == 1 {
			entered <- struct{}{}
			<-release
		}
		return Next{}
	})
	time.Sleep(5 * time.Millisecond)
	if visits.Load() != 0 {
		t.Fatal("a task was visited before its first Wake")
	}
	k.Wake()
	<-entered
	k.Wake() // during the visit: one more visit
	k.Wake() // coalesces with the previous
	close(release)
	eventually(t, "the second visit", func() bool { return visits.Load() == 2 })
	time.Sleep(10 * time.Millisecond)
	if n := visits.Load(); n != 2 {
		t.Fatalf("%d visits, want 2 (an idle task is not visited again)", n)
	}
}

func TestRoundRobinAmongBusyTasks(t *testing.T) {
	p := newPool(t, Config{Workers: 1, Spin: -1})
	const n = 4
	var count [n]atomic.Int64
	var stop atomic.Bool
	var ks [n]*Task
	for i := range n {
		ks[i] = newTask(t, p, func(b *Budget) Next {
			count[i].Add(1)
			b.Charge(1024)
			return Next{More: !stop.Load()}
		})
	}
	for _, k := range ks {
		k.Wake()
	}
	// The first tasks woken run alone until the last is queued (long
	// under -race on a loaded machine): count from when all were visited.
	eventually(t, "every task visited", func() bool { return count[n-1].Load() >= 1 })
	var base [n]int64
	for i := range n {
		base[i] = count[i].Load()
	}
	eventually(t, "visits", func() bool { return count[n-1].Load()-base[n-1] >= 2000 })
	stop.Store(true)
	var got [n]int64
	for i := range n {
		got[i] = count[i].Load() - base[i]
	}
	// Taken in turn: within a round of each other (the base snapshot
	// itself spans up to one round).
	if lo, hi := slices.Min(got[:]), slices.Max(got[:]); hi-lo > 4 {
		t.Fatalf("visits since all were queued %v: one worker should take busy tasks in turn", got)
	}
}

// moveAll returns a run function that spends each budget with messages of
// size bytes and adds what it moved to *moved.
func moveAll(size uint64, moved *atomic.Int64, stop *atomic.Bool) func(b *Budget) Next {
	return func(b *Budget) Next {
		for !b.Spent() {
			b.Charge(size)
			moved.Add(int64(size) + OpCost)
		}
		return Next{More: !stop.Load()}
	}
}

// The engine time shared is payload plus OpCost per message: a tenant of
// 4 MiB messages and one of 64 B messages get the same.
func TestDeficitRoundRobinSharesEngineTimeNotMessages(t *testing.T) {
	p := newPool(t, Config{Workers: 1, Spin: -1, Quantum: 64 << 10})
	var big, small atomic.Int64
	var stop atomic.Bool
	newTask(t, p, moveAll(4<<20, &big, &stop)).Wake()
	newTask(t, p, moveAll(64, &small, &stop)).Wake()
	// Count from when both compete: alone, the first one runs freely.
	eventually(t, "both tasks", func() bool { return small.Load() > 0 })
	big0, small0 := big.Load(), small.Load()
	eventually(t, "bytes", func() bool { return big.Load()-big0 >= 64<<20 && small.Load()-small0 >= 64<<20 })
	stop.Store(true)
	r := float64(big.Load()-big0) / float64(small.Load()-small0)
	if r > 1.5 || r < 1/1.5 {
		t.Fatalf("4 MiB messages cost %d, 64 B messages %d (ratio %.2f): deficit round robin shares engine time", big.Load(), small.Load(), r)
	}
	if p.Stats().Skipped == 0 {
		t.Fatal("the large-message task never passed a turn")
	}
}

func TestWeight(t *testing.T) {
	p := newPool(t, Config{Workers: 1, Spin: -1, Quantum: 4096})
	var heavy, light atomic.Int64
	var stop atomic.Bool
	h := newTask(t, p, moveAll(1024, &heavy, &stop))
	h.SetWeight(3)
	h.Wake()
	newTask(t, p, moveAll(1024, &light, &stop)).Wake()
	eventually(t, "both tasks", func() bool { return light.Load() > 0 })
	heavy0, light0 := heavy.Load(), light.Load()
	eventually(t, "bytes", func() bool { return light.Load()-light0 >= 8<<20 })
	stop.Store(true)
	r := float64(heavy.Load()-heavy0) / float64(light.Load()-light0)
	if r < 2.5 || r > 3.5 {
		t.Fatalf("weight 3 against 1 moved %.2f× the bytes", r)
	}
}

func TestAloneTaskIsNotHeldByItsDebt(t *testing.T) {
	p := newPool(t, Config{Workers: 1, Spin: -1, Quantum: 4096})
	var visits atomic.Int32
	k := newTask(t, p, func(b *Budget) Next {
		b.Charge(1 << 30) // far more than a quantum
		return Next{More: visits.Add(1) < 5}
	})
	k.Wake()
	eventually(t, "five visits", func() bool { return visits.Load() == 5 })
	if s := p.Stats(); s.Skipped != 0 {
		t.Fatalf("%d turns skipped with nobody else waiting", s.Skipped)
	}
}

func TestWakeAt(t *testing.T) {
	p := newPool(t, Config{Workers: 1})
	var visits atomic.Int32
	start := time.Now()
	var second time.Time
	var mu sync.Mutex
	k := newTask(t, p, func(b *Budget) Next {
		if visits.Add(1) == 1 {
			return Next{At: time.Now().Add(30 * time.Millisecond)}
		}
		mu.Lock()
		second = time.Now()
		mu.Unlock()
		return Next{}
	})
	k.Wake()
	eventually(t, "the timer's visit", func() bool { return visits.Load() == 2 })
	mu.Lock()
	defer mu.Unlock()
	if second.Sub(start) < 30*time.Millisecond {
		t.Fatalf("woken after %v, asked for 30ms", second.Sub(start))
	}
}

func TestStopWaitsForVisitAndEndsVisits(t *testing.T) {
	p := newPool(t, Config{Workers: 2})
	var visits atomic.Int32
	entered := make(chan struct{})
	var done atomic.Bool
	k, err := p.NewTask(func(b *Budget) Next {
		if visits.Add(1) == 1 {
			close(entered)
			time.Sleep(20 * time.Millisecond)
			done.Store(true)
		}
		return Next{More: true, At: time.Now().Add(time.Millisecond)}
	})
	if err != nil {
		t.Fatal(err)
	}
	k.Wake()
	<-entered
	k.Stop()
	if !done.Load() {
		t.Fatal("Stop returned during a visit")
	}
	n := visits.Load()
	k.Wake()
	time.Sleep(20 * time.Millisecond)
	if visits.Load() != n {
		t.Fatal("a stopped task was visited")
	}
	if s := p.Stats(); s.Tasks != 0 {
		t.Fatalf("%d tasks registered after Stop", s.Tasks)
	}
}

func TestCloseEndsWorkers(t *testing.T) {
	before := runtime.NumGoroutine()
	p, err := New(Config{Workers: 8})
	if err != nil {
		t.Fatal(err)
	}
	k, _ := p.NewTask(func(b *Budget) Next { return Next{More: true} })
	k.Wake() // a task that always wants more does not keep Close waiting
	time.Sleep(5 * time.Millisecond)
	p.Close()
	eventually(t, "workers to exit", func() bool { return runtime.NumGoroutine() <= before })
	if _, err := p.NewTask(func(*Budget) Next { return Next{} }); err != ErrClosed {
		t.Fatalf("NewTask on a closed pool: %v", err)
	}
}

func TestIdleWorkersPark(t *testing.T) {
	p := newPool(t, Config{Workers: 2})
	k := newTask(t, p, func(b *Budget) Next { return Next{} })
	k.Wake()
	eventually(t, "workers parked", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.parked == 2
	})
}

func TestConfig(t *testing.T) {
	for _, c := range []Config{{Workers: -1}, {Workers: MaxWorkers + 1}, {CPUs: []int{-1}}, {CPUs: []int{maxCPU}}, {Quantum: -1}} {
		if p, err := New(c); err == nil {
			p.Close()
			t.Errorf("New(%+v) accepted", c)
		}
	}
	p := newPool(t, Config{})
	if p.Workers() != runtime.GOMAXPROCS(0) {
		t.Fatalf("%d workers by default, GOMAXPROCS is %d", p.Workers(), runtime.GOMAXPROCS(0))
	}
}

func TestPinnedWorkers(t *testing.T) {
	p := newPool(t, Config{Workers: 2, CPUs: []int{0}})
	var visits atomic.Int32
	k := newTask(t, p, func(b *Budget) Next { visits.Add(1); return Next{} })
	k.Wake()
	eventually(t, "a pinned worker's visit", func() bool { return visits.Load() == 1 })
	// CPU 1000 exists on no machine this runs on: the kernel refuses it.
	if p, err := New(Config{Workers: 1, CPUs: []int{1000}}); err == nil {
		p.Close()
		t.Fatal("pinning to CPU 1000 succeeded")
	}
}

// Kick runs the turns on the caller's goroutine when nothing is queued (no
// hand-off), and queues the task for a worker otherwise.
func TestKickRunsInlineWhenIdle(t *testing.T) {
	p := newPool(t, Config{Workers: 1, Spin: -1})
	var visits atomic.Int32
	k := newTask(t, p, func(b *Budget) Next {
		return Next{More: visits.Add(1) < 3}
	})
	k.Kick()
	if n := visits.Load(); n != 3 {
		t.Fatalf("%d visits when Kick returned, want all 3 run by Kick itself", n)
	}

	// A queued task: Kick hands over instead.
	block := make(chan struct{})
	busy := newTask(t, p, func(b *Budget) Next { <-block; return Next{} })
	busy.Wake() // the only worker takes it and blocks
	eventually(t, "the worker busy", func() bool { return p.Stats().Visits >= 3 && p.Stats().Queued == 0 })
	other := newTask(t, p, func(b *Budget) Next { return Next{} })
	other.Wake() // queued behind the busy worker
	visits.Store(0)
	k.Kick()
	if n := visits.Load(); n != 0 {
		t.Fatalf("Kick ran %d turns itself while a task was queued", n)
	}
	close(block)
	eventually(t, "the kicked task's turns on the worker", func() bool { return visits.Load() == 3 })
}
