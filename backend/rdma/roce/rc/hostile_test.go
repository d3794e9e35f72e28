package rc

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// inject hands q a packet built from p, through Append and Parse as the
// endpoint does.
func inject(t testing.TB, q *QP, p roce.Packet) {
	t.Helper()
	p.BTH.DestQP = q.QPN()
	if p.BTH.PKey == 0 {
		p.BTH.PKey = 0xffff
	}
	b, err := p.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	pp, err := roce.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	q.Receive(&pp)
}

func sent(t testing.TB, x *side) []roce.Packet {
	t.Helper()
	var ps []roce.Packet
	for _, b := range x.port.out {
		p, err := roce.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	x.port.out = nil
	return ps
}

// TestHostileFlood: ten thousand requests beyond the expected PSN draw one
// sequence NAK; ten thousand duplicate READs queue at most
// MaxDestRdAtomic responses; responses to nothing are dropped; none of it
// changes what the QP owes or grows what it holds.
func TestHostileFlood(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024, RQPSN: 1000, MaxDestRdAtomic: 8, Burst: 1}, simMem)
	b := s.a // expects PSN cfg.RQPSN
	for i := range 10000 {
		inject(t, b.qp, roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, PSN: roce.PSN(1001 + i%5000)}, Payload: []byte{1, 2, 3}})
	}
	b.qp.Flush()
	ps := sent(t, b)
	if len(ps) != 1 || ps[0].AETH.Syndrome != roce.NAKSyndrome(roce.NAKPSNSequenceError) || ps[0].BTH.PSN != 1000 {
		t.Fatalf("after the flood: %d packets %+v, want one sequence NAK for PSN 1000", len(ps), ps)
	}
	// Duplicate READs (PSNs before 1000) of valid memory that was never
	// read: dropped.
	for i := range 10000 {
		inject(t, b.qp, roce.Packet{BTH: roce.BTH{Opcode: roce.OpReadRequest, PSN: roce.PSN(900 + i%50)},
			RETH: roce.RETH{VA: 0x10000, RKey: simRKey, DMALen: 2048}})
	}
	if ps := sent(t, b); len(ps) != 0 {
		t.Fatalf("%d packets answered made-up duplicate READs", len(ps))
	}
	// A READ, then a flood of its duplicates: answered, the queue bounded.
	read := roce.Packet{BTH: roce.BTH{Opcode: roce.OpReadRequest, PSN: 1000}, RETH: roce.RETH{VA: 0x10000, RKey: simRKey, DMALen: 2048}}
	inject(t, b.qp, read)
	for range 1000 {
		inject(t, b.qp, read)
		if n := b.qp.resp.jobs.n; n > 8 {
			t.Fatalf("%d responses queued, want at most 8", n)
		}
	}
	for b.qp.resp.jobs.n > 0 {
		b.qp.Pump()
	}
	if ps := sent(t, b); len(ps) < 16 || len(ps) > 1001*2 {
		t.Fatalf("%d packets answered 1001 READs", len(ps))
	}
	// Responses and ACKs for nothing outstanding.
	for i := range 1000 {
		inject(t, b.qp, roce.Packet{BTH: roce.BTH{Opcode: roce.OpAcknowledge, PSN: roce.PSN(i * 7919)}, AETH: roce.AETH{Syndrome: roce.NAKSyndrome(roce.NAKRemoteAccessError)}})
		inject(t, b.qp, roce.Packet{BTH: roce.BTH{Opcode: roce.OpReadResponseOnly, PSN: roce.PSN(i * 13)}, Payload: make([]byte, 8)})
		inject(t, b.qp, roce.Packet{BTH: roce.BTH{Opcode: roce.OpAtomicAcknowledge, PSN: roce.PSN(i)}})
	}
	c := b.qp.Counters()
	if c.DropStale < 13000 || c.OutOfSeq != 10000 || b.qp.Err() {
		t.Fatalf("counters %+v, error state %t", c, b.qp.Err())
	}
	// The QP still works.
	rb := make([]byte, 3)
	b.host.recvs = append(b.host.recvs, Recv{ID: 5, Len: 3, Buf: buf(rb)})
	inject(t, b.qp, roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, PSN: 1002, AckReq: true}, Payload: []byte{7, 8, 9}})
	b.qp.Flush()
	if ps := sent(t, b); len(ps) != 1 || ps[0].BTH.Opcode != roce.OpAcknowledge || ps[0].BTH.PSN != 1002 || rb[2] != 9 {
		t.Fatalf("after the attack, a SEND drew %+v", ps)
	}
}

// TestHostileProtocol: packets against the protocol at the expected PSN.
func TestHostileProtocol(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       roce.Packet
		wantNAK roce.NAKCode // 0xff: dropped without a NAK
	}{
		{"middle without first", roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteMiddle}, Payload: make([]byte, 1024)}, roce.NAKInvalidRequest},
		{"last without first", roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendLast}, Payload: make([]byte, 10)}, roce.NAKInvalidRequest},
		{"pmtu", roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendFirst}, Payload: make([]byte, 2048)}, 0xff},
		{"partition", roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, PKey: 0x8001}, Payload: make([]byte, 8)}, 0xff},
		{"write only short", roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly}, RETH: roce.RETH{VA: 0x10000, RKey: simRKey, DMALen: 100}, Payload: make([]byte, 10)}, roce.NAKInvalidRequest},
		{"write bad rkey", roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly}, RETH: roce.RETH{VA: 0x10000, RKey: 1, DMALen: 10}, Payload: make([]byte, 10)}, roce.NAKRemoteAccessError},
		{"write wraps", roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteFirst}, RETH: roce.RETH{VA: ^uint64(0) - 10, RKey: simRKey, DMALen: 4096}, Payload: make([]byte, 1024)}, roce.NAKRemoteAccessError},
		{"read huge", roce.Packet{BTH: roce.BTH{Opcode: roce.OpReadRequest}, RETH: roce.RETH{VA: 0x10000, RKey: simRKey, DMALen: 1<<31 + 1}}, roce.NAKInvalidRequest},
		{"atomic unaligned", roce.Packet{BTH: roce.BTH{Opcode: roce.OpFetchAdd}, AtomicETH: roce.AtomicETH{VA: 0x10001, RKey: simRKey}}, roce.NAKInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Config{PMTU: roce.MTU1024}, simMem)
			s.b.host.recvs = append(s.b.host.recvs, Recv{ID: 1, Len: 10, Buf: buf(make([]byte, 10))})
			inject(t, s.b.qp, tc.p)
			s.b.qp.Flush()
			ps := sent(t, s.b)
			if tc.wantNAK == 0xff {
				if len(ps) != 0 || s.b.qp.Err() || s.b.qp.Counters().DropInvalid != 1 {
					t.Fatalf("sent %+v, error %t, counters %+v; want a silent drop", ps, s.b.qp.Err(), s.b.qp.Counters())
				}
				return
			}
			if len(ps) != 1 || ps[0].AETH.Syndrome != roce.NAKSyndrome(tc.wantNAK) || !s.b.qp.Err() {
				t.Fatalf("sent %+v, error %t; want NAK %v and the error state", ps, s.b.qp.Err(), tc.wantNAK)
			}
			if s.b.host.mr.atomics != 0 || binary.LittleEndian.Uint64(s.b.host.mr.b) != 0 {
				t.Fatal("memory touched")
			}
			inject(t, s.b.qp, roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly}})
			if s.b.qp.Counters().DropState != 1 {
				t.Fatal("a packet to a QP in the error state was not dropped")
			}
		})
	}
}

// FuzzReceive feeds arbitrary packets to a QP with work outstanding on
// both sides; whatever arrives, the QP's bookkeeping stays consistent and
// every completion it reports is for a posted WR, in order.
func FuzzReceive(f *testing.F) {
	seed := func(ps ...roce.Packet) []byte {
		var out []byte
		for _, p := range ps {
			p.BTH.PKey = 0xffff
			b, err := p.Append(nil)
			if err != nil {
				f.Fatal(err)
			}
			out = binary.BigEndian.AppendUint16(out, uint16(len(b)))
			out = append(out, b...)
		}
		return out
	}
	f.Add(seed(roce.Packet{BTH: roce.BTH{Opcode: roce.OpAcknowledge, PSN: 2}, AETH: roce.AETH{Syndrome: roce.ACKSyndrome(31)}}))
	f.Add(seed(roce.Packet{BTH: roce.BTH{Opcode: roce.OpReadResponseFirst, PSN: 3}, Payload: make([]byte, 1024)},
		roce.Packet{BTH: roce.BTH{Opcode: roce.OpAcknowledge, PSN: 3}, AETH: roce.AETH{Syndrome: roce.NAKSyndrome(0)}}))
	f.Add(seed(roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, PSN: 0}, Payload: []byte{1, 2, 3, 4}},
		roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteFirst, PSN: 1}, RETH: roce.RETH{VA: 0x10000, RKey: simRKey, DMALen: 3000}, Payload: make([]byte, 1024)}))
	f.Add(seed(roce.Packet{BTH: roce.BTH{Opcode: roce.OpAcknowledge, PSN: 1}, AETH: roce.AETH{Syndrome: roce.RNRNAKSyndrome(3)}}))
	f.Add(seed(roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendFirst, PSN: 0}, Payload: make([]byte, 1024)},
		roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendLastWithInvalidate, PSN: 1}, IETH: simRKey, Payload: []byte{1}},
		roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnlyWithInvalidate, PSN: 2}, IETH: simRKey + 1}))
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newSim(t, Config{PMTU: roce.MTU1024, SQSize: 8, MaxDestRdAtomic: 4}, 1<<16)
		a := s.a
		posted := []SendWR{
			{ID: 0, Opcode: WRSend, Length: 100, Local: buf(make([]byte, 100))},
			{ID: 1, Opcode: WRRDMAWrite, Length: 2000, RemoteAddr: 0x10000, RKey: simRKey, Local: buf(make([]byte, 2000))},
			{ID: 2, Opcode: WRRDMARead, Length: 3000, RemoteAddr: 0x10000, RKey: simRKey, Local: buf(make([]byte, 3000))},
			{ID: 3, Opcode: WRAtomicFetchAdd, Length: 8, RemoteAddr: 0x10000, RKey: simRKey, Local: buf(make([]byte, 8))},
			{ID: 4, Opcode: WRSend, Length: 0},
		}
		for _, wr := range posted {
			if err := a.qp.Post(wr); err != nil {
				t.Fatal(err)
			}
		}
		a.host.recvs = append(a.host.recvs, Recv{ID: 9, Len: 4096, Buf: buf(make([]byte, 4096))})
		for len(data) >= 2 {
			n := int(binary.BigEndian.Uint16(data))
			data = data[2:]
			if n > len(data) {
				n = len(data)
			}
			p, err := roce.Parse(data[:n])
			data = data[n:]
			if err != nil {
				continue
			}
			p.BTH.DestQP = a.qp.QPN()
			a.qp.Receive(&p)
			a.qp.Flush()
			checkInvariants(t, a.qp)
			s.now = s.now.Add(7 * time.Millisecond)
			a.qp.Tick()
			checkInvariants(t, a.qp)
		}
		a.qp.Close()
		if len(a.host.sendDone) != len(posted) {
			t.Fatalf("%d completions for %d WRs", len(a.host.sendDone), len(posted))
		}
		for i, c := range a.host.sendDone {
			if c.ID != uint64(i) {
				t.Fatalf("completion %d is WR %d", i, c.ID)
			}
			if c.Status == abi.WCSuccess && i > 0 && a.host.sendDone[i-1].Status != abi.WCSuccess {
				t.Fatalf("success after a failure: %+v", a.host.sendDone)
			}
		}
	})
}
