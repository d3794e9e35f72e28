package rc

import (
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
func (d *discard) TakeRecv() (Recv, bool)  { return d.recv, true }
func (d *discard) RecvDone(RecvCompletion) {}
func (d *discard) SendDone(Completion)     {}
func (d *discard) Send([]byte)             { d.sent++ }
func (d *discard) Flush()                  {}
func (d *discard) Wake()                   {}

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
