package rc

import (
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
)

// TestReceiveAccepted: Receive reports a packet accepted exactly when it
// moved the QP forward (the owner trusts its source from then on, package
// udp): an in-sequence request, an ACK of something outstanding; never a
// request beyond or before the expected PSN, a stale or made-up response,
// or a packet of another partition.
func TestReceiveAccepted(t *testing.T) {
	const start roce.PSN = 0xffffff // the expected PSN wraps during the test
	d := &discard{mr: &region{b: make([]byte, 1<<16), base: 0x10000, rkey: simRKey, access: AccessRemoteWrite}}
	q, err := New(Config{QPN: 1, DestQPN: 2, PMTU: roce.MTU1024, RQPSN: start, SQPSN: 0x10}, d, d)
	if err != nil {
		t.Fatal(err)
	}
	write := func(psn roce.PSN) *roce.Packet {
		return &roce.Packet{BTH: roce.BTH{Opcode: roce.OpWriteOnly, PKey: 0xffff, PSN: psn, AckReq: true},
			RETH: roce.RETH{VA: 0x10000, RKey: simRKey, DMALen: 4}, Payload: []byte{1, 2, 3, 4}}
	}
	ack := func(psn roce.PSN) *roce.Packet {
		return &roce.Packet{BTH: roce.BTH{Opcode: roce.OpAcknowledge, PKey: 0xffff, PSN: psn}, AETH: roce.AETH{Syndrome: roce.ACKSyndrome(31)}}
	}
	otherPKey := write(start)
	otherPKey.BTH.PKey = 0x1234
	steps := []struct {
		name string
		p    *roce.Packet
		want bool
	}{
		{"another partition at the expected PSN", otherPKey, false},
		{"request beyond the expected PSN", write(start.Add(1)), false},
		{"request 64 beyond", write(start.Add(64)), false},
		{"request before the expected PSN (a duplicate)", write(start.Add(uint32(roce.PSNMask))), false},
		{"request at the expected PSN", write(start), true},
		{"the same again (now a duplicate)", write(start), false},
		{"next request", write(start.Add(1)), true},
		{"ACK with nothing outstanding", ack(0x10), false},
		{"ACK of a PSN never sent", ack(0x1234), false},
	}
	for _, s := range steps {
		if got := q.Receive(s.p); got != s.want {
			t.Errorf("%s: got accepted %v, want %v", s.name, got, s.want)
		}
	}
	// The requester: a WRITE of 3 packets (PSNs 0x10 … 0x12) outstanding.
	if err := q.Post(SendWR{ID: 1, Opcode: WRRDMAWrite, Length: 3000, RemoteAddr: 0x20000, RKey: 5, Local: buf(make([]byte, 3000))}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		name string
		p    *roce.Packet
		want bool
	}{
		{"ACK beyond what was sent", ack(0x13), false},
		{"ACK of the first packet", ack(0x10), true},
		{"the same ACK again", ack(0x10), false},
		{"ACK of the rest", ack(0x12), true},
	} {
		if got := q.Receive(s.p); got != s.want {
			t.Errorf("%s: got accepted %v, want %v", s.name, got, s.want)
		}
	}
	if q.Err() {
		t.Fatal("QP in the error state")
	}
}
