package vrdmadproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
)

// Upgrade asks vrdmad to hand every device over to a new vrdmad running
// binary ("": the file at its own path), as vrdmactl daemon upgrade does,
// and from then on follows the new process: Pid is its, and Stop and Kill
// end it. It returns once the old process has exited. The new vrdmad is
// not this process's child (the old one started it in its own session):
// it has no Pdeathsig, and Stop waits for it by polling /proc.
func (p *Proc) Upgrade(ctx context.Context, binary string) (controlapi.UpgradeAnswer, error) {
	old := p.Pid()
	c := controlapi.New(p.control, controlapi.WithTimeout(controlapi.UpgradeTimeout))
	defer c.CloseIdleConnections()
	ans, err := c.Upgrade(ctx, binary)
	if err != nil {
		return ans, err
	}
	if p.adopted.Load() == 0 {
		select {
		case <-p.exited:
		case <-ctx.Done():
			return ans, fmt.Errorf("the old vrdmad (pid %d) did not exit: %w", old, ctx.Err())
		}
		if p.waitErr != nil {
			return ans, fmt.Errorf("the old vrdmad (pid %d) handed over but exited with %w", old, p.waitErr)
		}
	} else if err := waitGone(ctx, old); err != nil {
		return ans, err
	}
	p.adopted.Store(int64(ans.PID))
	p.client.CloseIdleConnections()
	return ans, nil
}

// Pid is the pid of the vrdmad serving now: the child Start made, or the
// one that took over from it (Upgrade).
func (p *Proc) Pid() int {
	if pid := p.adopted.Load(); pid != 0 {
		return int(pid)
	}
	return p.cmd.Process.Pid
}

// endAdopted ends a vrdmad that took over with sig and waits until it is
// gone, killing it after the stop timeout.
func (p *Proc) endAdopted(pid int, sig syscall.Signal) error {
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return &Error{Op: "stop", Err: err, Log: p.log.String()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.stopTimeout)
	defer cancel()
	if err := waitGone(ctx, pid); err != nil {
		syscall.Kill(pid, syscall.SIGKILL)
		waitGone(context.Background(), pid)
		return &Error{Op: "stop", Err: fmt.Errorf("%w within %v", ErrStopTimeout, p.stopTimeout), Log: p.log.String()}
	}
	return nil
}

// waitGone waits until pid has exited (its /proc entry is gone or a
// zombie), or ctx ends.
func waitGone(ctx context.Context, pid int) error {
	for {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || zombie(b) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("vrdmad pid %d still runs: %w", pid, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// zombie reports whether a /proc/PID/stat line says state Z: the state
// follows the command name's closing parenthesis.
func zombie(stat []byte) bool {
	for i := len(stat) - 1; i >= 0; i-- {
		if stat[i] == ')' {
			return i+2 < len(stat) && stat[i+2] == 'Z'
		}
	}
	return false
}
