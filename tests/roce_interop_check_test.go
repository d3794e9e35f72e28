package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

const interopPMTU = 1024

// checkWrites: every RDMA WRITE payload the guest sent is what Go memory
// holds at its address (perftest writes the same buffer each iteration),
// and all iterations arrived.
func checkWrites(t *testing.T, run *perftestRun, frames []rocePacket) {
	var firstPSN roce.PSN
	var firstVA uint64
	have := false
	verified := 0
	for _, f := range frames {
		if f.dst != interopGoIP {
			continue
		}
		p := framePacket(t, f)
		op := p.BTH.Opcode
		if op < roce.OpWriteFirst || op > roce.OpWriteOnlyWithImmediate {
			continue
		}
		if op == roce.OpWriteFirst || op == roce.OpWriteOnly || op == roce.OpWriteOnlyWithImmediate {
			firstPSN, firstVA, have = p.BTH.PSN, p.RETH.VA, true
		}
		if !have {
			t.Fatalf("write_bw: %v PSN %d before any RETH", op, p.BTH.PSN)
		}
		va := firstVA + uint64(p.BTH.PSN.Diff(firstPSN))*interopPMTU
		got := run.mr.Copy(int(va-run.mr.Addr), len(p.Payload))
		if !bytes.Equal(got, p.Payload) {
			t.Fatalf("write_bw: %v PSN %d: %d bytes at %#x differ from Go memory", op, p.BTH.PSN, len(p.Payload), va)
		}
		verified += len(p.Payload)
	}
	if want := int(run.iters) * 65536; verified < want {
		t.Fatalf("write_bw: %d bytes verified, want at least %d (%d iterations)", verified, want, run.iters)
	}
	t.Logf("write_bw: %d bytes on the wire verified in Go memory", verified)
}

// checkReads: every READ response payload is what Go memory holds at the
// address its request named plus its offset.
func checkReads(t *testing.T, run *perftestRun, frames []rocePacket) {
	type req struct {
		psn roce.PSN
		va  uint64
		n   uint32
	}
	var reqs []req // in capture order; a response belongs to the latest that holds its PSN
	verified, requests := 0, 0
	for _, f := range frames {
		p := framePacket(t, f)
		switch op := p.BTH.Opcode; {
		case op == roce.OpReadRequest && f.dst == interopGoIP:
			reqs = append(reqs, req{p.BTH.PSN, p.RETH.VA, p.RETH.DMALen})
			requests++
		case op >= roce.OpReadResponseFirst && op <= roce.OpReadResponseOnly && f.src == interopGoIP:
			var va uint64
			found := false
			for i := len(reqs) - 1; i >= 0 && !found; i-- {
				r := reqs[i]
				d := p.BTH.PSN.Diff(r.psn)
				if d >= 0 && uint32(d)*interopPMTU < max(r.n, 1) {
					va, found = r.va+uint64(d)*interopPMTU, true
				}
			}
			if !found {
				t.Fatalf("read_bw: %v PSN %d answers no request", op, p.BTH.PSN)
			}
			if !bytes.Equal(run.mr.Copy(int(va-run.mr.Addr), len(p.Payload)), p.Payload) {
				t.Fatalf("read_bw: %v PSN %d: payload differs from Go memory at %#x", op, p.BTH.PSN, va)
			}
			verified += len(p.Payload)
		}
	}
	if want := int(run.iters) * 65536; verified < want || requests < int(run.iters) {
		t.Fatalf("read_bw: %d bytes in %d requests verified, want %d bytes in %d", verified, requests, want, run.iters)
	}
	t.Logf("read_bw: %d bytes of %d READ requests verified against Go memory", verified, requests)
}

// checkAtomics: each FETCH_ADD (one per PSN, retransmissions aside) ran
// exactly once: the words it targeted grew by the sum of their addends,
// and the QP executed as many atomics as there were requests.
func checkAtomics(t *testing.T, run *perftestRun, frames []rocePacket) {
	seen := map[roce.PSN]bool{}
	sums := map[uint64]uint64{}
	for _, f := range frames {
		if f.dst != interopGoIP {
			continue
		}
		p := framePacket(t, f)
		if p.BTH.Opcode != roce.OpFetchAdd || seen[p.BTH.PSN] {
			continue
		}
		seen[p.BTH.PSN] = true
		sums[p.AtomicETH.VA] += p.AtomicETH.SwapAdd
	}
	if len(seen) < int(run.iters) || run.mr.Atomics() != len(seen) {
		t.Fatalf("atomic_bw: %d FETCH_ADDs on the wire, %d executed, %d iterations", len(seen), run.mr.Atomics(), run.iters)
	}
	for va, sum := range sums {
		off := int(va - run.mr.Addr)
		initial := binary.LittleEndian.Uint64(interopPattern(off))
		if got := binary.LittleEndian.Uint64(run.mr.Copy(off, 8)); got != initial+sum {
			t.Fatalf("atomic_bw: word at %#x is %#x, want %#x + %#x", va, got, initial, sum)
		}
	}
	t.Logf("atomic_bw: %d FETCH_ADDs on %d words, each executed once", len(seen), len(sums))
}

// interopPattern returns the 8 bytes of the fill pattern at off.
func interopPattern(off int) []byte {
	b := make([]byte, 8)
	for i := range b {
		j := off + i
		b[i] = byte(j*7 + j>>8)
	}
	return b
}

// parseJob splits a perftest-jobs job OP:SIZE:ITERS.
func parseJob(j string) (op string, size, iters int) {
	f := strings.Split(j, ":")
	size, _ = strconv.Atoi(f[1])
	iters, _ = strconv.Atoi(f[2])
	return f[0], size, iters
}

// checkSends: every receive completed in order with the message's length,
// and every SEND payload on the wire is what its receive holds (the n-th
// distinct message lands in the n-th receive).
func checkSends(t *testing.T, run *perftestRun, frames []rocePacket) {
	size := len(run.recvBuf) / int(run.iters)
	rcs, err := run.host.TakeRecvs(context.Background(), int(run.iters))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range rcs {
		if c.ID != uint64(i) || c.Status != abi.WCSuccess || c.ByteLen != uint32(size) {
			t.Fatalf("send_bw: receive completion %d: %+v", i, c)
		}
	}
	msg := map[roce.PSN]int{} // first PSN -> message index
	var firstPSN roce.PSN
	verified := 0
	for _, f := range frames {
		if f.dst != interopGoIP {
			continue
		}
		p := framePacket(t, f)
		op := p.BTH.Opcode
		if op > roce.OpSendOnlyWithImmediate {
			continue
		}
		if op == roce.OpSendFirst || op == roce.OpSendOnly || op == roce.OpSendOnlyWithImmediate {
			firstPSN = p.BTH.PSN
			if _, ok := msg[firstPSN]; !ok {
				msg[firstPSN] = len(msg)
			}
		}
		k, ok := msg[firstPSN]
		if !ok || k >= int(run.iters) {
			t.Fatalf("send_bw: %v PSN %d belongs to no receive", op, p.BTH.PSN)
		}
		off := k*size + int(p.BTH.PSN.Diff(firstPSN))*interopPMTU
		if !bytes.Equal(run.recvBuf[off:off+len(p.Payload)], p.Payload) {
			t.Fatalf("send_bw: %v PSN %d differs from receive %d", op, p.BTH.PSN, k)
		}
		verified += len(p.Payload)
	}
	if len(msg) != int(run.iters) || verified < int(run.iters)*size {
		t.Fatalf("send_bw: %d messages, %d bytes verified; want %d messages", len(msg), verified, run.iters)
	}
	t.Logf("send_bw: %d messages, %d bytes verified in the receives", len(msg), verified)
}

// checkLatWrites: the ping-pong's WRITEs in both directions: the client's
// land in Go memory (checkWrites' rule), ours carry our buffer with the
// count 1, 2, ... in the last byte, once each, all acknowledged by rxe.
func checkLatWrites(t *testing.T, run *perftestRun, frames []rocePacket) {
	verified, next := 0, 1
	seen := map[roce.PSN]bool{}
	for _, f := range frames {
		p := framePacket(t, f)
		switch {
		case f.dst == interopGoIP && p.BTH.Opcode == roce.OpWriteOnly:
			got := run.mr.Copy(int(p.RETH.VA-run.mr.Addr), len(p.Payload)-1)
			if !bytes.Equal(got, p.Payload[:len(p.Payload)-1]) {
				t.Fatalf("write_lat: the client's WRITE PSN %d differs from Go memory", p.BTH.PSN)
			}
			verified += len(p.Payload)
		case f.src == interopGoIP && p.BTH.Opcode == roce.OpWriteOnly && !seen[p.BTH.PSN]:
			seen[p.BTH.PSN] = true
			n := len(p.Payload)
			if !bytes.Equal(p.Payload[:n-1], run.sent[:n-1]) || p.Payload[n-1] != byte(next) {
				t.Fatalf("write_lat: our WRITE PSN %d: count %d, want %d", p.BTH.PSN, p.Payload[n-1], byte(next))
			}
			next++
		}
	}
	if next-1 != int(run.iters) || verified < int(run.iters)*len(run.sent) {
		t.Fatalf("write_lat: %d of our WRITEs, %d bytes of the client's verified; want %d each way", next-1, verified, run.iters)
	}
	t.Logf("write_lat: %d WRITEs each way verified", run.iters)
}
