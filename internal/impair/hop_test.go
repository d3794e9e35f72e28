package impair

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// fakeDev is a Device over channels: the test puts packets into in and
// takes what the hop wrote from out.
type fakeDev struct {
	in     chan []byte
	out    chan []byte
	closed chan struct{}
	once   sync.Once
}

var errOutFull = errors.New("fake: out full")

func newFakeDev(capacity int) *fakeDev {
	return &fakeDev{in: make(chan []byte, capacity), out: make(chan []byte, capacity),
		closed: make(chan struct{})}
}

func (d *fakeDev) Read(b []byte) (int, error) {
	select {
	case p := <-d.in:
		return copy(b, p), nil
	case <-d.closed:
		return 0, os.ErrClosed
	}
}

func (d *fakeDev) Write(b []byte) (int, error) {
	select {
	case d.out <- slices.Clone(b):
		return len(b), nil
	default:
		return 0, errOutFull
	}
}

func (d *fakeDev) Close() error {
	d.once.Do(func() { close(d.closed) })
	return nil
}

// epoch is the origin of the timestamps in test payloads (monotonic).
var epoch = time.Now()

// payload is packet seq of size bytes: the sequence number and the time it
// was made.
func payload(seq uint32, size int) []byte {
	b := make([]byte, max(size, 12))
	binary.BigEndian.PutUint32(b, seq)
	binary.BigEndian.PutUint64(b[4:], uint64(time.Since(epoch)))
	return b
}

func parsePayload(b []byte) (seq uint32, sent time.Duration) {
	return binary.BigEndian.Uint32(b), time.Duration(binary.BigEndian.Uint64(b[4:]))
}

// done is the packets whose fate is known.
func (c Counters) done() uint64 {
	return c.Forwarded + c.DroppedLoss + c.DroppedDown + c.QueueFull + c.WriteErrors
}

// balance checks the invariant of Counters once nothing is in flight.
func balance(t *testing.T, c Counters) {
	t.Helper()
	if c.Received != c.done() {
		t.Errorf("counters %+v: received %d, want forwarded+dropped+queue_full+write_errors = %d",
			c, c.Received, c.done())
	}
}

// fakeHop starts a one-path hop over fake devices.
func fakeHop(t *testing.T, cfg Config, capacity int) (*Hop, *fakeDev) {
	t.Helper()
	a, b := newFakeDev(capacity), newFakeDev(capacity)
	h, err := New(cfg, []Port{{FromA: a, FromB: b}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h, a
}

// pump feeds n packets of size bytes to dev's A->B direction, with at most
// window of them not yet accounted for by the hop, and waits until all
// are. It returns the packets written, in order.
func pump(t *testing.T, h *Hop, dev *fakeDev, n, size, window int) [][]byte {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var out [][]byte
	collect := func() {
		for {
			select {
			case p := <-dev.out:
				out = append(out, p)
			default:
				return
			}
		}
	}
	for seq := range n {
		for d := h.CountersDir(0, AtoB).done(); d < uint64(seq) && uint64(seq)-d >= uint64(window); d = h.CountersDir(0, AtoB).done() {
			if time.Now().After(deadline) {
				t.Fatalf("hop stuck: %+v after %d sent", h.CountersDir(0, AtoB), seq)
			}
			collect()
			time.Sleep(20 * time.Microsecond)
		}
		dev.in <- payload(uint32(seq), size)
		collect()
	}
	for h.CountersDir(0, AtoB).done() < uint64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("hop stuck: %+v after %d sent", h.CountersDir(0, AtoB), n)
		}
		collect()
		time.Sleep(100 * time.Microsecond)
	}
	collect()
	return out
}

func seqs(pkts [][]byte) []uint32 {
	var s []uint32
	for _, p := range pkts {
		seq, _ := parsePayload(p)
		s = append(s, seq)
	}
	return s
}

func TestRuleValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rule  Rule
		field string // "" when valid
	}{
		{"zero", Rule{}, ""},
		{"all", Rule{Loss: 1, ReorderProb: 0.5, ReorderAfter: 3, RateBps: 1e6, Delay: time.Second, Jitter: time.Millisecond}, ""},
		{"loss>1", Rule{Loss: 1.5}, "Loss"},
		{"loss<0", Rule{Loss: -0.1}, "Loss"},
		{"loss NaN", Rule{Loss: math.NaN()}, "Loss"},
		{"reorder NaN", Rule{ReorderProb: math.NaN()}, "ReorderProb"},
		{"after<0", Rule{ReorderAfter: -1}, "ReorderAfter"},
		{"after big", Rule{ReorderAfter: MaxReorderAfter + 1}, "ReorderAfter"},
		{"delay<0", Rule{Delay: -1}, "Delay"},
		{"jitter big", Rule{Jitter: MaxDelay + 1}, "Jitter"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.rule.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var re *RuleError
			if !errors.As(err, &re) || !errors.Is(err, ErrRule) || re.Field != tc.field {
				t.Fatalf("got %v, want a RuleError for %s", err, tc.field)
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	d := newFakeDev(1)
	for _, tc := range []struct {
		name  string
		cfg   Config
		ports []Port
	}{
		{"no paths", Config{}, nil},
		{"nil device", Config{}, []Port{{FromA: d}}},
		{"queue", Config{QueueLen: MaxQueueLen + 1}, []Port{{d, d}}},
		{"mtu", Config{MTU: 100}, []Port{{d, d}}},
		{"timeout", Config{ReorderTimeout: -1}, []Port{{d, d}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if h, err := New(tc.cfg, tc.ports); !errors.Is(err, ErrConfig) || h != nil {
				t.Errorf("got %v, %v, want nil, %v", h, err, ErrConfig)
			}
		})
	}
	h, _ := fakeHop(t, Config{}, 1)
	if err := h.SetRule(1, Rule{}); !errors.Is(err, ErrPath) {
		t.Errorf("SetRule(1): got %v, want %v", err, ErrPath)
	}
	if err := h.SetRuleDir(0, Dir(2), Rule{}); !errors.Is(err, ErrPath) {
		t.Errorf("SetRuleDir(0, 2): got %v, want %v", err, ErrPath)
	}
	if err := h.SetRule(0, Rule{Loss: 2}); !errors.Is(err, ErrRule) {
		t.Errorf("SetRule(Loss 2): got %v, want %v", err, ErrRule)
	}
	if got := h.Rule(0, AtoB); got != (Rule{}) {
		t.Errorf("rule after a rejected SetRule: got %+v, want zero", got)
	}
}

// lossBound is 6 standard deviations of a binomial(n, p) count.
func lossBound(n int, p float64) float64 { return 6 * math.Sqrt(float64(n)*p*(1-p)) }

func TestLossIsSeededAndCounted(t *testing.T) {
	const n, p = 10000, 0.1
	run := func(seed uint64) []uint32 {
		h, dev := fakeHop(t, Config{Seed: seed}, 1024)
		if err := h.SetRuleDir(0, AtoB, Rule{Loss: p}); err != nil {
			t.Fatal(err)
		}
		got := seqs(pump(t, h, dev, n, 64, 256))
		c := h.CountersDir(0, AtoB)
		balance(t, c)
		if c.DroppedLoss != uint64(n-len(got)) || c.QueueFull != 0 || c.Forwarded != uint64(len(got)) {
			t.Errorf("seed %d: counters %+v, want dropped_loss = %d sent - %d received, no queue_full",
				seed, c, n, len(got))
		}
		if lost := float64(n - len(got)); math.Abs(lost-n*p) > lossBound(n, p) {
			t.Errorf("seed %d: lost %v of %d at %v, want within %v of %v", seed, lost, n, p, lossBound(n, p), n*p)
		}
		if !slices.IsSorted(got) {
			t.Errorf("seed %d: loss alone reordered packets", seed)
		}
		return got
	}
	a, b, c := run(7), run(7), run(8)
	if !slices.Equal(a, b) {
		t.Error("two runs with seed 7 delivered different packets")
	}
	if slices.Equal(a, c) {
		t.Error("seeds 7 and 8 delivered the same packets")
	}
}

func TestDelayIsALowerBoundAndKeepsOrder(t *testing.T) {
	const delay, jitter = 20 * time.Millisecond, 10 * time.Millisecond
	h, dev := fakeHop(t, Config{Seed: 1}, 256)
	if err := h.SetRuleDir(0, AtoB, Rule{Delay: delay, Jitter: jitter}); err != nil {
		t.Fatal(err)
	}
	const n = 200
	var min time.Duration = math.MaxInt64
	var got []uint32
	for seq := range n {
		dev.in <- payload(uint32(seq), 64)
		if seq%10 == 0 {
			time.Sleep(time.Millisecond) // spread the arrivals
		}
	}
	for len(got) < n {
		select {
		case p := <-dev.out:
			seq, sent := parsePayload(p)
			min = time.Duration(math.Min(float64(min), float64(time.Since(epoch)-sent)))
			got = append(got, seq)
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d of %d packets", len(got), n)
		}
	}
	if min < delay {
		t.Errorf("shortest delay %v, want at least %v", min, delay)
	}
	if !slices.IsSorted(got) {
		t.Error("jitter reordered packets")
	}
	// The hop counts a packet forwarded after writing it: the last one
	// may be read here before its count.
	c := h.CountersDir(0, AtoB)
	for deadline := time.Now().Add(5 * time.Second); c.Forwarded < n && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		c = h.CountersDir(0, AtoB)
	}
	balance(t, c)
	if c.Delayed != n || c.Forwarded != n {
		t.Errorf("counters %+v, want delayed = forwarded = %d", c, n)
	}
	if other := h.CountersDir(0, BtoA); other != (Counters{}) {
		t.Errorf("B->A counters %+v, want zero", other)
	}
}

// allOnce reports whether got holds each of 0..n-1 exactly once.
func allOnce(got []uint32, n int) bool {
	if len(got) != n {
		return false
	}
	for i, v := range slices.Sorted(slices.Values(got)) {
		if v != uint32(i) {
			return false
		}
	}
	return true
}

// inversions counts the packets that arrived after a later-sent one.
func inversions(s []uint32) int {
	var inv int
	var top uint32
	for i, v := range s {
		if i > 0 && v < top {
			inv++
		}
		top = max(top, v)
	}
	return inv
}

func TestReorderDeliversAll(t *testing.T) {
	const n = 2000
	h, dev := fakeHop(t, Config{Seed: 3, ReorderTimeout: 20 * time.Millisecond}, 1024)
	if err := h.SetRuleDir(0, AtoB, Rule{ReorderProb: 0.1, ReorderAfter: 3}); err != nil {
		t.Fatal(err)
	}
	got := seqs(pump(t, h, dev, n, 64, 64))
	c := h.CountersDir(0, AtoB)
	balance(t, c)
	if !allOnce(got, n) {
		t.Fatalf("got %d packets, want each of the %d once", len(got), n)
	}
	inv := inversions(got)
	if inv == 0 || c.Reordered == 0 {
		t.Errorf("%d inversions, counters %+v: want packets out of order", inv, c)
	}
	if c.Forwarded != n {
		t.Errorf("counters %+v, want forwarded %d", c, n)
	}
	t.Logf("%d packets, %d held back, %d arrived after a later one", n, c.Reordered, inv)
}

func TestDownDropsAllAndQueued(t *testing.T) {
	h, dev := fakeHop(t, Config{}, 256)
	if err := h.SetRule(0, Rule{Down: true}); err != nil {
		t.Fatal(err)
	}
	if got := pump(t, h, dev, 100, 64, 32); len(got) != 0 {
		t.Errorf("down path forwarded %d packets", len(got))
	}
	if c := h.CountersDir(0, AtoB); c.DroppedDown != 100 {
		t.Errorf("counters %+v, want dropped_down 100", c)
	}
	// Packets already in the delay line when the path goes down.
	if err := h.SetRule(0, Rule{Delay: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for seq := range 10 {
		dev.in <- payload(uint32(seq), 64)
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.CountersDir(0, AtoB).Delayed < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("counters %+v: want 10 delayed", h.CountersDir(0, AtoB))
		}
		time.Sleep(time.Millisecond)
	}
	if err := h.SetRule(0, Rule{Down: true}); err != nil {
		t.Fatal(err)
	}
	for h.CountersDir(0, AtoB).DroppedDown < 110 {
		if time.Now().After(deadline) {
			t.Fatalf("counters %+v: want 110 dropped_down", h.CountersDir(0, AtoB))
		}
		time.Sleep(time.Millisecond)
	}
	if len(dev.out) != 0 {
		t.Errorf("%d queued packets left after down", len(dev.out))
	}
	balance(t, h.CountersDir(0, AtoB))
}

func TestQueueFullIsBounded(t *testing.T) {
	const q, n = 8, 100
	h, dev := fakeHop(t, Config{QueueLen: q}, n)
	if err := h.SetRule(0, Rule{Delay: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	for seq := range n {
		dev.in <- payload(uint32(seq), 64)
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.CountersDir(0, AtoB).Received < n {
		if time.Now().After(deadline) {
			t.Fatalf("counters %+v", h.CountersDir(0, AtoB))
		}
		time.Sleep(time.Millisecond)
	}
	for h.CountersDir(0, AtoB).Delayed < q {
		if time.Now().After(deadline) {
			t.Fatalf("counters %+v", h.CountersDir(0, AtoB))
		}
		time.Sleep(time.Millisecond)
	}
	if c := h.CountersDir(0, AtoB); c.QueueFull != n-q || c.Delayed != q {
		t.Errorf("counters %+v, want queue_full %d and delayed %d", c, n-q, q)
	}
}

func TestRateLimitIsALowerBound(t *testing.T) {
	const n, size, rate = 100, 1000, 8_000_000 // 1 ms a packet
	h, dev := fakeHop(t, Config{}, 256)
	if err := h.SetRuleDir(0, AtoB, Rule{RateBps: rate}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got := pump(t, h, dev, n, size, n)
	elapsed := time.Since(start)
	if len(got) != n {
		t.Fatalf("got %d packets, want %d", len(got), n)
	}
	if want := time.Duration(n*size*8) * time.Second / rate; elapsed < want {
		t.Errorf("%d packets of %d bytes at %d bit/s took %v, want at least %v", n, size, rate, elapsed, want)
	}
}

func TestCloseStopsEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	var devs []*fakeDev
	var ports []Port
	for range 4 {
		a, b := newFakeDev(4), newFakeDev(4)
		devs = append(devs, a, b)
		ports = append(ports, Port{a, b})
	}
	h, err := New(Config{}, ports)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.SetRule(2, Rule{Delay: MaxDelay}); err != nil {
		t.Fatal(err)
	}
	devs[4].in <- payload(1, 64)
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	for i, d := range devs {
		select {
		case <-d.closed:
		default:
			t.Errorf("device %d not closed", i)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("%d goroutines before, %d after Close", before, after)
	}
}

func BenchmarkHopFake(b *testing.B) {
	a, bd := newFakeDev(4096), newFakeDev(4096)
	h, err := New(Config{QueueLen: 4096}, []Port{{a, bd}})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	p := payload(0, 1024)
	b.SetBytes(1024)
	b.ReportAllocs()
	for b.Loop() {
		a.in <- p
		<-a.out
	}
}
