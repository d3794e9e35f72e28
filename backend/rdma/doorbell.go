package rdma

import (
	"runtime"
	"time"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The doorbell queues: each wakes the engine for the QPs bound to it
// (docs/spec.md, § Doorbell queues and the data path).

// handleDoorbell runs the engine for one doorbell queue: it polls while
// there is work and for a short spin after, then publishes that it sleeps
// (used flags) and looks once more before returning to wait for a kick. The
// spin's length adapts (spinWindow).
func (d *Device) handleDoorbell(q *backend.Queue) error {
	dbq := q.Index() - abi.FirstDoorbellQueue
	t := q.Memory()
	sw := &d.spins[dbq]
	window := sw.start(d.cfg.Spin)
	// The spin follows work only: a kick that finds none (a driver posting
	// receives, which the peer's requester consumes; a timer) goes back to
	// sleep at once instead of taking a core for the window.
	var last time.Time
	idle := false // a look since the last work found nothing
	for !q.Stopping() {
		q.SetPolling(true)
		worked, _ := d.eng.Poll(dbq, t)
		if worked {
			if idle && !last.IsZero() {
				window = sw.hit(d.cfg.Spin) // the spin found the next post
			}
			idle = false
			last = time.Now()
			continue
		}
		idle = true
		if !last.IsZero() && time.Since(last) < window {
			// Idle: let a runnable goroutine (a client, the control
			// worker) have the processor between looks.
			runtime.Gosched()
			continue
		}
		if !last.IsZero() && window > 0 {
			window = sw.miss()
		}
		q.SetPolling(false)
		abi.Fence()
		if worked, _ = d.eng.Poll(dbq, t); !worked {
			return nil
		}
		last = time.Now()
		idle = false
	}
	q.SetPolling(false)
	return nil
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
