package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// result is one measurement: perftest's, whose JSON keys vrdma-guest
// prints too, so the tools share one contract. vrdma-perf leaves Role
// empty in one process (omitted from the JSON).
type result = perftest.Result

// Memory set aside in each front-end's guest memory for rings, the control
// scratch and the event buffers, plus per QP for its rings.
const (
	memOverhead   = 32 << 20
	qpOverhead    = 256 << 10
	defaultBudget = 256 << 20        // buffer bytes per side when --guest-mem is not given
	stallTimeout  = 10 * time.Second // plus stallPerByte per message byte
	stallPerByte  = 20 * time.Nanosecond
	// Receives kept posted on each side of a send latency test.
	latRecvs = 4
)

// remoteAccess is what each side's QPs let the peer do.
const remoteAccess = abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic

// side is one device with its verbs objects: one CQ shared by its QPs (as
// perftest's), and one registered buffer holding a region per QP.
type side struct {
	name string // "client" or "server", for messages
	dev  string // what the table calls the device
	ctx  *verbs.Context
	f    *frontend.Frontend
	gid  [16]byte
	port abi.PortAttr
	link linkParams
	pd   *verbs.PD
	cq   *verbs.CQ
	qps  []*verbs.QP
	buf  *verbs.Buffer
	mr   *verbs.MR
}

func (s *side) close() {
	if s.ctx != nil {
		s.ctx.Close()
	}
	if s.f != nil {
		s.f.Close()
	}
}

// sideSpec is what openSide creates.
type sideSpec struct {
	name, dev, socket string
	mem               uint64 // guest memory of the front-end
	bufBytes          int    // the registered buffer
	sq, rq            int    // each QP's queue depths
}

func openSide(ctx context.Context, o *options, sp sideSpec) (*side, error) {
	s := &side{name: sp.name, dev: sp.dev}
	var err error
	if s.ctx, s.f, err = frontend.OpenRDMA(ctx, sp.socket, sp.mem); err != nil {
		return nil, fmt.Errorf("open %s: %w", sp.socket, err)
	}
	fail := func(what string, err error) (*side, error) {
		s.close()
		return nil, fmt.Errorf("%s: %s: %w", sp.socket, what, err)
	}
	if s.gid, err = s.ctx.QueryGIDAt(uint32(o.gidIndex)); err != nil {
		return fail("query gid", err)
	}
	if s.port, err = s.ctx.QueryPort(); err != nil {
		return fail("query port", err)
	}
	if s.link, err = linkFor(o, s.ctx, s.port); err != nil {
		s.close()
		return nil, fmt.Errorf("%s: %w", sp.socket, err)
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return fail("alloc pd", err)
	}
	if s.cq, err = s.ctx.CreateCQ(o.qps*(sp.sq+sp.rq) + 8); err != nil {
		return fail("create cq", err)
	}
	for i := range o.qps {
		qp, err := s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
			Cap: verbs.QPCap{MaxSendWR: sp.sq, MaxRecvWR: sp.rq, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: s.link.inline}})
		if err != nil {
			return fail(fmt.Sprintf("create qp %d", i), err)
		}
		s.qps = append(s.qps, qp)
	}
	if s.buf, err = s.ctx.AllocBuffer(sp.bufBytes); err != nil {
		return fail("alloc buffer", err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, 0, sp.bufBytes, abi.AccessAll); err != nil {
		return fail("reg mr", err)
	}
	return s, nil
}

// connect moves s's QP i to RTS towards the peer's (QPN, PSN) at gid.
func (s *side) connect(o *options, i int, gid [16]byte, qpn, psn, mtu uint32) error {
	opts := verbs.ConnectOpts{SGIDIndex: uint32(o.gidIndex), PathMTU: mtu}
	if o.twoProc {
		// --paths says how a QP to another host spreads; its default, 1,
		// overrides a vrdmad's --roce-paths as it always has.
		opts.Paths = uint32(o.paths)
	}
	if err := s.qps[i].ConnectRCOpts(gid, qpn, psn, remoteAccess, opts); err != nil {
		return fmt.Errorf("%s: connect qp %d: %w", s.name, i, err)
	}
	return nil
}

// queueDepths are the send and receive queue depths of each QP.
func queueDepths(o *options) (sq, rq int) {
	if o.lat {
		return 16, latRecvs + 2
	}
	rq = o.txDepth + 2
	if o.op == "send" {
		rq = max(rq, o.rxDepth+2)
	}
	return o.txDepth + 2, rq
}

// plan decides the buffer bytes per QP region of one flow on each side and
// the guest memory of each front-end.
func plan(o options) (region, mem uint64, err error) {
	maxMsg := slices.Max(o.sizes)
	areas := uint64(o.qps) * uint64(flowCount(&o))
	overhead := memOverhead + uint64(o.qps)*qpOverhead
	if o.lat {
		// An inbox and an outbox.
		region = 2 * maxMsg
	} else {
		budget := uint64(defaultBudget)
		if o.guestMem != 0 {
			if o.guestMem < overhead+areas*maxMsg {
				return 0, 0, fmt.Errorf("--guest-mem %d is too small for %d QPs of %d-byte buffers (need at least %d)",
					o.guestMem, o.qps, maxMsg, overhead+areas*maxMsg)
			}
			budget = o.guestMem - overhead
		}
		region = maxMsg * max(1, min(uint64(o.txDepth), budget/(areas*maxMsg)))
	}
	if o.guestMem != 0 {
		if o.guestMem < overhead+areas*region {
			return 0, 0, fmt.Errorf("--guest-mem %d is too small (need at least %d)", o.guestMem, overhead+areas*region)
		}
		return region, o.guestMem, nil
	}
	mem = areas*region + overhead
	return region, (mem + (1<<20 - 1)) &^ (1<<20 - 1), nil
}

// flowCount is the number of directions the test runs: two with -b.
func flowCount(o *options) int {
	if o.bidir {
		return 2
	}
	return 1
}

// bufferBytes is the registered buffer of each side for region.
func bufferBytes(o *options, region uint64) (int, error) {
	total := region * uint64(flowCount(o)) * uint64(o.qps)
	if total > 1<<40 {
		return 0, fmt.Errorf("buffers of %d bytes are too large", total)
	}
	return int(total), nil
}

// measure opens the two devices, runs the test for every size and prints
// the results on out.
func measure(ctx context.Context, o options, out io.Writer) error {
	region, mem, err := plan(o)
	if err != nil {
		return err
	}
	bufBytes, err := bufferBytes(&o, region)
	if err != nil {
		return err
	}
	sq, rq := queueDepths(&o)
	var sides [2]*side
	for i, name := range []string{"client", "server"} {
		s, err := openSide(ctx, &o, sideSpec{name: name, dev: o.deviceName(i, o.sockets[i]), socket: o.sockets[i],
			mem: mem, bufBytes: bufBytes, sq: sq, rq: rq})
		if err != nil {
			return err
		}
		defer s.close()
		sides[i] = s
	}
	a, b := sides[0], sides[1]
	for _, n := range a.link.notes {
		fmt.Fprintln(o.diag, n)
	}
	// Exchange (GID, QPN, PSN) in-process and connect, as perftest does
	// over TCP, at the path MTU both ends take.
	mtu := min(a.link.mtu, b.link.mtu)
	for i := range o.qps {
		if err := a.connect(&o, i, b.gid, b.qps[i].Num(), b.qps[i].PSN(), mtu); err != nil {
			return err
		}
		if err := b.connect(&o, i, a.gid, a.qps[i].Num(), a.qps[i].PSN(), mtu); err != nil {
			return err
		}
	}
	bn := newBench(o, region, out)
	bn.sides = []*side{a, b}
	bufA, bufB := peerBuf{addr: a.mr.Addr, rkey: a.mr.RKey}, peerBuf{addr: b.mr.Addr, rkey: b.mr.RKey}
	bn.addFlow(a, b, bufB, bufA)
	if o.bidir {
		bn.addFlow(b, a, bufA, bufB)
	}
	var rep *reporter
	if !o.json {
		rep = newReporter(out, &o, bn.info(a, b, mtu))
		rep.header()
	}
	for _, size := range o.sizes {
		r, row, err := bn.runSize(ctx, size, nil)
		if err != nil {
			return err
		}
		if o.json {
			if err := json.NewEncoder(out).Encode(r); err != nil { // one line
				return err
			}
			continue
		}
		rep.row(row)
	}
	if err := bn.checkCounters(); err != nil {
		return err
	}
	if rep != nil {
		rep.footer()
	}
	if o.verify {
		bn.tally.print(o.diag, "verified")
	}
	return nil
}

// runSize runs one message size on every local flow: it readies the local
// responders, passes barrier (two processes: both sides ready; nil in
// one), runs the test and returns this side's figures: the table's row (a
// *bwResult or *latResult; nil when this side only responds) and the
// JSON's.
func (bn *bench) runSize(ctx context.Context, size uint64, barrier func() error) (result, any, error) {
	o := &bn.o
	bn.setSize(size)
	var err error
	if o.lat {
		err = bn.latPrepare(size)
	} else {
		err = bn.prepare()
	}
	if err == nil && barrier != nil {
		err = barrier()
	}
	if err != nil {
		return result{}, nil, err
	}
	if o.lat {
		lr, err := bn.latency(ctx)
		if err != nil || lr == nil {
			return result{}, nil, err
		}
		return lr.result(o), lr, nil
	}
	rs, err := bn.bandwidth(ctx, size)
	if err != nil || len(rs) == 0 {
		return result{}, nil, err
	}
	sum := sumBW(rs)
	r := sum.result(o)
	if o.json && o.latIters > 0 && bn.flows[0].req != nil {
		if err := bn.latencyPass(ctx, &r); err != nil {
			return result{}, nil, err
		}
	}
	return r, sum, nil
}

// info is what the table's header shows; a is the local side in two
// processes, and b nil.
func (bn *bench) info(a, b *side, mtu uint32) testInfo {
	ti := testInfo{
		device:    a.dev,
		linkLayer: a.port.LinkLayer,
		mtu:       mtuBytes(mtu),
		inline:    a.link.inline,
		outReads:  int(a.ctx.Config().MaxQPRdAtom),
	}
	for i := range bn.o.qps {
		ti.local = append(ti.local, bn.addr(a, i))
		if b != nil {
			ti.remote = append(ti.remote, bn.addr(b, i))
		}
	}
	return ti
}

// addr is QP i's line of the address block.
func (bn *bench) addr(s *side, i int) qpAddr {
	return qpAddr{lid: s.port.LID, qpn: s.qps[i].Num(), psn: s.qps[i].PSN(), rkey: s.mr.RKey,
		vaddr: s.mr.Addr + bn.areaOff(0, i), gid: s.gid}
}
