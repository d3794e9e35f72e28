package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The work loop of a measurement: posting sends and receives, polling the
// CQs, checking completions and data, and the latency pass.

// post posts QP q's next operation.
func (bn *bench) post(q int) error {
	st := &bn.qs[q]
	seq := st.posted
	a, b := bn.a, bn.b
	off := bn.slotOff(q, seq)
	wr := &bn.wr[0]
	*wr = verbs.SendWR{WRID: uint64(q)<<wridShift | seq&wridSeq, Flags: abi.WRFlagSignaled, SGL: wr.SGL[:0]}
	if cap(wr.SGL) == 0 {
		wr.SGL = make([]abi.SGE, 0, 1)
	}
	wr.SGL = append(wr.SGL, abi.SGE{Addr: a.mr.Addr + off, Length: uint32(bn.size), LKey: a.mr.LKey})
	pi := bn.patternIndex(q, seq)
	switch bn.o.op {
	case "write":
		if bn.o.verify {
			perftest.Pattern(bn.slot(a, q, seq), pi)
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WROpRDMAWrite, b.mr.Addr+off, b.mr.RKey
	case "read":
		if bn.o.verify {
			perftest.Pattern(bn.slot(b, q, seq), pi)
		}
		wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WROpRDMARead, b.mr.Addr+off, b.mr.RKey
	case "send":
		if bn.o.verify {
			perftest.Pattern(bn.slot(a, q, seq), pi)
		}
		wr.Opcode = abi.WROpSend
	case "atomic":
		wr.Opcode, wr.RemoteAddr, wr.RKey, wr.CompareAdd = abi.WROpAtomicFetchAdd, b.mr.Addr+bn.regionOff(q), b.mr.RKey, 1
	}
	if err := bn.postSend(a.qps[q], nil); err != nil {
		return fmt.Errorf("post %s %d on qp %d: %w", bn.o.op, seq, q, err)
	}
	st.posted++
	return nil
}

// postSend posts bn.wr on qp. The device may complete a WQE before it
// advances sq_ci past it: a full send queue is then a matter of
// microseconds. drain, if not nil, is called while it waits.
func (bn *bench) postSend(qp *verbs.QP, drain func() error) error {
	var deadline time.Time
	for {
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
		runtime.Gosched()
	}
}

// fillRecvs posts receives on the responder until each QP has depth.
func (bn *bench) fillRecvs() error {
	for q := range bn.qs {
		for st := &bn.qs[q]; st.recvs-st.recvd < uint64(bn.depth); {
			if err := bn.postRecv(q); err != nil {
				return err
			}
		}
	}
	return nil
}

// postRecv posts QP q's next receive on the responder.
func (bn *bench) postRecv(q int) error {
	st := &bn.qs[q]
	j := st.recvs
	r := &bn.rwr[0]
	if cap(r.SGL) == 0 {
		r.SGL = make([]abi.SGE, 1)
	}
	r.WRID = uint64(q)<<wridShift | j&wridSeq
	r.SGL[0] = abi.SGE{Addr: bn.b.mr.Addr + bn.recvOff(q, j), Length: uint32(bn.maxMsg), LKey: bn.b.mr.LKey}
	if err := bn.b.qps[q].PostRecv(bn.rwr[:]...); err != nil {
		return fmt.Errorf("post recv %d on qp %d: %w", j, q, err)
	}
	st.recvs++
	return nil
}

func wcErr(side string, wc *verbs.WC) error {
	return fmt.Errorf("%s: qp %d: work request %d completed with status %d (vendor error %d)",
		side, wc.WRID>>wridShift, wc.WRID&wridSeq, wc.Status, wc.VendorErr)
}

// wcQP returns the QP index of a completion, checked.
func (bn *bench) wcQP(side string, wc *verbs.WC) (int, error) {
	q := wc.WRID >> wridShift
	if q >= uint64(len(bn.qs)) {
		return 0, fmt.Errorf("%s: completion for an unknown work request %#x", side, wc.WRID)
	}
	return int(q), nil
}

// poll reaps the completions there are, checking (and with --verify,
// verifying) each; completed is told how many operations completed. It
// returns the number of completions reaped.
func (bn *bench) poll(completed func(uint64)) (int, error) {
	n, err := bn.a.cq.Poll(bn.wc)
	if err != nil {
		return 0, err
	}
	for i := range bn.wc[:n] {
		wc := &bn.wc[i]
		if wc.Status != abi.WCSuccess {
			return 0, wcErr("requester", wc)
		}
		q, err := bn.wcQP("requester", wc)
		if err != nil {
			return 0, err
		}
		st := &bn.qs[q]
		if bn.o.op == "send" {
			st.sent++
			if d := min(st.sent, st.recvd); d > st.done {
				completed(d - st.done)
				st.done = d
			}
			continue
		}
		if err := bn.check(q, wc); err != nil {
			return 0, err
		}
		st.done++
		completed(1)
	}
	if bn.o.op != "send" {
		return n, nil
	}
	m, err := bn.b.cq.Poll(bn.wc)
	if err != nil {
		return 0, err
	}
	for i := range bn.wc[:m] {
		wc := &bn.wc[i]
		if wc.Status != abi.WCSuccess {
			return 0, wcErr("responder", wc)
		}
		q, err := bn.wcQP("responder", wc)
		if err != nil {
			return 0, err
		}
		if err := bn.check(q, wc); err != nil {
			return 0, err
		}
		st := &bn.qs[q]
		st.recvd++
		if err := bn.postRecv(q); err != nil {
			return 0, err
		}
		if d := min(st.sent, st.recvd); d > st.done {
			completed(d - st.done)
			st.done = d
		}
	}
	return n + m, nil
}

// check verifies one completion of QP q: in order, and with --verify the
// bytes that arrived.
func (bn *bench) check(q int, wc *verbs.WC) error {
	st := &bn.qs[q]
	want := st.done
	if bn.o.op == "send" {
		want = st.recvd
	}
	if got := wc.WRID & wridSeq; got != want&wridSeq {
		return fmt.Errorf("qp %d: completion for work request %d, want %d (out of order)", q, got, want&wridSeq)
	}
	if !bn.o.verify {
		return nil
	}
	seq := want
	pi := bn.patternIndex(q, seq)
	var ok bool
	switch bn.o.op {
	case "write", "read":
		// Each buffer holds the operation's pattern on the source side;
		// the destination must hold the same bytes.
		src, dst := bn.slot(bn.a, q, seq), bn.slot(bn.b, q, seq)
		ok = bytes.Equal(src, dst) && perftest.PatternOK(src, pi)
	case "send":
		if wc.ByteLen != uint32(bn.size) {
			return fmt.Errorf("verify: qp %d: receive %d got %d bytes, want %d", q, seq, wc.ByteLen, bn.size)
		}
		ro := bn.recvOff(q, seq)
		got := bn.b.mr.Bytes()[ro : ro+bn.size]
		ok = bytes.Equal(bn.slot(bn.a, q, seq), got) && perftest.PatternOK(got, pi)
	case "atomic":
		if v := binary.LittleEndian.Uint64(bn.slot(bn.a, q, seq)); v != seq {
			return fmt.Errorf("verify: qp %d: fetch-and-add %d returned %d, want %d", q, seq, v, seq)
		}
		ok = true
	}
	if !ok {
		return fmt.Errorf("verify: qp %d: %s %d: bytes that arrived differ from the pattern sent", q, bn.o.op, seq)
	}
	return nil
}

// latencyPass measures one operation at a time on QP 0, post to
// completion, after a bandwidth test with --json (lat_us_* of r).
func (bn *bench) latencyPass(ctx context.Context, r *result) error {
	saved := bn.depth
	bn.depth = 1
	defer func() { bn.depth = saved }()
	if bn.o.op == "send" {
		if err := bn.fillRecvs(); err != nil {
			return err
		}
	}
	st := &bn.qs[0]
	lat := make([]time.Duration, bn.o.latIters)
	for i := range lat {
		t0 := time.Now()
		if err := bn.post(0); err != nil {
			return err
		}
		last := time.Now()
		for spins := 0; st.done < st.posted; {
			n, err := bn.poll(func(uint64) {})
			if err != nil {
				return err
			}
			if n > 0 {
				last = time.Now()
				continue
			}
			if spins++; spins&1023 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
				if time.Since(last) > bn.stall() {
					return fmt.Errorf("latency pass: no completion for %v", bn.stall())
				}
			}
			runtime.Gosched()
		}
		lat[i] = time.Since(t0)
	}
	r.SetLatencies(lat)
	return nil
}
