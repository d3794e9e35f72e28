package engine

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// A key or QP the requester resolved before is looked up again once the
// registry removed it: the cache never answers for a removed object.
func TestKeyCacheForgetsRemoved(t *testing.T) {
	tests := []struct {
		name   string
		remove func(p *pair)
		want   abi.WCStatus
	}{
		{"remote MR", func(p *pair) { p.b.d.RemoveMR(mrKey) }, abi.WCRemAccessErr},
		{"local MR", func(p *pair) { p.a.d.RemoveMR(mrKey) }, abi.WCLocProtErr},
		{"peer QP", func(p *pair) { p.b.d.RemoveQP(p.b.qp.Num) }, abi.WCRetryExcErr},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, pairOpts{})
			a := p.a
			w := abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: mrIOVA, RKey: mrKey}
			for range 3 { // resolved, then served from the cache
				a.postSend(t, w, []abi.SGE{a.sge(0, 64)}, nil)
				p.poll(t)
				if c := a.cqes(t, a.scq); len(c) != 1 || c[0].Status != abi.WCSuccess {
					t.Fatalf("before the removal: %+v", c)
				}
			}
			tc.remove(p)
			w.WRID = 2
			a.postSend(t, w, []abi.SGE{a.sge(0, 64)}, nil)
			p.poll(t)
			if c := a.cqes(t, a.scq); len(c) != 1 || c[0].Status != tc.want {
				t.Fatalf("after the removal: %+v, want status %v", c, tc.want)
			}
		})
	}
}
