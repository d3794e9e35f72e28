package main

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// upgrader hands vrdmad over to a new process (a live upgrade) n times
// while exec-pair's commands run (--upgrades): the first handover interval
// after start, then every interval, until n are done or stop.
type upgrader struct {
	d        *vrdmadproc.Proc
	n        int
	interval time.Duration
	pr       *linePrinter
	say      func(string, ...any)

	once    sync.Once
	started bool // written inside once
	quit    chan struct{}
	done    chan struct{}
	failed  bool // written before done is closed
}

// upgradeLine is what a VRDMA-UPGRADE line says.
type upgradeLine struct {
	N        int     `json:"n"`
	OldPID   int     `json:"old_pid"`
	NewPID   int     `json:"new_pid,omitempty"`
	PauseMS  float64 `json:"pause_ms,omitempty"`
	OK       bool    `json:"ok"`
	Error    string  `json:"error,omitempty"`
	Seconds  float64 `json:"seconds"`
	StateLen int     `json:"state_bytes,omitempty"`
}

func newUpgrader(d *vrdmadproc.Proc, n int, interval time.Duration, pr *linePrinter, say func(string, ...any)) *upgrader {
	return &upgrader{d: d, n: n, interval: interval, pr: pr, say: say, quit: make(chan struct{}), done: make(chan struct{})}
}

// start begins the handovers (once; a no-op without --upgrades).
func (u *upgrader) start(ctx context.Context) {
	if u.n == 0 {
		return
	}
	u.once.Do(func() {
		u.started = true
		go u.run(ctx)
	})
}

func (u *upgrader) run(ctx context.Context) {
	defer close(u.done)
	for i := 1; i <= u.n; i++ {
		select {
		case <-u.quit:
			return
		case <-ctx.Done():
			return
		case <-time.After(u.interval):
		}
		l := upgradeLine{N: i, OldPID: u.d.Pid()}
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, controlapi.UpgradeTimeout)
		ans, err := u.d.Upgrade(actx, "")
		cancel()
		l.Seconds = time.Since(start).Seconds()
		if err != nil {
			l.Error = err.Error()
			u.failed = true
		} else {
			l.OK, l.NewPID, l.PauseMS, l.StateLen = true, ans.PID, ans.PauseMS, ans.StateBytes
		}
		b, _ := json.Marshal(l)
		u.pr.print("", guestvm.StackLine{Text: "VRDMA-UPGRADE " + string(b), Command: true})
		if err != nil {
			u.say("upgrade %d failed: %v", i, err)
			return
		}
	}
}

// stop ends the handovers, waits for one in progress, and reports whether
// one failed.
func (u *upgrader) stop() bool {
	if u.n == 0 {
		return false
	}
	close(u.quit)
	u.once.Do(func() {}) // from here start starts nothing; started is settled
	if u.started {
		<-u.done
	}
	return u.failed
}
