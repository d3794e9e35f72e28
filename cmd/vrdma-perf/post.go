package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The work loop of a measurement: posting sends and receives, polling the
// CQs, checking completions and data, and the latency pass.

// wrid is the work request ID of operation seq of flow f, QP q.
func wrid(f *flow, q int, seq uint64) uint64 {
	return uint64(f.idx)<<wridFlowShift | uint64(q)<<wridShift | seq&wridSeq
}

// post posts flow f, QP q's next operation.
func (bn *bench) post(f *flow, q int) error {
	st := &f.qs[q]
	seq := st.posted
	off := bn.slotOff(f, q, seq)
	local := f.req.mr.Bytes()[off : off+bn.size]
	wr := &bn.wr[0]
	*wr = verbs.SendWR{WRID: wrid(f, q, seq), Flags: abi.WRFlagSignaled, SGL: wr.SGL[:0]}
	if cap(wr.SGL) == 0 {
		wr.SGL = make([]abi.SGE, 0, 1)
	}
	verify := bn.o.verify
	switch bn.o.op {
	case "write":
		if verify {
			perftest.Pattern(local, bn.patternIndex(f, q, seq))
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WROpRDMAWrite, f.dst.addr+off, f.dst.rkey
	case "read":
		if verify {
			clear(local) // what the read brings must be the responder's
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WROpRDMARead, f.dst.addr+off, f.dst.rkey
	case "send":
		if verify {
			perftest.Pattern(local, bn.patternIndex(f, q, seq))
		}
		wr.Opcode = abi.WROpSend
	case "atomic":
		wr.Opcode, wr.RemoteAddr, wr.RKey, wr.CompareAdd = abi.WROpAtomicFetchAdd, f.dst.addr+bn.areaOff(f.idx, q), f.dst.rkey, 1
	}
	if bn.size <= uint64(f.req.link.inline) && wr.Opcode != abi.WROpRDMARead && wr.Opcode != abi.WROpAtomicFetchAdd {
		// -I: the data travels in the work request (IBV_SEND_INLINE).
		wr.Inline, wr.Flags = local, wr.Flags|abi.WRFlagInline
	} else {
		wr.SGL = append(wr.SGL, abi.SGE{Addr: f.req.mr.Addr + off, Length: uint32(bn.size), LKey: f.req.mr.LKey})
	}
	if err := bn.postSend(f.req.qps[q], nil); err != nil {
		return fmt.Errorf("%s: post %s %d on qp %d: %w", f.req.name, bn.o.op, seq, q, err)
	}
	st.posted++
	return nil
}

// postSend posts bn.wr on qp. The device may complete a WQE before it
// advances sq_ci past it: a full send queue is then a matter of
// microseconds. drain, if not nil, is called while it waits.
func (bn *bench) postSend(qp *verbs.QP, drain func() error) error {
	var deadline time.Time
	for spins := 0; ; spins++ {
		err := qp.PostSend(bn.wr[:]...)
		if !errors.Is(err, verbs.ErrQueueFull) {
			return err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(bn.stall())
		} else if time.Now().After(deadline) {
			return fmt.Errorf("send queue full for %v", bn.stall())
		}
		if drain != nil {
			if err := drain(); err != nil {
				return err
			}
		}
		relax(spins)
	}
}

// fillRecvs posts receives on flow f's responder until each QP has rdepth.
func (bn *bench) fillRecvs(f *flow) error {
	for q := range f.qs {
		for st := &f.qs[q]; st.recvs-st.recvd < uint64(bn.rdepth); {
			if err := bn.postRecv(f, q); err != nil {
				return err
			}
		}
	}
	return nil
}

// postRecv posts flow f, QP q's next receive on its responder.
func (bn *bench) postRecv(f *flow, q int) error {
	st := &f.qs[q]
	j := st.recvs
	r := &bn.rwr[0]
	if cap(r.SGL) == 0 {
		r.SGL = make([]abi.SGE, 1)
	}
	r.WRID = wridRecv | wrid(f, q, j)
	r.SGL[0] = abi.SGE{Addr: f.resp.mr.Addr + bn.recvOff(f, q, j), Length: uint32(bn.maxMsg), LKey: f.resp.mr.LKey}
	if err := f.resp.qps[q].PostRecv(bn.rwr[:]...); err != nil {
		return fmt.Errorf("%s: post recv %d on qp %d: %w", f.resp.name, j, q, err)
	}
	st.recvs++
	return nil
}

// wcStatusName is a completion status as libibverbs names it
// (ibv_wc_status: IBV_WC_RETRY_EXC_ERR), or its number when it has no
// name.
func wcStatusName(s abi.WCStatus) string {
	n := s.String()
	if strings.HasPrefix(n, "WCStatus(") { // abi's name for a status it does not know
		return fmt.Sprintf("status %d", uint8(s))
	}
	return "IBV_WC_" + n
}

// wcErr is a failed completion on side, named as perftest's "Completion
// with error" names it, with libibverbs' status name.
func wcErr(side string, wc *verbs.WC) error {
	what := "work request"
	if wc.WRID&wridRecv != 0 {
		what = "receive"
	}
	return fmt.Errorf("%s: qp %d: %s %d completed with error %s (status %d, vendor error %#x)",
		side, wc.WRID>>wridShift&wridQPMask, what, wc.WRID&wridSeq, wcStatusName(wc.Status), uint8(wc.Status), wc.VendorErr)
}

// pollAll reaps the completions there are on every local side.
func (bn *bench) pollAll() (int, error) {
	var n int
	for _, s := range bn.polled {
		m, err := bn.poll(s)
		if err != nil {
			return 0, err
		}
		n += m
	}
	return n, nil
}

// poll reaps s's completions, checking (and with --verify, verifying)
// each; a requester's operations complete into flow.fresh. It returns the
// number reaped.
func (bn *bench) poll(s *side) (int, error) {
	n, err := s.cq.Poll(bn.wc)
	if err != nil {
		return 0, fmt.Errorf("%s: poll cq: %w", s.name, err)
	}
	for i := range bn.wc[:n] {
		wc := &bn.wc[i]
		if wc.Status != abi.WCSuccess {
			return 0, wcErr(s.name, wc)
		}
		fi, q := int(wc.WRID>>wridFlowShift&1), int(wc.WRID>>wridShift&wridQPMask)
		if fi >= len(bn.flows) || q >= bn.o.qps {
			return 0, fmt.Errorf("%s: completion for an unknown work request %#x", s.name, wc.WRID)
		}
		f := bn.flows[fi]
		if wc.WRID&wridRecv != 0 {
			if f.resp != s {
				return 0, fmt.Errorf("%s: receive completion %#x of a flow it does not receive", s.name, wc.WRID)
			}
			if err := bn.received(f, q, wc); err != nil {
				return 0, err
			}
			continue
		}
		if f.req != s {
			return 0, fmt.Errorf("%s: completion %#x of a flow it does not send", s.name, wc.WRID)
		}
		if err := bn.completed(f, q, wc); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// completed takes the requester's completion of flow f, QP q.
func (bn *bench) completed(f *flow, q int, wc *verbs.WC) error {
	st := &f.qs[q]
	want := st.done
	if bn.o.op == "send" {
		want = st.sent
	}
	if got := wc.WRID & wridSeq; got != want&wridSeq {
		return fmt.Errorf("%s: qp %d: completion for work request %d, want %d (out of order)", f.req.name, q, got, want&wridSeq)
	}
	if bn.o.op == "send" {
		st.sent++
		bn.sendDone(f, st)
		return nil
	}
	if bn.o.verify {
		if err := bn.check(f, q, want); err != nil {
			return err
		}
	}
	st.done++
	f.fresh++
	return nil
}

// sendDone advances a send's done count: in one process an operation is
// done when both its send and its receive completed; in two, the requester
// counts its sends (perftest's client) and the responder its receives.
func (bn *bench) sendDone(f *flow, st *qpState) {
	d := st.sent
	if f.resp != nil {
		d = min(st.sent, st.recvd)
	}
	if f.req == nil {
		return
	}
	if d > st.done {
		f.fresh += d - st.done
		st.done = d
	}
}

// received takes the responder's receive completion of flow f, QP q:
// checked, verified with --verify, and replaced by a new receive.
func (bn *bench) received(f *flow, q int, wc *verbs.WC) error {
	st := &f.qs[q]
	seq := st.recvd
	if got := wc.WRID & wridSeq; got != seq&wridSeq {
		return fmt.Errorf("%s: qp %d: receive %d completed, want %d (out of order)", f.resp.name, q, got, seq&wridSeq)
	}
	if wc.ByteLen != uint32(bn.size) {
		return fmt.Errorf("%s: qp %d: receive %d got %d bytes, want %d", f.resp.name, q, seq, wc.ByteLen, bn.size)
	}
	if bn.o.verify {
		ro := bn.recvOff(f, q, seq)
		got := f.resp.mr.Bytes()[ro : ro+bn.size]
		if !perftest.PatternOK(got, bn.patternIndex(f, q, seq)) {
			return fmt.Errorf("verify: %s: qp %d: receive %d: bytes that arrived differ from the pattern sent", f.resp.name, q, seq)
		}
		bn.tally.add(tallySend, 1, bn.size)
	}
	st.recvd++
	if err := bn.postRecv(f, q); err != nil {
		return err
	}
	bn.sendDone(f, st)
	return nil
}

// check verifies the data of the requester's operation seq of flow f, QP
// q: what a write left in a local responder's buffer, what a read brought,
// what a fetch-and-add returned.
func (bn *bench) check(f *flow, q int, seq uint64) error {
	src := bn.slot(f.req, f, q, seq)
	switch bn.o.op {
	case "write":
		if f.resp == nil {
			return nil // the responder checks its buffer (verifyResponder)
		}
		if !bytes.Equal(src, bn.slot(f.resp, f, q, seq)) || !perftest.PatternOK(src, bn.patternIndex(f, q, seq)) {
			return fmt.Errorf("verify: %s: qp %d: write %d: bytes that arrived differ from the pattern sent", f.req.name, q, seq)
		}
		bn.tally.add(tallyWrite, 1, bn.size)
	case "read":
		if !perftest.PatternOK(src, bn.patternIndex(f, q, seq%uint64(bn.slots))) {
			return fmt.Errorf("verify: %s: qp %d: read %d: bytes read differ from the responder's pattern", f.req.name, q, seq)
		}
		bn.tally.add(tallyRead, 1, bn.size)
	case "atomic":
		if v := binary.LittleEndian.Uint64(src); v != seq {
			return fmt.Errorf("verify: %s: qp %d: fetch-and-add %d returned %d, want %d", f.req.name, q, seq, v, seq)
		}
		bn.tally.add(tallyFetchAdd, 1, bn.size)
	}
	return nil
}

// latencyPass measures one operation at a time on flow 0's QP 0, post to
// completion, after a bandwidth test with --json (lat_us_* of r).
func (bn *bench) latencyPass(ctx context.Context, r *result) error {
	saved := bn.depth
	bn.depth = 1
	defer func() { bn.depth = saved }()
	f := bn.flows[0]
	st := &f.qs[0]
	lat := make([]time.Duration, bn.o.latIters)
	for i := range lat {
		t0 := time.Now()
		if err := bn.post(f, 0); err != nil {
			return err
		}
		last := time.Now()
		for spins := 0; st.done < st.posted; {
			n, err := bn.pollAll()
			if err != nil {
				return err
			}
			if n > 0 {
				last = time.Now()
				continue
			}
			if spins++; spins&1023 == 0 {
				if err := bn.idle(ctx, last, "latency pass"); err != nil {
					return err
				}
			}
			relax(spins)
		}
		lat[i] = time.Since(t0)
	}
	for _, f := range bn.flows {
		f.fresh = 0 // not part of a bandwidth figure
	}
	r.SetLatencies(lat)
	return nil
}
