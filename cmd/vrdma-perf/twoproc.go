package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// Two-process mode (--socket): one side per process, the QP and buffer
// exchanged over TCP as perftest exchanges them (the format is in the
// package comment and exchange.go), the run itself internal/perftest's.

const (
	defaultPort     = 18515            // perftest's DEF_PORT
	maxPaths        = 64               // --paths
	connectTimeout  = 10 * time.Second // the client dials until then while the server is not listening yet
	dialRetry       = 100 * time.Millisecond
	exchangeTimeout = 10 * time.Second // each step of the exchange (hello, fin)
	maxRunTimeout   = 24 * time.Hour
)

// errMultipath is --paths > 1's error with --sockets: spraying is between
// hosts, and two devices of one vrdmad reach each other in memory.
var errMultipath = errors.New("--paths > 1: spraying is between hosts (two-process mode, --socket); the devices of --sockets share a vrdmad")

// checkTwoProc rejects what two-process mode does not run.
func (o *options) checkTwoProc() error {
	switch {
	case o.lat:
		return fmt.Errorf("--op %s_lat: with --socket, vrdma-perf runs bandwidth tests (write, read, send, atomic); latency tests need --sockets", o.op)
	case o.qps != 1:
		return errors.New("-q: with --socket, vrdma-perf runs one QP pair")
	case o.duration != 0:
		return errors.New("-D: with --socket, vrdma-perf runs -n iterations")
	case len(o.sizes) != 1:
		return errors.New("-a: with --socket, vrdma-perf runs one message size")
	case o.port < 1 || o.port > 65535:
		return fmt.Errorf("--port %d: want 1 … 65535", o.port)
	}
	return nil
}

// config is the internal/perftest test of o.
func (o *options) config(budget uint64) perftest.Config {
	size := o.sizes[0]
	// The server sees no completion during a write, read or atomic run:
	// the bound on a wait covers the whole run.
	t := float64(perftest.DefaultTimeout) + float64(o.iters)*float64(size)*float64(stallPerByte)
	return perftest.Config{Op: o.op, Size: size, Iters: o.iters,
		LatIters: max(1, o.latIters), // perftest's 0 is its default
		TxDepth:  o.txDepth, Budget: budget, Verify: o.verify, GIDIndex: uint32(o.gidIndex), Paths: uint32(o.paths),
		Timeout: time.Duration(min(t, float64(maxRunTimeout)))}
}

// differs says how the peer's test differs from ours ("" when it does
// not), naming the sides.
func (h *hello) differs(p *hello, we, they string) string {
	var d []string
	check := func(name string, ours, theirs any) {
		if ours != theirs {
			d = append(d, fmt.Sprintf("%s %v on the %s, %v on the %s", name, ours, we, theirs, they))
		}
	}
	check("--op", h.op, p.op)
	check("--verify", h.verify, p.verify)
	check("-s", h.size, p.size)
	check("-n", h.iters, p.iters)
	check("--lat-iters", h.latIters, p.latIters)
	check("-t", h.txDepth, p.txDepth)
	return strings.Join(d, ", ")
}

// twoProc runs one side of a test: the server without o.host, the client
// with it.
func twoProc(ctx context.Context, o options, out io.Writer) error {
	region, mem, err := plan(o)
	if err != nil {
		return err
	}
	cfg := o.config(region)
	server := o.host == ""
	c, f, err := frontend.OpenRDMA(ctx, o.socket, mem)
	if err != nil {
		return fmt.Errorf("open %s: %w", o.socket, err)
	}
	defer f.Close()
	defer c.Close()
	port, err := c.QueryPort()
	if err != nil {
		return fmt.Errorf("%s: query port: %w", o.socket, err)
	}
	gid, err := c.QueryGIDAt(uint32(o.gidIndex))
	if err != nil {
		return fmt.Errorf("%s: query gid: %w", o.socket, err)
	}
	s, err := perftest.NewSide(c, cfg, server)
	if err != nil {
		return fmt.Errorf("%s: %w", o.socket, err)
	}
	defer s.Close()
	ep := s.Endpoint()
	me := hello{op: o.op, verify: o.verify, txDepth: uint32(o.txDepth), size: cfg.Size, iters: uint64(cfg.Iters),
		latIters: uint64(cfg.LatIters), qpn: ep.QPN, psn: ep.PSN, gid: gid,
		rkey: ep.RKey, addr: ep.Addr, bufSize: ep.Size}

	var conn net.Conn
	if server {
		conn, err = accept(ctx, o.port)
	} else {
		conn, err = dial(ctx, net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	peer, err := exchangeHellos(conn, &me, server)
	if err != nil {
		return fmt.Errorf("exchange with %s: %w", conn.RemoteAddr(), err)
	}

	ti := testInfo{device: o.socket, linkLayer: port.LinkLayer, mtu: 4096, outReads: int(c.Config().MaxQPRdAtom),
		local:    []qpAddr{{lid: port.LID, qpn: me.qpn, psn: me.psn, rkey: me.rkey, vaddr: me.addr, gid: me.gid}},
		remote:   []qpAddr{{lid: port.LID, qpn: peer.qpn, psn: peer.psn, rkey: peer.rkey, vaddr: peer.addr, gid: peer.gid}},
		exchange: "Ethernet"}
	var rep *reporter
	if !o.json {
		rep = newReporter(out, &o, ti)
		rep.header()
	}

	pe := perftest.Endpoint{GID: net.IP(peer.gid[:]).String(), QPN: peer.qpn, PSN: peer.psn, RKey: peer.rkey, Addr: peer.addr, Size: peer.bufSize}
	var r result
	var runErr error
	if server {
		r, runErr = s.Serve(pe)
	} else {
		r, runErr = s.Run(pe)
	}
	// Each side tells the other how it ended, then reads the same.
	fe := fin{ok: runErr == nil}
	if runErr != nil {
		fe.reason = runErr.Error()
	}
	conn.SetDeadline(time.Now().Add(exchangeTimeout))
	_, werr := conn.Write(fe.encode())
	pf, ferr := readFin(conn)
	switch {
	case runErr != nil:
		return runErr
	case werr != nil:
		return fmt.Errorf("exchange with %s: send fin: %w", conn.RemoteAddr(), werr)
	case ferr != nil:
		return fmt.Errorf("exchange with %s: peer's fin: %w", conn.RemoteAddr(), ferr)
	case !pf.ok:
		return fmt.Errorf("peer %s failed: %s", conn.RemoteAddr(), pf.reason)
	}

	if o.json {
		return json.NewEncoder(out).Encode(r)
	}
	rep.row(&bwResult{size: r.Size, iters: uint64(r.Iters), secs: max(r.Seconds, 1e-9), depth: r.TxDepth, slots: r.Slots})
	rep.footer()
	return nil
}

// accept waits for one client on port (all interfaces, as perftest's
// server) until ctx ends.
func accept(ctx context.Context, port int) (net.Conn, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("waiting for a client: %w", ctx.Err())
		}
		return nil, fmt.Errorf("accept: %w", err)
	}
	return conn, nil
}

// dial connects to the server at addr, retrying for connectTimeout while
// nothing listens there yet.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			return conn, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connect to %s: no server within %v: %w", addr, connectTimeout, err)
		case <-time.After(dialRetry):
		}
	}
}

// exchangeHellos sends me and reads the peer's hello (the client first),
// each bounded by exchangeTimeout, and checks that both run the same
// test. A server that disagrees tells the client why in a fin.
func exchangeHellos(conn net.Conn, me *hello, server bool) (*hello, error) {
	conn.SetDeadline(time.Now().Add(2 * exchangeTimeout))
	defer conn.SetDeadline(time.Time{})
	if !server {
		if _, err := conn.Write(me.encode()); err != nil {
			return nil, fmt.Errorf("send hello: %w", err)
		}
	}
	peer, err := readHello(conn)
	if err != nil {
		return nil, err
	}
	we, they := "client", "server"
	if server {
		we, they = they, we
	}
	if d := me.differs(&peer, we, they); d != "" {
		if server {
			f := fin{reason: "the server runs a different test: " + d}
			conn.Write(f.encode())
		}
		return nil, fmt.Errorf("the peer runs a different test: %s", d)
	}
	if server {
		if _, err := conn.Write(me.encode()); err != nil {
			return nil, fmt.Errorf("send hello: %w", err)
		}
	}
	return &peer, nil
}
