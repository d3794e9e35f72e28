package roceinterop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/vrdma/vrdma/vmm/guestvm"
)

// Outcome is what RunVrdma did.
type Outcome struct {
	// Runs are the vrdma side's runs, one per job (those that started).
	Runs []*Run
	// Results are the rxe guest's VRDMA-RESULT lines (one per job when it
	// is the client, none when it is the server).
	Results []guestvm.Result
	// GuestLog is the rxe guest's console.
	GuestLog string
	// Frames are the capture's RoCE frames (every ICRC good).
	Frames []Frame
	// Checks say what each run verified, in job order.
	Checks []string
	// GuestTime is from boot to power-off.
	GuestTime time.Duration
}

// Close destroys the runs' objects.
func (o *Outcome) Close() {
	for _, r := range o.Runs {
		r.Close()
	}
}

// RunVrdma boots the rxe guest (cfg: its role and jobs, the capture file)
// and plays the other side of each job with a fresh QP of dev: with the
// guest as perftest's client we serve (rxe is the requester), with the
// guest as the server we are the client (vrdma is the requester). Then it
// reads the capture (every ICRC checked) and checks every run against it.
// The Outcome holds what happened so far also when it fails; close it.
func (l *Lab) RunVrdma(ctx context.Context, dev *Device, cfg Guest) (*Outcome, error) {
	out := &Outcome{}
	var ln net.Listener
	if cfg.Role == "client" {
		var err error
		if ln, err = l.Listen(); err != nil {
			return out, err
		}
		defer ln.Close()
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	peerErr := make(chan error, 1)
	runs := make(chan *Run, len(cfg.Jobs))
	go func() {
		defer close(runs)
		for _, j := range cfg.Jobs {
			var conn net.Conn
			var err error
			if ln != nil {
				conn, err = ln.Accept()
			} else {
				conn, err = l.Dial(pctx)
			}
			if err != nil {
				peerErr <- fmt.Errorf("%s: %w", j, err)
				return
			}
			var r *Run
			if ln != nil {
				r, err = Serve(pctx, dev, conn, j)
			} else {
				r, err = Client(pctx, dev, conn, j)
			}
			conn.Close() // a failed exchange ends the guest's perftest too
			if r != nil {
				runs <- r
			}
			if err != nil {
				peerErr <- err
				return
			}
		}
		peerErr <- nil
	}()
	start := time.Now()
	var gerr error
	out.Results, out.GuestLog, gerr = l.RunGuest(ctx, cfg)
	out.GuestTime = time.Since(start)
	if gerr != nil {
		// The peer may wait for a guest that is gone: a server for its
		// client, a client for its server.
		if ln != nil {
			ln.Close()
		}
		cancel()
	}
	perr := <-peerErr
	for r := range runs {
		out.Runs = append(out.Runs, r)
	}
	if perr != nil {
		return out, fmt.Errorf("vrdma side: %w", perr)
	}
	if gerr != nil {
		return out, gerr
	}
	if cfg.Role == "client" && len(out.Results) != len(cfg.Jobs) {
		return out, fmt.Errorf("rxe guest: %d results for %d jobs", len(out.Results), len(cfg.Jobs))
	}
	var err error
	if out.Frames, err = ReadCapture(cfg.Dump); err != nil {
		return out, err
	}
	var errs []error
	for _, r := range out.Runs {
		c, err := r.CheckCapture(out.Frames)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out.Checks = append(out.Checks, fmt.Sprintf("%s (vrdma %s): %s", r.Job, r.Role, strings.Join(append(r.Local, c), "; ")))
	}
	return out, errors.Join(errs...)
}
