package roceinterop

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/internal/pftexchange"
)

// CheckCapture checks the job against the frames of its QP pair in the
// capture of the rxe guest's link (ReadCapture already checked every
// ICRC). As the responder (our server of write_bw, read_bw, atomic_bw,
// send_bw): every WRITE payload is what our memory holds at its address,
// every READ response payload is what our memory held there, every
// FETCH_ADD ran exactly once (the words grew by the sum of their addends),
// every SEND payload is what its receive holds. As the requester (our
// client): every WRITE and SEND payload is our message's bytes, rxe
// acknowledged the last PSN, every READ response payload is what landed in
// our memory, every atomic acknowledgement's original value is what our
// memory received. write_lat: each side's WRITEs carried the counts 1, 2,
// … once each and the peer's landed in our memory. It returns what it
// verified.
func (r *Run) CheckCapture(all []Frame) (string, error) {
	j := r.Job
	frames := Between(all, r.local, r.Mine.QPN, r.Peer.QPN)
	if len(frames) == 0 {
		return "", fmt.Errorf("%s: no RoCE frames of QP %#x ↔ %#x in the capture", j, r.Mine.QPN, r.Peer.QPN)
	}
	local := r.local
	mem := r.mem
	at := func(va uint64, n int) ([]byte, error) {
		off := va - r.Mine.VAddr
		if va < r.Mine.VAddr || off > uint64(len(mem)) || uint64(n) > uint64(len(mem))-off {
			return nil, fmt.Errorf("%s: %d bytes at %#x are outside our MR [%#x, +%d)", j, n, va, r.Mine.VAddr, len(mem))
		}
		return mem[off : off+uint64(n)], nil
	}
	pkts := max(1, (j.Size+pmtu-1)/pmtu) // packets of one message
	// slot maps a PSN of our requests to the message and its offset.
	slot := func(psn roce.PSN) (int, int, bool) {
		d := int(psn.Diff(roce.PSN(r.Mine.PSN)))
		if d < 0 || d >= j.Iters*pkts {
			return 0, 0, false
		}
		return d / pkts, (d/pkts)*j.Size + (d%pkts)*pmtu, true
	}
	verified := 0
	seen := map[roce.PSN]bool{}
	switch {
	case j.Op == pftexchange.WriteLat:
		next := 1
		for _, f := range frames {
			p := f.Packet
			if p.BTH.Opcode != roce.OpWriteOnly {
				continue
			}
			n := len(p.Payload)
			if n != j.Size {
				return "", fmt.Errorf("%s: WRITE PSN %d of %d bytes", j, p.BTH.PSN, n)
			}
			if f.Dst == local {
				got, err := at(p.RETH.VA, n-1)
				if err != nil {
					return "", err
				}
				if !bytes.Equal(got, p.Payload[:n-1]) {
					return "", fmt.Errorf("%s: the peer's WRITE PSN %d differs from our memory", j, p.BTH.PSN)
				}
				verified += n
				continue
			}
			if seen[p.BTH.PSN] {
				continue
			}
			seen[p.BTH.PSN] = true
			if !bytes.Equal(p.Payload[:n-1], r.sent[:n-1]) || p.Payload[n-1] != byte(next) {
				return "", fmt.Errorf("%s: our WRITE PSN %d: count %d, want %d", j, p.BTH.PSN, p.Payload[n-1], byte(next))
			}
			next++
		}
		if next-1 != j.Iters || verified < j.Iters*j.Size {
			return "", fmt.Errorf("%s: %d of our WRITEs, %d bytes of the peer's verified; want %d each way", j, next-1, verified, j.Iters)
		}
		return fmt.Sprintf("%d WRITEs each way on the wire, counts in order", j.Iters), nil

	case r.Role == "server" && j.Op == pftexchange.WriteBW:
		var firstPSN roce.PSN
		var firstVA uint64
		have := false
		for _, f := range frames {
			p := f.Packet
			op := p.BTH.Opcode
			if f.Dst != local || op < roce.OpWriteFirst || op > roce.OpWriteOnlyWithImmediate {
				continue
			}
			if op == roce.OpWriteFirst || op == roce.OpWriteOnly || op == roce.OpWriteOnlyWithImmediate {
				firstPSN, firstVA, have = p.BTH.PSN, p.RETH.VA, true
			}
			if !have {
				return "", fmt.Errorf("%s: %v PSN %d before any RETH", j, op, p.BTH.PSN)
			}
			got, err := at(firstVA+uint64(p.BTH.PSN.Diff(firstPSN))*pmtu, len(p.Payload))
			if err != nil {
				return "", err
			}
			if !bytes.Equal(got, p.Payload) {
				return "", fmt.Errorf("%s: %v PSN %d: payload differs from our memory", j, op, p.BTH.PSN)
			}
			if !seen[p.BTH.PSN] {
				seen[p.BTH.PSN] = true
				verified += len(p.Payload)
			}
		}
		if verified < j.Iters*j.Size {
			return "", fmt.Errorf("%s: %d bytes verified, want %d", j, verified, j.Iters*j.Size)
		}
		return fmt.Sprintf("%d WRITE bytes on the wire are in our memory", verified), nil

	case r.Role == "server" && j.Op == pftexchange.ReadBW:
		type req struct {
			psn roce.PSN
			va  uint64
			n   uint32
		}
		var reqs []req
		for _, f := range frames {
			p := f.Packet
			switch op := p.BTH.Opcode; {
			case op == roce.OpReadRequest && f.Dst == local:
				reqs = append(reqs, req{p.BTH.PSN, p.RETH.VA, p.RETH.DMALen})
			case op >= roce.OpReadResponseFirst && op <= roce.OpReadResponseOnly && f.Src == local:
				found := false
				var va uint64
				for i := len(reqs) - 1; i >= 0 && !found; i-- {
					d := p.BTH.PSN.Diff(reqs[i].psn)
					if d >= 0 && uint32(d)*pmtu < max(reqs[i].n, 1) {
						va, found = reqs[i].va+uint64(d)*pmtu, true
					}
				}
				if !found {
					return "", fmt.Errorf("%s: %v PSN %d answers no request", j, op, p.BTH.PSN)
				}
				got, err := at(va, len(p.Payload))
				if err != nil {
					return "", err
				}
				if !bytes.Equal(got, p.Payload) {
					return "", fmt.Errorf("%s: %v PSN %d differs from our memory at %#x", j, op, p.BTH.PSN, va)
				}
				if !seen[p.BTH.PSN] {
					seen[p.BTH.PSN] = true
					verified += len(p.Payload)
				}
			}
		}
		if verified < j.Iters*j.Size {
			return "", fmt.Errorf("%s: %d bytes of READ responses verified, want %d", j, verified, j.Iters*j.Size)
		}
		return fmt.Sprintf("%d bytes of READ responses are our memory's", verified), nil

	case r.Role == "server" && j.Op == pftexchange.AtomicBW:
		sums := map[uint64]uint64{}
		for _, f := range frames {
			p := f.Packet
			if f.Dst != local || p.BTH.Opcode != roce.OpFetchAdd || seen[p.BTH.PSN] {
				continue
			}
			seen[p.BTH.PSN] = true
			sums[p.AtomicETH.VA] += p.AtomicETH.SwapAdd
		}
		if len(seen) != j.Iters {
			return "", fmt.Errorf("%s: %d FETCH_ADDs on the wire, want %d", j, len(seen), j.Iters)
		}
		want := bytes.Clone(r.init)
		for va, sum := range sums {
			off := int(va - r.Mine.VAddr)
			if _, err := at(va, 8); err != nil {
				return "", err
			}
			binary.LittleEndian.PutUint64(want[off:], binary.LittleEndian.Uint64(r.init[off:])+sum)
		}
		if !bytes.Equal(mem, want) {
			for va := range sums {
				off := int(va - r.Mine.VAddr)
				return "", fmt.Errorf("%s: word at %#x is %#x, want %#x (or other bytes changed)", j, va,
					binary.LittleEndian.Uint64(mem[off:]), binary.LittleEndian.Uint64(want[off:]))
			}
			return "", fmt.Errorf("%s: our memory changed outside the atomics' words", j)
		}
		return fmt.Sprintf("%d FETCH_ADDs on %d words, each executed once", len(seen), len(sums)), nil

	case r.Role == "server" && j.Op == pftexchange.SendBW:
		msg := map[roce.PSN]int{} // first PSN -> message index
		var firstPSN roce.PSN
		for _, f := range frames {
			p := f.Packet
			op := p.BTH.Opcode
			if f.Dst != local || op > roce.OpSendOnlyWithImmediate {
				continue
			}
			if op == roce.OpSendFirst || op == roce.OpSendOnly || op == roce.OpSendOnlyWithImmediate {
				firstPSN = p.BTH.PSN
				if _, ok := msg[firstPSN]; !ok {
					msg[firstPSN] = len(msg)
				}
			}
			k, ok := msg[firstPSN]
			if !ok || k >= j.Iters {
				return "", fmt.Errorf("%s: %v PSN %d belongs to no receive", j, op, p.BTH.PSN)
			}
			off := k*j.Size + int(p.BTH.PSN.Diff(firstPSN))*pmtu
			if off+len(p.Payload) > (k+1)*j.Size || !bytes.Equal(mem[off:off+len(p.Payload)], p.Payload) {
				return "", fmt.Errorf("%s: %v PSN %d differs from receive %d", j, op, p.BTH.PSN, k)
			}
			if !seen[p.BTH.PSN] {
				seen[p.BTH.PSN] = true
				verified += len(p.Payload)
			}
		}
		if len(msg) != j.Iters || verified != j.Iters*j.Size {
			return "", fmt.Errorf("%s: %d messages, %d bytes verified; want %d messages", j, len(msg), verified, j.Iters)
		}
		return fmt.Sprintf("%d SENDs, %d bytes, are in their receives", len(msg), verified), nil
	}

	// Our side is the requester.
	lastReq := roce.PSN(r.Mine.PSN).Add(uint32(j.Iters*pkts - 1))
	acked := false
	for _, f := range frames {
		p := f.Packet
		op := p.BTH.Opcode
		switch {
		case f.Src == local && (op <= roce.OpSendOnlyWithImmediate || op >= roce.OpWriteFirst && op <= roce.OpWriteOnlyWithImmediate):
			_, off, ok := slot(p.BTH.PSN)
			if !ok || !bytes.Equal(mem[off:off+len(p.Payload)], p.Payload) {
				return "", fmt.Errorf("%s: our %v PSN %d is not our message's bytes", j, op, p.BTH.PSN)
			}
			if !seen[p.BTH.PSN] {
				seen[p.BTH.PSN] = true
				verified += len(p.Payload)
			}
		case f.Dst == local && op == roce.OpAcknowledge && p.AETH.Syndrome.Type() == roce.AckTypeACK:
			acked = acked || p.BTH.PSN == lastReq
		case f.Dst == local && op >= roce.OpReadResponseFirst && op <= roce.OpReadResponseOnly:
			_, off, ok := slot(p.BTH.PSN)
			if !ok || !bytes.Equal(mem[off:off+len(p.Payload)], p.Payload) {
				return "", fmt.Errorf("%s: %v PSN %d is not what landed in our memory", j, op, p.BTH.PSN)
			}
			if !seen[p.BTH.PSN] {
				seen[p.BTH.PSN] = true
				verified += len(p.Payload)
			}
		case f.Dst == local && op == roce.OpAtomicAcknowledge:
			k, _, ok := slot(p.BTH.PSN)
			if !ok || binary.LittleEndian.Uint64(mem[8*k:]) != p.AtomicAckETH.OrigData {
				return "", fmt.Errorf("%s: atomic ACK PSN %d: original value %d is not what our memory received", j, p.BTH.PSN, p.AtomicAckETH.OrigData)
			}
			if !seen[p.BTH.PSN] {
				seen[p.BTH.PSN] = true
				verified++
			}
		}
	}
	switch j.Op {
	case pftexchange.AtomicBW:
		if verified != j.Iters {
			return "", fmt.Errorf("%s: %d atomic ACKs verified, want %d", j, verified, j.Iters)
		}
		return fmt.Sprintf("%d atomic ACKs carry the values in our memory", verified), nil
	case pftexchange.ReadBW:
		if verified != j.Iters*j.Size {
			return "", fmt.Errorf("%s: %d bytes of READ responses verified, want %d", j, verified, j.Iters*j.Size)
		}
		return fmt.Sprintf("%d bytes of READ responses are what landed in our memory", verified), nil
	}
	if verified != j.Iters*j.Size || !acked {
		return "", fmt.Errorf("%s: %d bytes of ours on the wire verified (want %d), last PSN %d acknowledged: %t", j, verified, j.Iters*j.Size, lastReq, acked)
	}
	return fmt.Sprintf("%d bytes on the wire are ours, rxe acknowledged PSN %d", verified, lastReq), nil
}
