package perftest

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Serve is the server: it connects to the client's endpoint, posts the
// receives the test needs, waits for the client's done message, verifies
// its own buffer and answers with a verdict. Its Result carries the
// client's measurements.
func (s *Side) Serve(peer Endpoint) (Result, error) {
	gid, err := peer.gid()
	if err != nil {
		return Result{}, err
	}
	if err := s.qp.ConnectRCOpts(gid, peer.QPN, peer.PSN, abi.AccessRemoteWrite|abi.AccessRemoteRead|abi.AccessRemoteAtomic, s.cfg.connectOpts()); err != nil {
		return Result{}, fmt.Errorf("connect: %w", err)
	}
	// Receive order: hello, then (send) one per message, then done.
	if err := s.postCtrlRecv(1); err != nil {
		return Result{}, fmt.Errorf("post hello receive: %w", err)
	}
	total := uint64(s.cfg.Iters + s.cfg.LatIters)
	// A send stream's length is the client's to decide: receives are
	// posted until its done message arrives in one of them.
	stream := s.cfg.sendStream()
	var dataPosted, dataRecvd uint64
	doneRecv := stream
	postMore := func() error {
		for s.cfg.Op == "send" && (stream || dataPosted < total) && dataPosted-dataRecvd < uint64(s.depth) {
			if err := s.qp.PostRecv(verbs.RecvWR{WRID: dataPosted,
				SGL: []abi.SGE{{Addr: s.slotAddr(dataPosted), Length: uint32(s.cfg.Size), LKey: s.mr.LKey}}}); err != nil {
				return fmt.Errorf("post receive %d: %w", dataPosted, err)
			}
			dataPosted++
		}
		if !doneRecv && (s.cfg.Op != "send" || dataPosted == total) {
			if err := s.postCtrlRecv(2); err != nil {
				return fmt.Errorf("post done receive: %w", err)
			}
			doneRecv = true
		}
		return nil
	}
	if err := postMore(); err != nil {
		return Result{}, err
	}
	var bad string // first verification failure
	var done message
	var gap gapMeter // between receives of data
	for gotDone := false; !gotDone; {
		// The client's stream runs Duration before anything but its
		// receives complete here.
		wcs, err := s.pollFor(s.cfg.Timeout + s.cfg.Duration)
		if err != nil {
			return Result{}, fmt.Errorf("waiting for the client (received %d of %d): %w", dataRecvd, total, err)
		}
		for i := range wcs {
			wc := &wcs[i]
			if wc.Status != abi.WCSuccess {
				return Result{}, wcErr(wc)
			}
			switch {
			case wc.WRID == ctrlWRID|1:
				h, err := decode(s.ctrlBuf(1))
				if err != nil || h.kind != kindHello {
					return Result{}, fmt.Errorf("client hello: malformed (%v)", err)
				}
				if h.op != opIndex(s.cfg.Op) || h.size != s.cfg.Size || h.iters != uint64(s.cfg.Iters) || h.latIter != uint64(s.cfg.LatIters) {
					bad = fmt.Sprintf("client runs op %d size %d iters %d/%d, server %s %d %d/%d",
						h.op, h.size, h.iters, h.latIter, s.cfg.Op, s.cfg.Size, s.cfg.Iters, s.cfg.LatIters)
				}
			case wc.WRID == ctrlWRID|2:
				if done, err = decode(s.ctrlBuf(2)); err != nil || done.kind != kindDone {
					return Result{}, fmt.Errorf("client done: malformed (%v)", err)
				}
				gotDone = true
			case wc.WRID&ctrlWRID == 0 && s.cfg.Op == "send":
				if wc.WRID != dataRecvd {
					return Result{}, fmt.Errorf("receive %d completed, want %d (out of order)", wc.WRID, dataRecvd)
				}
				if stream && wc.Flags&abi.WCFlagWithImm != 0 && wc.Imm == magic {
					if done, err = decode(s.slot(dataRecvd)); err != nil || done.kind != kindDone || wc.ByteLen != ctrlSize {
						return Result{}, fmt.Errorf("client done: malformed (%v, %d bytes)", err, wc.ByteLen)
					}
					gotDone = true
					continue
				}
				if gap.last.IsZero() {
					gap.start(time.Now())
				} else {
					gap.mark(time.Now())
				}
				if s.cfg.Verify && bad == "" && (wc.ByteLen != uint32(s.cfg.Size) || !PatternOK(s.slot(dataRecvd), dataRecvd)) {
					bad = fmt.Sprintf("message %d: %d bytes, pattern mismatch", dataRecvd, wc.ByteLen)
				}
				dataRecvd++
				if err := postMore(); err != nil {
					return Result{}, err
				}
			case wc.WRID == ctrlWRID: // a verdict sent earlier: none
			default:
				return Result{}, fmt.Errorf("unexpected completion %#x", wc.WRID)
			}
		}
	}
	if bad == "" && s.cfg.Verify {
		bad = s.verify(done.count, dataRecvd)
	}
	v := message{kind: kindVerdict, ok: 1}
	if bad != "" {
		v.ok, v.reason = 0, bad
	}
	if err := s.sendCtrl(&v); err != nil {
		return Result{}, fmt.Errorf("send verdict: %w", err)
	}
	for sent := false; !sent; {
		wcs, err := s.poll()
		if err != nil {
			return Result{}, fmt.Errorf("send verdict: %w", err)
		}
		for i := range wcs {
			if wcs[i].Status != abi.WCSuccess {
				return Result{}, fmt.Errorf("send verdict: %w", wcErr(&wcs[i]))
			}
			sent = sent || wcs[i].WRID == ctrlWRID
		}
	}
	r := Result{Op: s.cfg.Op, Size: s.cfg.Size, Iters: int(done.iters), GBytesPerS: done.gbps, Mops: done.mops,
		LatP50: done.p50, LatP99: done.p99, LatAvg: done.avg, LatIters: int(done.latIter), Seconds: done.secs,
		TxDepth: s.depth, Slots: s.slots, Role: "server", Verified: s.cfg.Verify && bad == "",
		MaxGapMS: gap.ms(), Bytes: done.count * s.cfg.Size}
	if bad != "" {
		return r, fmt.Errorf("verification failed: %s", bad)
	}
	return r, nil
}

// verify checks the server's buffer after count operations: what the
// client must have left there.
func (s *Side) verify(count, recvd uint64) string {
	n := uint64(s.slots)
	switch s.cfg.Op {
	case "write":
		for k := range n {
			if k >= count {
				break
			}
			last := k + n*((count-1-k)/n)
			if !PatternOK(s.slot(k), last) {
				return fmt.Sprintf("buffer %d does not hold write %d's pattern", k, last)
			}
		}
	case "read":
		for k := range n {
			if !PatternOK(s.slot(k), k) {
				return fmt.Sprintf("buffer %d changed under reads", k)
			}
		}
	case "send":
		if recvd != count {
			return fmt.Sprintf("received %d messages, client sent %d", recvd, count)
		}
	case "atomic":
		if got := binary.LittleEndian.Uint64(s.mr.Bytes()); got != count {
			return fmt.Sprintf("counter is %d after %d fetch-and-adds", got, count)
		}
	}
	return ""
}
