package guestvm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Defaults of StackPairConfig.
const (
	// DefaultReadyTimeout is how long the client's command waits, after the
	// server's command started, for a TCP socket to listen in the server.
	DefaultReadyTimeout = 30 * time.Second
	// DefaultPeerGrace is how long one side may run on after the other
	// side failed.
	DefaultPeerGrace = 30 * time.Second
)

// Roles of a stack pair's guests, as StackPair.Run names them.
const (
	RoleServer = "server"
	RoleClient = "client"
)

// StackPairConfig is a server and a client guest of the stack image whose
// commands run against each other (a perftest server and its client).
//
// The client's command starts once the server is ready: both guests boot
// at once, the client's init waits at its gate (StackConfig.Gate), and
// the harness releases it when the server's command listens on a TCP port
// (init's VRDMA-LISTEN), when the server's command ended, or ReadyTimeout
// after the server's command started, whichever comes first. perftest and
// the ibv_*_pingpong tests exchange their endpoints over TCP, and their
// clients give up at once on a refused connection; so a client never
// needs to retry.
type StackPairConfig struct {
	// Server and Client are the two guests; StartStackPair sets the
	// server's AnnounceListen and the client's Gate. Empty names mean
	// RoleServer and RoleClient.
	Server, Client StackConfig
	// ReadyTimeout bounds the wait for the server to listen (above); zero
	// means DefaultReadyTimeout, negative means no wait: the client starts
	// as soon as the server's command has.
	ReadyTimeout time.Duration
	// PeerGrace is how long one side may run on once the other side
	// failed (its command exited non-zero, or its guest ended without an
	// exit status): a perftest server whose client failed would wait for
	// it forever. Then its guest is stopped. Zero means DefaultPeerGrace.
	// After a side succeeded, the other one runs until it ends or ctx
	// does.
	PeerGrace time.Duration
}

// StackPair is a booted server and client guest of the stack image.
type StackPair struct {
	Server, Client *Guest // immutable
	cfg            StackPairConfig
}

// StackPairResult is how both sides of a StackPair ran.
type StackPairResult struct {
	Server, Client CommandResult
	// ServerStopped and ClientStopped say that the harness stopped that
	// guest: its command still ran PeerGrace after the other side failed.
	ServerStopped, ClientStopped bool
	// Released says why the client's command was let go: "listen" (the
	// server listened), "server-ended" (the server's command or guest
	// ended first), "ready-timeout", "immediately" (negative
	// ReadyTimeout), or "" (never: the run ended first).
	Released string
}

// ExitCode is the pair's exit status: 0 when both commands exited 0;
// otherwise the failing side's code, and the client's when both failed. A
// side the harness stopped because its peer failed does not count as a
// failure of its own. A side that reported no status counts as failed,
// with its ExitCode (ExitHarness or ExitTimeout).
func (r StackPairResult) ExitCode() int {
	failed := func(c CommandResult) bool { return !(c.Reported && c.ExitCode == 0) }
	code := func(c CommandResult) int {
		if c.ExitCode == 0 {
			return ExitHarness // failed without a code: never 0
		}
		return c.ExitCode
	}
	sFail, cFail := failed(r.Server), failed(r.Client)
	if r.ServerStopped && cFail && !r.ClientStopped {
		sFail = false
	}
	if r.ClientStopped && sFail && !r.ServerStopped {
		cFail = false
	}
	switch {
	case cFail:
		return code(r.Client)
	case sFail:
		return code(r.Server)
	}
	return 0
}

// StartStackPair boots the server and the client guest at the same time.
// On failure nothing stays behind. The caller must Close the StackPair.
func StartStackPair(ctx context.Context, cfg StackPairConfig, opts ...Option) (*StackPair, error) {
	if cfg.Server.Name == "" {
		cfg.Server.Name = RoleServer
	}
	if cfg.Client.Name == "" {
		cfg.Client.Name = RoleClient
	}
	if cfg.Server.Name == cfg.Client.Name {
		return nil, configErr("Name", fmt.Sprintf("both guests are named %q", cfg.Server.Name))
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.PeerGrace <= 0 {
		cfg.PeerGrace = DefaultPeerGrace
	}
	cfg.Server.AnnounceListen = true
	cfg.Client.Gate = true
	if err := cfg.Server.Validate(); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	if err := cfg.Client.Validate(); err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	var wg sync.WaitGroup
	var sg, cg *Guest
	var serr, cerr error
	wg.Add(2)
	go func() { defer wg.Done(); sg, serr = BootStack(ctx, cfg.Server, opts...) }()
	go func() { defer wg.Done(); cg, cerr = BootStack(ctx, cfg.Client, opts...) }()
	wg.Wait()
	if serr != nil || cerr != nil {
		if sg != nil {
			sg.Close()
		}
		if cg != nil {
			cg.Close()
		}
		return nil, errors.Join(serr, cerr)
	}
	return &StackPair{Server: sg, Client: cg, cfg: cfg}, nil
}

// Run follows both guests until both reported VRDMA-EXIT (or died, or were
// stopped), releasing the client as StackPairConfig says, and passes every
// console line to out with its role (RoleServer, RoleClient) as it comes;
// out is called from two goroutines, one per guest, and must serialise
// itself. The error is nil when both guests reported their exit; else it
// joins what went wrong (a guest gone, ctx's error). The result is filled
// in every case; see StackPairResult.ExitCode.
func (p *StackPair) Run(ctx context.Context, out func(role string, l StackLine)) (StackPairResult, error) {
	var res StackPairResult
	sctx, stopServer := context.WithCancel(ctx)
	defer stopServer()
	cctx, stopClient := context.WithCancel(ctx)
	defer stopClient()

	type done struct {
		role string
		res  CommandResult
		err  error
	}
	results := make(chan done, 2)
	follow := func(rctx context.Context, g *Guest, role string) {
		var f func(StackLine)
		if out != nil {
			f = func(l StackLine) { out(role, l) }
		}
		r, err := g.RunCommand(rctx, f)
		results <- done{role, r, err}
	}
	go follow(sctx, p.Server, RoleServer)
	go follow(cctx, p.Client, RoleClient)

	gctx, stopGate := context.WithCancel(ctx)
	gateDone := make(chan struct{})
	go func() {
		defer close(gateDone)
		res.Released = p.gate(gctx)
	}()

	var serr, cerr error
	var grace <-chan time.Time
	var graceStop func() // stops the side that still runs
	for n := 0; n < 2; {
		select {
		case d := <-results:
			n++
			if d.role == RoleServer {
				res.Server, serr = d.res, d.err
				graceStop = func() { res.ClientStopped = true; stopClient(); p.Client.Kill() }
			} else {
				res.Client, cerr = d.res, d.err
				graceStop = func() { res.ServerStopped = true; stopServer(); p.Server.Kill() }
			}
			if n == 1 && !(d.res.Reported && d.res.ExitCode == 0) {
				grace = time.After(p.cfg.PeerGrace)
			}
		case <-grace:
			grace = nil
			graceStop()
		}
	}
	stopGate()
	<-gateDone
	// A side the harness stopped ended by its own context: not an error
	// of the run.
	if res.ServerStopped {
		serr = nil
	}
	if res.ClientStopped {
		cerr = nil
	}
	return res, errors.Join(serr, cerr)
}

// gate releases the client when the server is ready (see StackPairConfig)
// and says why; "" when ctx ended first.
func (p *StackPair) gate(ctx context.Context) string {
	why := ""
	lines := p.Server.Lines()
	var ready <-chan time.Time
wait:
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-ready:
			why = "ready-timeout"
			break wait
		case s, ok := <-lines:
			if !ok {
				why = "server-ended"
				break wait
			}
			for _, part := range splitLine(s) {
				switch k, _ := Classify(part); k {
				case KindCmdStart:
					if p.cfg.ReadyTimeout < 0 {
						why = "immediately"
						break wait
					}
					ready = time.After(p.cfg.ReadyTimeout)
				case KindListen:
					why = "listen"
					break wait
				case KindCmdExit, KindExit:
					why = "server-ended"
					break wait
				}
			}
		}
	}
	if err := p.Client.Release(ctx); err != nil {
		return ""
	}
	return why
}

// Log returns both guests' logs (see Guest.Log).
func (p *StackPair) Log() string { return p.Server.Log() + p.Client.Log() }

// Close closes both guests (see Guest.Close).
func (p *StackPair) Close() error {
	var wg sync.WaitGroup
	var serr, cerr error
	wg.Add(2)
	go func() { defer wg.Done(); serr = p.Server.Close() }()
	go func() { defer wg.Done(); cerr = p.Client.Close() }()
	wg.Wait()
	return errors.Join(serr, cerr)
}
