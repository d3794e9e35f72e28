package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"github.com/vrdma/vrdma/internal/perftest"
)

// What --verify checked, counted as it is checked, so that the run can say
// it afterwards: "verified: 2000 RDMA WRITEs of 65536 B (131072000
// bytes): every byte that arrived in the responder's buffer compared with
// the pattern sent".

// The checks --verify makes.
const (
	tallyWrite     = iota // a write's bytes in the responder's buffer (one process; write_lat)
	tallyWriteLast        // a responder's buffer after the run: the last write into it (two processes)
	tallyRead             // a read's bytes
	tallyReadSrc          // a responder's buffer after the reads: unchanged
	tallySend             // a receive's bytes and length
	tallyFetchAdd         // a fetch-and-add's returned value
	tallyCounter          // a responder's counter after the fetch-and-adds
	tallyKinds
)

var tallyText = [tallyKinds]struct{ one, many, what string }{
	tallyWrite:     {"RDMA WRITE", "RDMA WRITEs", "every byte that arrived in the responder's buffer compared with the pattern sent"},
	tallyWriteLast: {"responder buffer", "responder buffers", "every byte holds the pattern of the last RDMA WRITE into it"},
	tallyRead:      {"RDMA READ", "RDMA READs", "every byte read compared with the responder's pattern, the destination cleared before each read"},
	tallyReadSrc:   {"responder buffer", "responder buffers", "every byte still holds its pattern after the reads"},
	tallySend:      {"SEND", "SENDs", "every byte of each receive compared with the pattern sent, and its length"},
	tallyFetchAdd:  {"fetch-and-add", "fetch-and-adds", "each returned the counter's value before it"},
	tallyCounter:   {"counter", "counters", "each equals the number of fetch-and-adds on it"},
}

// verifyTally counts the checks --verify made, by kind.
type verifyTally [tallyKinds]struct {
	n, bytes         uint64
	minSize, maxSize uint64
}

func (t *verifyTally) add(kind int, n, size uint64) {
	e := &t[kind]
	if e.n == 0 || size < e.minSize {
		e.minSize = size
	}
	e.maxSize = max(e.maxSize, size)
	e.n += n
	e.bytes += n * size
}

// lines says what was checked, one line per kind.
func (t *verifyTally) lines() []string {
	var l []string
	for k := range t {
		e := &t[k]
		if e.n == 0 {
			continue
		}
		noun := tallyText[k].many
		if e.n == 1 {
			noun = tallyText[k].one
		}
		size := fmt.Sprintf("%d B", e.minSize)
		if e.maxSize != e.minSize {
			size = fmt.Sprintf("%d … %d B", e.minSize, e.maxSize)
		}
		l = append(l, fmt.Sprintf("%d %s of %s (%d bytes): %s", e.n, noun, size, e.bytes, tallyText[k].what))
	}
	return l
}

// print writes the lines with prefix ("verified"), or that nothing needed
// checking on this side.
func (t *verifyTally) print(w io.Writer, prefix string) {
	l := t.lines()
	if len(l) == 0 {
		fmt.Fprintf(w, "%s: nothing here (the peer owns every destination buffer)\n", prefix)
	}
	for _, s := range l {
		fmt.Fprintf(w, "%s: %s\n", prefix, s)
	}
}

// printText writes a peer's lines (newline-separated) with prefix.
func printText(w io.Writer, prefix, text string) {
	for _, s := range strings.Split(text, "\n") {
		if s != "" {
			fmt.Fprintf(w, "%s: %s\n", prefix, s)
		}
	}
}

// lastInSlot is the last operation of [from, to) that used message buffer
// k of slots (operation s uses buffer s mod slots); ok is false when none
// did.
func lastInSlot(from, to, k, slots uint64) (s uint64, ok bool) {
	if to == 0 || k >= slots {
		return 0, false
	}
	t := to - 1
	d := (t%slots + slots - k) % slots
	if d > t || t-d < from {
		return 0, false
	}
	return t - d, true
}

// verifyResponder checks, in two processes, what the peer's operations of
// the size just run left in the local responder's buffer of flow f: each
// buffer holds the last write into it, a read's buffers are unchanged, a
// counter counts the fetch-and-adds. (Receives are checked as they
// complete.) The peer's counts are f.peerFrom and f.peerTo.
func (bn *bench) verifyResponder(f *flow) error {
	if !bn.o.verify || f.resp == nil || f.req != nil {
		return nil
	}
	slots := uint64(bn.slots)
	for q := range bn.o.qps {
		from, to := f.peerFrom[q], f.peerTo[q]
		switch bn.o.op {
		case "write":
			for k := range slots {
				s, ok := lastInSlot(from, to, k, slots)
				if !ok {
					continue
				}
				if !perftest.PatternOK(bn.slot(f.resp, f, q, s), bn.patternIndex(f, q, s)) {
					return fmt.Errorf("verify: %s: qp %d: buffer %d does not hold the pattern of write %d, the last into it", f.resp.name, q, k, s)
				}
				bn.tally.add(tallyWriteLast, 1, bn.size)
			}
		case "read":
			for k := range min(slots, to-from) {
				if !perftest.PatternOK(bn.slot(f.resp, f, q, k), bn.patternIndex(f, q, k)) {
					return fmt.Errorf("verify: %s: qp %d: buffer %d changed under the peer's reads", f.resp.name, q, k)
				}
				bn.tally.add(tallyReadSrc, 1, bn.size)
			}
		case "atomic":
			if err := bn.checkCounter(f, q, to); err != nil {
				return err
			}
		case "send":
			if got := f.qs[q].recvd; got != to {
				return fmt.Errorf("verify: %s: qp %d: received %d messages, the peer sent %d", f.resp.name, q, got, to)
			}
		}
	}
	return nil
}

// checkCounter checks flow f, QP q's counter on its local responder after
// n fetch-and-adds.
func (bn *bench) checkCounter(f *flow, q int, n uint64) error {
	off := bn.areaOff(f.idx, q)
	if got := binary.LittleEndian.Uint64(f.resp.mr.Bytes()[off:]); got != n {
		return fmt.Errorf("verify: %s: qp %d: the counter is %d after %d fetch-and-adds", f.resp.name, q, got, n)
	}
	bn.tally.add(tallyCounter, 1, atomicSize)
	return nil
}

// checkCounters checks, in one process, every atomic bandwidth test's
// counters against the fetch-and-adds done.
func (bn *bench) checkCounters() error {
	if !bn.o.verify || bn.o.op != "atomic" || bn.o.lat {
		return nil
	}
	for _, f := range bn.flows {
		if f.req == nil || f.resp == nil {
			continue
		}
		for q := range f.qs {
			if err := bn.checkCounter(f, q, f.qs[q].done); err != nil {
				return err
			}
		}
	}
	return nil
}
