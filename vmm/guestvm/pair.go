package guestvm

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Pair is a server guest and a client guest whose VRDMA-EXCHANGE lines are
// relayed to each other as VRDMA-PEER lines.
type Pair struct {
	Server, Client *Guest // immutable

	relayWG   sync.WaitGroup
	mu        sync.Mutex
	relayErrs []error // protected by mu
}

// PairResult holds the VRDMA-RESULT lines of both guests of a Pair.
type PairResult struct {
	Server, Client []Result
}

// StartPair boots the server and the client guest at the same time and
// starts relaying their exchange lines. On failure nothing stays behind.
// The caller must Close the Pair.
func StartPair(ctx context.Context, server, client Config, opts ...Option) (*Pair, error) {
	if server.Name == "" {
		server.Name = "server"
	}
	if client.Name == "" {
		client.Name = "client"
	}
	if server.Name == client.Name {
		return nil, configErr("Name", fmt.Sprintf("both guests are named %q", server.Name))
	}
	var wg sync.WaitGroup
	var sg, cg *Guest
	var serr, cerr error
	wg.Add(2)
	go func() { defer wg.Done(); sg, serr = Boot(ctx, server, opts...) }()
	go func() { defer wg.Done(); cg, cerr = Boot(ctx, client, opts...) }()
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
	p := &Pair{Server: sg, Client: cg}
	p.relayWG.Add(2)
	go p.relay(sg, cg)
	go p.relay(cg, sg)
	return p, nil
}

// relay writes every VRDMA-EXCHANGE payload of from to to as VRDMA-PEER,
// until from's console closes or the pair is closed. Nothing goes to to
// before it printed its own VRDMA-EXCHANGE, that is before its vrdma-guest
// reads its stdin: bytes that reach the guest's UART while it is being set
// up are lost.
func (p *Pair) relay(from, to *Guest) {
	defer p.relayWG.Done()
	if !to.waitFor(KindExchange) {
		return
	}
	for s := range from.Lines() {
		kind, payload := Classify(s)
		if kind != KindExchange {
			continue
		}
		if err := to.WriteLine(PrefixPeer + " " + payload); err != nil {
			p.mu.Lock()
			p.relayErrs = append(p.relayErrs, fmt.Errorf("relay %s -> %s: %w", from.Name(), to.Name(), err))
			p.mu.Unlock()
		}
	}
}

// Wait waits for both guests' results (see Guest.WaitResult). The error
// joins both guests' errors and any failure to relay an exchange line;
// the results read so far are returned in every case.
func (p *Pair) Wait(ctx context.Context) (PairResult, error) {
	var res PairResult
	var serr, cerr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); res.Server, serr = p.Server.WaitResult(ctx) }()
	go func() { defer wg.Done(); res.Client, cerr = p.Client.WaitResult(ctx) }()
	wg.Wait()
	p.mu.Lock()
	rerr := errors.Join(p.relayErrs...)
	p.mu.Unlock()
	return res, errors.Join(serr, cerr, rerr)
}

// Log returns both guests' logs (see Guest.Log).
func (p *Pair) Log() string { return p.Server.Log() + p.Client.Log() }

// Close closes both guests and waits for the relays.
func (p *Pair) Close() error {
	var wg sync.WaitGroup
	var serr, cerr error
	wg.Add(2)
	go func() { defer wg.Done(); serr = p.Server.Close() }()
	go func() { defer wg.Done(); cerr = p.Client.Close() }()
	wg.Wait()
	p.relayWG.Wait()
	return errors.Join(serr, cerr)
}
