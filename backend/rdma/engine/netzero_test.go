package engine

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestNetworkZeroLength: over RoCEv2 as on one host, a zero-length RDMA
// WRITE or READ names no memory: the responder checks neither R_Key nor
// address (UCX's rc_verbs flushes with one), only that its QP takes that
// access at all.
func TestNetworkZeroLength(t *testing.T) {
	p := newNetPair(t, pairOpts{})
	a := p.a
	// A key that names nothing and address 0.
	a.postSend(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RKey: mrKey + 7}, nil, nil)
	a.postSend(t, abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RKey: mrKey + 7}, nil, nil)
	got := a.waitCQEs(t, a.scq, 2)
	want := []abi.CQE{{WRID: 1, Opcode: abi.WCOpRDMAWrite, QPNum: a.qp.Num}, {WRID: 2, Opcode: abi.WCOpRDMARead, QPNum: a.qp.Num}}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("zero-length op %d: got %+v, want %+v", i, got[i], want[i])
		}
	}

	// b's QP takes remote reads only: a zero-length WRITE is refused,
	// with REM_ACCESS_ERR, whatever its key.
	p = newNetPair(t, pairOpts{accessB: abi.AccessRemoteRead})
	a = p.a
	a.postSend(t, abi.SendWQE{WRID: 3, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, RKey: mrKey + 7}, nil, nil)
	a.postSend(t, abi.SendWQE{WRID: 4, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RKey: mrKey}, nil, nil)
	got = a.waitCQEs(t, a.scq, 2)
	if got[0].WRID != 3 || got[0].Status != abi.WCSuccess || got[1].WRID != 4 || got[1].Status != abi.WCRemAccessErr {
		t.Fatalf("QP without remote write: CQEs %+v", got)
	}
}
