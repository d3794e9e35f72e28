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
)

// Two-process mode (--socket or one -d): one side per process, the QPs and
// buffer exchanged over TCP as perftest exchanges them (the format is in
// the package comment and exchange.go), the run itself the same loops as
// in one process, each side running the flows' halves it holds.

const (
	defaultPort     = 18515            // perftest's DEF_PORT
	maxPaths        = 64               // --paths
	connectTimeout  = 10 * time.Second // the client dials until then while the server is not listening yet
	dialRetry       = 100 * time.Millisecond
	exchangeTimeout = 10 * time.Second // each step of the exchange (hello, ready, fin)
	runAllowance    = 2 * time.Minute  // beyond a run's own length, how long a side waits for the peer's done
	stallPerOp      = 50 * time.Microsecond
)

// errMultipath is --paths > 1's error in one process: spraying is between
// hosts, and two devices of one vrdmad reach each other in memory.
var errMultipath = errors.New("--paths > 1: spraying is between hosts (two-process mode, --socket); the devices of --sockets share a vrdmad")

// checkTwoProc rejects what two-process mode does not run.
func (o *options) checkTwoProc() error {
	if o.port < 1 || o.port > 65535 {
		return fmt.Errorf("--port %d: want 1 … 65535", o.port)
	}
	return nil
}

// hello is this side's hello for s.
func (o *options) hello(s *side) hello {
	h := hello{op: o.op, verify: o.verify, lat: o.lat, bidir: o.bidir, all: o.all, txDepth: uint32(o.txDepth),
		iters: uint64(o.iters), latIters: uint64(o.latIters), mtu: uint32(mtuBytes(s.link.mtu)), inline: uint32(s.link.inline),
		gid: s.gid, rkey: s.mr.RKey, addr: s.mr.Addr, bufSize: uint64(len(s.mr.Bytes()))}
	if !o.all {
		h.size = o.sizes[0]
	}
	if o.duration != 0 {
		h.duration, h.iters = true, uint64(o.duration)
	}
	for _, qp := range s.qps {
		h.qps = append(h.qps, qpEnd{qpn: qp.Num(), psn: qp.PSN()})
	}
	return h
}

// runBound is how long a side waits for the peer to be done with a size:
// the run's own length, generously, plus runAllowance.
func (bn *bench) runBound() time.Duration {
	o := &bn.o
	ops := float64(o.iters*o.qps + o.latIters)
	perOp := float64(stallPerOp) + float64(bn.size)*float64(stallPerByte)
	return runAllowance + o.duration + time.Duration(min(ops*perOp, float64(24*time.Hour)))
}

// twoProc runs one side of a test: the server without o.host, the client
// with it.
func twoProc(ctx context.Context, o options, out io.Writer) error {
	region, mem, err := plan(o)
	if err != nil {
		return err
	}
	bufBytes, err := bufferBytes(&o, region)
	if err != nil {
		return err
	}
	server := o.host == ""
	name := "client"
	if server {
		name = "server"
	}
	sq, rq := queueDepths(&o)
	s, err := openSide(ctx, &o, sideSpec{name: name, dev: o.deviceName(0, o.socket), socket: o.socket,
		mem: mem, bufBytes: bufBytes, sq: sq, rq: rq})
	if err != nil {
		return err
	}
	defer s.close()
	for _, n := range s.link.notes {
		fmt.Fprintln(o.diag, n)
	}
	var conn net.Conn
	if server {
		conn, err = accept(ctx, o.port)
	} else {
		conn, err = dial(ctx, net.JoinHostPort(o.host, strconv.Itoa(o.port)))
	}
	if err != nil {
		return err
	}
	sess := newSession(conn)
	defer sess.close()
	me := o.hello(s)
	peer, err := sess.exchangeHellos(ctx, &me, server)
	if err != nil {
		return err
	}
	if err := runTwoProc(ctx, &o, s, sess, peer, region, out); err != nil {
		sess.fail(err)
		return err
	}
	return nil
}

// runTwoProc connects s's QPs to the peer's and runs every size.
func runTwoProc(ctx context.Context, o *options, s *side, sess *session, peer *hello, region uint64, out io.Writer) error {
	mtu := min(s.link.mtu, mtuCode(int(peer.mtu)))
	if mtu == 0 {
		return fmt.Errorf("exchange: %w: the peer's path MTU is %d bytes", errMalformed, peer.mtu)
	}
	for i, q := range peer.qps {
		if err := s.connect(o, i, peer.gid, q.qpn, q.psn, mtu); err != nil {
			return err
		}
	}
	bn := newBench(*o, region, out)
	bn.sides, bn.peer = []*side{s}, sess
	mine, theirs := peerBuf{addr: s.mr.Addr, rkey: s.mr.RKey}, peerBuf{addr: peer.addr, rkey: peer.rkey}
	server := o.host == ""
	// Flow 0 is the client's traffic to the server, flow 1 (-b) the
	// server's to the client.
	for i := range flowCount(o) {
		if (i == 0) != server {
			bn.addFlow(s, nil, theirs, mine)
		} else {
			bn.addFlow(nil, s, mine, theirs)
		}
	}
	var rep *reporter
	if !o.json {
		ti := bn.info(s, nil, mtu)
		ti.exchange = "Ethernet"
		for i, q := range peer.qps {
			ti.remote = append(ti.remote, qpAddr{lid: s.port.LID, qpn: q.qpn, psn: q.psn, rkey: peer.rkey,
				vaddr: peer.addr + bn.areaOff(0, i), gid: peer.gid})
		}
		rep = newReporter(out, o, ti)
		rep.header()
	}
	// A size's row is printed once the peer's next ready (or its fin)
	// shows that its checks of that size passed.
	var pending func() error
	flush := func() error {
		if pending == nil {
			return nil
		}
		p := pending
		pending = nil
		return p()
	}
	for _, size := range o.sizes {
		barrier := func() error {
			if err := sess.barrier(ctx, size, exchangeTimeout+bn.stall()); err != nil {
				return err
			}
			return flush()
		}
		r, row, err := bn.runSize(ctx, size, barrier)
		if err != nil {
			return err
		}
		d := bn.doneOf(size, row, &r)
		if err := sess.send(d.encode()); err != nil {
			return err
		}
		pd, err := bn.awaitPeer(ctx, size)
		if err != nil {
			return err
		}
		if err := bn.serve(ctx, pd); err != nil {
			return err
		}
		r, row = bn.combine(row, r, &pd)
		pending = func() error {
			if o.json {
				return json.NewEncoder(out).Encode(r)
			}
			rep.row(row)
			return nil
		}
	}
	pf, err := sess.finish(ctx, strings.Join(bn.tally.lines(), "\n"))
	if err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	if rep != nil {
		rep.footer()
	}
	if o.verify {
		bn.tally.print(o.diag, "verified")
		peerName := "server"
		if server {
			peerName = "client"
		}
		printText(o.diag, "verified by the "+peerName, pf.text)
	}
	return nil
}

// doneOf is this side's done for size: what its requester posted, and
// its figures (row: a *bwResult, a *latResult, or nil) with r's latency
// pass.
func (bn *bench) doneOf(size uint64, row any, r *result) done {
	d := done{size: size}
	for _, f := range bn.flows {
		if f.req != nil {
			for _, st := range f.qs {
				d.posted = append(d.posted, st.posted)
			}
		}
	}
	switch x := row.(type) {
	case *bwResult:
		d.figures, d.iters, d.secs, d.bps, d.mps, d.peak = true, x.iters, x.secs, x.bps, x.mps, x.peak
		d.passP50, d.passP99, d.passAvg, d.passIters = r.LatP50, r.LatP99, r.LatAvg, uint64(r.LatIters)
	case *latResult:
		d.figures, d.latDuration, d.iters, d.secs = true, x.duration, x.iters, x.secs
		d.min, d.max, d.typical, d.avg, d.stdev, d.p99, d.p999, d.tps = x.min, x.max, x.typical, x.avg, x.stdev, x.p99, x.p999, x.tps
	}
	return d
}

// awaitPeer waits for the peer's done with size. A side that receives
// the peer's sends keeps reaping and replacing its receives meanwhile;
// any other sleeps on the connection.
func (bn *bench) awaitPeer(ctx context.Context, size uint64) (done, error) {
	sess := bn.peer
	if !bn.receives() {
		return sess.waitDone(ctx, size, bn.o.qps, bn.runBound())
	}
	last := time.Now()
	for spins := 0; ; spins++ {
		n, err := bn.pollAll()
		if err != nil {
			return done{}, err
		}
		if n > 0 {
			last, spins = time.Now(), 0
			continue
		}
		if spins&1023 == 1023 {
			if sess.peerDone(size) {
				return sess.waitDone(ctx, size, bn.o.qps, exchangeTimeout)
			}
			if err := bn.idle(ctx, last, "waiting for the peer's sends, %s", bn.progress()); err != nil {
				return done{}, err
			}
		}
		relax(spins)
	}
}

// receives says whether this side receives the peer's sends.
func (bn *bench) receives() bool {
	if bn.o.op != "send" || bn.o.lat {
		return false
	}
	for _, f := range bn.flows {
		if f.resp != nil && f.req == nil {
			return true
		}
	}
	return false
}

// serve finishes this side's part as the responder of the peer's flow,
// once the peer is done: every receive the peer's sends need reaped, and
// with --verify what they left in its buffer checked.
func (bn *bench) serve(ctx context.Context, pd done) error {
	for _, f := range bn.flows {
		if f.req != nil || f.resp == nil {
			continue
		}
		if len(pd.posted) != len(f.qs) {
			return fmt.Errorf("exchange: %w: the peer's done has no counts for the QPs it sent on", errMalformed)
		}
		for q := range f.qs {
			if pd.posted[q] < f.peerTo[q] {
				return fmt.Errorf("exchange: %w: the peer's count of qp %d went back from %d to %d", errMalformed, q, f.peerTo[q], pd.posted[q])
			}
		}
		copy(f.peerFrom, f.peerTo)
		copy(f.peerTo, pd.posted)
		if bn.o.lat {
			if err := bn.lt.finalCheck(f.peerTo[0]); err != nil {
				return err
			}
			continue
		}
		last := time.Now()
		for spins := 0; bn.o.op == "send" && !allReceived(f); spins++ {
			n, err := bn.pollAll()
			if err != nil {
				return err
			}
			if n > 0 {
				last, spins = time.Now(), 0
				continue
			}
			if spins&1023 == 1023 {
				if err := bn.idle(ctx, last, "the peer's last sends"); err != nil {
					return err
				}
			}
			relax(spins)
		}
		if err := bn.verifyResponder(f); err != nil {
			return err
		}
	}
	return nil
}

func allReceived(f *flow) bool {
	for q := range f.qs {
		if f.qs[q].recvd < f.peerTo[q] {
			return false
		}
	}
	return true
}

// combine is the size's row and JSON result on this side: the client's
// figures (with -b the sum of both sides'), from pd where they are the
// peer's.
func (bn *bench) combine(row any, r result, pd *done) (result, any) {
	o := &bn.o
	client := o.host != ""
	role := "server"
	if client {
		role = "client"
	}
	switch {
	case o.lat:
		if !client {
			lr := pd.lat(bn.size)
			row, r = lr, lr.result(o)
		}
	default:
		var rs []*bwResult
		if x, ok := row.(*bwResult); ok {
			rs = append(rs, x)
		}
		if pd.figures {
			p := pd.bw(bn.size, bn.depth, bn.slots)
			if client {
				rs = append(rs, p)
			} else {
				rs = append([]*bwResult{p}, rs...)
			}
		}
		if len(rs) == 0 {
			return r, nil
		}
		sum := sumBW(rs)
		pass := r
		if !client {
			pass = result{LatP50: pd.passP50, LatP99: pd.passP99, LatAvg: pd.passAvg, LatIters: int(pd.passIters)}
		}
		row, r = sum, sum.result(o)
		r.LatP50, r.LatP99, r.LatAvg, r.LatIters = pass.LatP50, pass.LatP99, pass.LatAvg, pass.LatIters
	}
	r.Role = role
	return r, row
}

// bw is the peer's bandwidth figures.
func (d *done) bw(size uint64, depth, slots int) *bwResult {
	return &bwResult{size: size, iters: d.iters, secs: d.secs, bps: d.bps, mps: d.mps, peak: d.peak, depth: depth, slots: slots}
}

// lat is the peer's latency figures.
func (d *done) lat(size uint64) *latResult {
	return &latResult{size: size, iters: d.iters, secs: d.secs, min: d.min, max: d.max, typical: d.typical, avg: d.avg,
		stdev: d.stdev, p99: d.p99, p999: d.p999, duration: d.latDuration, tps: d.tps}
}
