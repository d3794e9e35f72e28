package rc

import (
	"bytes"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
)

// discard is a Host and a Port that keep nothing.
type discard struct {
	mr   *region
	recv Recv
	sent int
}

func (d *discard) Resolve(rkey uint32, va uint64, n uint32, a Access) (Region, bool) {
	return d.mr, true
}
func (d *discard) TakeRecv() (Recv, bool)       { return d.recv, true }
func (d *discard) RecvDone(RecvCompletion)      {}
func (d *discard) Invalidate(uint32, bool) bool { return true }
func (d *discard) SendDone(Completion)          {}
func (d *discard) Send([]byte)                  { d.sent++ }
func (d *discard) Flush()                       {}
func (d *discard) Wake()                        {}

// TestNoAllocations: in steady state, neither the responder placing
// WRITE and SEND packets and acknowledging them, nor the requester
// segmenting a WRITE and completing it on the ACK, allocates.
func TestNoAllocations(t *testing.T) {
	d := &discard{mr: &region{b: make([]byte, 1<<20), base: 0x10000, rkey: simRKey, access: AccessRemoteWrite}}
	d.recv = Recv{ID: 1, Len: 4096, Buf: buf(make([]byte, 4096))}
	q, err := New(Config{QPN: 1, DestQPN: 2, PMTU: roce.MTU1024}, d, d)
	if err != nil {
		t.Fatal(err)
	}
	payload := make([]byte, 1024)
	w := roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly, PKey: 0xffff, AckReq: true}, RETH: roce.RETH{VA: 0x10000, RKey: simRKey, DMALen: 1024}, Payload: payload}
	s := roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, PKey: 0xffff, AckReq: true}, Payload: payload}
	psn := roce.PSN(0)
	if n := testing.AllocsPerRun(1000, func() {
		w.BTH.PSN, s.BTH.PSN = psn, psn.Add(1)
		psn = psn.Add(2)
		q.Receive(&w)
		q.Receive(&s)
		q.Flush()
	}); n != 0 {
		t.Errorf("responder: %v allocations per two packets", n)
	}
	local := Buffer(buf(make([]byte, 3000)))
	wr := SendWR{ID: 1, Opcode: WRRDMAWrite, Length: 3000, RemoteAddr: 0x20000, RKey: 5, Local: local}
	ack := roce.Packet{BTH: roce.BTH{Opcode: roce.OpAcknowledge, PKey: 0xffff}, AETH: roce.AETH{Syndrome: roce.ACKSyndrome(31)}}
	if n := testing.AllocsPerRun(1000, func() {
		if err := q.Post(wr); err != nil {
			t.Fatal(err)
		}
		ack.BTH.PSN = q.req.psn.Add(uint32(roce.PSNMask))
		q.Receive(&ack)
	}); n != 0 {
		t.Errorf("requester: %v allocations per WRITE of 3 packets", n)
	}
	if c := q.Counters(); c.DropInvalid+c.DropStale+c.DropState != 0 || q.Err() {
		t.Fatalf("counters %+v", c)
	}
}

// inPlace is discard with an InPlacePort that keeps copies of the
// packets it was given, through either way.
type inPlace struct {
	discard
	room     []byte
	reserved bool
	out      [][]byte
}

func (p *inPlace) Send(pkt []byte) { p.out = append(p.out, append([]byte(nil), pkt...)) }
func (p *inPlace) Reserve(n int) []byte {
	if p.reserved {
		panic("Reserve twice without Commit")
	}
	p.reserved = true
	for i := range p.room {
		p.room[i] = 0xee // what an earlier packet left
	}
	return p.room[:n]
}
func (p *inPlace) Commit(pkt []byte) {
	if !p.reserved {
		panic("Commit without Reserve")
	}
	p.reserved = false
	if pkt != nil {
		p.out = append(p.out, append([]byte(nil), pkt...))
	}
}

// TestInPlacePort: a QP over an InPlacePort sends, byte for byte, the
// packets it sends over a plain Port: WRITEs and SENDs of every segment,
// with immediate data and pad, and READ responses.
func TestInPlacePort(t *testing.T) {
	run := func(port Port, d *discard) {
		q, err := New(Config{QPN: 1, DestQPN: 2, PMTU: roce.MTU1024}, d, port)
		if err != nil {
			t.Fatal(err)
		}
		local := buf(make([]byte, 5000))
		for i := range local {
			local[i] = byte(i * 7)
		}
		for i, wr := range []SendWR{
			{Opcode: WRRDMAWrite, Length: 3001},
			{Opcode: WRRDMAWriteWithImm, Length: 1024, Imm: 0x1234},
			{Opcode: WRSend, Length: 2050},
			{Opcode: WRSendWithImm, Length: 3, Imm: 7},
			{Opcode: WRSend, Length: 0},
		} {
			wr.ID, wr.RemoteAddr, wr.RKey, wr.Local = uint64(i), 0x20000, 5, local
			if wr.Length == 0 {
				wr.Local = nil
			}
			if err := q.Post(wr); err != nil {
				t.Fatal(err)
			}
		}
		read := roce.Packet{BTH: roce.BTH{Opcode: roce.OpReadRequest, PKey: 0xffff, AckReq: true},
			RETH: roce.RETH{VA: 0x10000, RKey: simRKey, DMALen: 2500}}
		q.Receive(&read)
		q.Flush()
		if q.Err() {
			t.Fatalf("QP in error: %+v", q.Counters())
		}
	}
	mr := func() *region {
		r := &region{b: make([]byte, 1<<16), base: 0x10000, rkey: simRKey, access: AccessRemoteRead}
		for i := range r.b {
			r.b[i] = byte(i * 13)
		}
		return r
	}
	plain := &inPlace{}
	plain.mr = mr()
	run(plainPort{plain}, &plain.discard)
	ip := &inPlace{room: make([]byte, 8192)}
	ip.mr = mr()
	run(ip, &ip.discard)
	// 3 + 1 + 3 + 1 + 1 requests, 3 READ responses.
	if len(plain.out) != 12 || len(plain.out) != len(ip.out) {
		t.Fatalf("plain Port: %d packets, InPlacePort: %d, want 12", len(plain.out), len(ip.out))
	}
	for i := range plain.out {
		if !bytes.Equal(plain.out[i], ip.out[i]) {
			t.Fatalf("packet %d:\n plain  % x\n inPlace % x", i, plain.out[i], ip.out[i])
		}
	}
}

// plainPort hides inPlace's Reserve and Commit: a Port only.
type plainPort struct{ p *inPlace }

func (p plainPort) Send(pkt []byte) { p.p.Send(pkt) }
func (p plainPort) Flush()          {}
func (p plainPort) Wake()           {}
