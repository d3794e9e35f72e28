package rdma

import (
	"testing"
	"time"
)

// TestSpinWindow: a window that keeps missing shrinks to zero, a probe
// every probeEvery wake-ups tries the full spin, and a hit restores it.
func TestSpinWindow(t *testing.T) {
	const max = 50 * time.Microsecond
	w := spinWindow{window: max}
	// Misses: 50 → 25 → 12.5 → 6.25 → 3.125 → 1.5625 < min → 0, four
	// misses per halving.
	n := 0
	for w.window > 0 {
		if got := w.start(max); got != w.window {
			t.Fatalf("start: got %v, want the window %v", got, w.window)
		}
		w.miss()
		n++
	}
	if n != 5*missesToShrink {
		t.Errorf("got %d misses to reach 0, want %d", n, 5*missesToShrink)
	}
	probes := 0
	for i := 0; i < 10*probeEvery; i++ {
		if got := w.start(max); got == max {
			probes++
			if w.miss(); w.window != 0 {
				t.Fatalf("a missed probe left window %v, want 0", w.window)
			}
		} else if got != 0 {
			t.Fatalf("start at 0: got %v, want 0 or a probe", got)
		}
	}
	if probes != 10 {
		t.Errorf("got %d probes in %d wake-ups, want 10", probes, 10*probeEvery)
	}
	for w.start(max) != max {
	}
	if got := w.hit(max); got != max || w.window != max {
		t.Errorf("hit: got %v (window %v), want %v", got, w.window, max)
	}
	// A hit also resets the count of misses.
	w.miss()
	w.hit(max)
	for i := 0; i < missesToShrink-1; i++ {
		w.miss()
	}
	if w.window != max {
		t.Errorf("got window %v after %d misses following a hit, want %v", w.window, missesToShrink-1, max)
	}
}
