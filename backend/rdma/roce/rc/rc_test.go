package rc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

const simMem = 1 << 20

// workload posts, from x to its peer, a WRITE, a READ, a SEND with
// immediate and a FETCH_ADD per size, runs the simulation to the end and
// checks every byte and every completion.
func workload(t *testing.T, s *sim, x *side, sizes []int) {
	t.Helper()
	y := s.peer(x)
	base := y.host.mr.base
	const readArea, atomicOff = simMem / 2, simMem - 8
	copy(y.host.mr.b[readArea:], fill(simMem/2-8, 99))
	type check struct {
		name      string
		got, want []byte
	}
	var checks []check
	var ids []uint64
	woff := 0
	recvs := 0
	for i, n := range sizes {
		id := uint64(i) * 4
		data := fill(n, uint64(i))
		if err := x.qp.Post(SendWR{ID: id, Opcode: WRRDMAWrite, Length: uint32(n), RemoteAddr: base + uint64(woff), RKey: simRKey, Local: buf(data)}); err != nil {
			t.Fatal(err)
		}
		checks = append(checks, check{fmt.Sprintf("write %d", n), y.host.mr.b[woff : woff+n], data})
		woff += n
		rd := make([]byte, n)
		roff := readArea + (i*4099)%(simMem/2-8-n)
		if err := x.qp.Post(SendWR{ID: id + 1, Opcode: WRRDMARead, Length: uint32(n), RemoteAddr: base + uint64(roff), RKey: simRKey, Local: buf(rd)}); err != nil {
			t.Fatal(err)
		}
		checks = append(checks, check{fmt.Sprintf("read %d", n), rd, y.host.mr.b[roff : roff+n]})
		sd := fill(n, uint64(1000+i))
		rb := make([]byte, n+7)
		y.host.recvs = append(y.host.recvs, Recv{ID: uint64(i), Len: uint32(len(rb)), Buf: buf(rb)})
		recvs++
		if err := x.qp.Post(SendWR{ID: id + 2, Opcode: WRSendWithImm, Length: uint32(n), Imm: uint32(i), Local: buf(sd)}); err != nil {
			t.Fatal(err)
		}
		checks = append(checks, check{fmt.Sprintf("send %d", n), rb[:n], sd})
		res := make([]byte, 8)
		if err := x.qp.Post(SendWR{ID: id + 3, Opcode: WRAtomicFetchAdd, Length: 8, RemoteAddr: base + atomicOff, RKey: simRKey, SwapAdd: 1, Local: buf(res)}); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, 8)
		binary.LittleEndian.PutUint64(want, uint64(i))
		checks = append(checks, check{fmt.Sprintf("fetch_add %d", i), res, want})
		ids = append(ids, id, id+1, id+2, id+3)
	}
	s.run(func() bool { return len(x.host.sendDone) == len(ids) && len(y.host.recvDone) == recvs })
	wantStatus(t, x.host.sendDone, ids, abi.WCSuccess)
	for i, c := range y.host.recvDone {
		if c.ID != uint64(i) || c.Status != abi.WCSuccess || c.ByteLen != uint32(sizes[i]) || !c.WithImm || c.Imm != uint32(i) {
			t.Fatalf("receive completion %d: got %+v", i, c)
		}
	}
	for _, c := range checks {
		if !bytes.Equal(c.got, c.want) {
			t.Fatalf("%s: data differs", c.name)
		}
	}
	if got := binary.LittleEndian.Uint64(y.host.mr.b[atomicOff:]); got != uint64(len(sizes)) {
		t.Fatalf("atomic counter %d, want %d", got, len(sizes))
	}
	if got := y.host.mr.atomics; got != len(sizes) {
		t.Fatalf("%d atomics executed, want %d (each exactly once)", got, len(sizes))
	}
}

var sizes = []int{0, 1, 3, 1024, 1025, 2048, 4095, 4096, 4097, 20000, 65536}

func TestTransfers(t *testing.T) {
	for _, tc := range []struct {
		name            string
		pmtu            roce.MTU
		psn             roce.PSN
		loss, reorder   float64
		wantRetransmits bool
	}{
		{name: "1024", pmtu: roce.MTU1024, psn: 100},
		{name: "4096", pmtu: roce.MTU4096, psn: 0},
		{name: "256", pmtu: roce.MTU256, psn: 7},
		{name: "wrap", pmtu: roce.MTU1024, psn: roce.PSNMask - 30},
		{name: "loss", pmtu: roce.MTU1024, psn: roce.PSNMask - 100, loss: 0.05, wantRetransmits: true},
		{name: "reorder", pmtu: roce.MTU1024, psn: 5, reorder: 0.05},
		{name: "loss+reorder", pmtu: roce.MTU2048, psn: 1 << 23, loss: 0.03, reorder: 0.03, wantRetransmits: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, Config{PMTU: tc.pmtu, SQPSN: tc.psn, RQPSN: tc.psn.Add(5000), RetryCnt: 7, RNRRetry: 7, Window: 64}, simMem)
			s.loss, s.reorder = tc.loss, tc.reorder
			workload(t, s, s.a, sizes)
			workload(t, s, s.b, sizes[:5])
			ca := s.a.qp.Counters()
			if tc.wantRetransmits && ca.Retransmits == 0 {
				t.Errorf("no retransmission with loss %v: %+v", tc.loss, ca)
			}
			if !tc.wantRetransmits && tc.reorder == 0 && ca.Retransmits != 0 {
				t.Errorf("%d retransmissions without loss", ca.Retransmits)
			}
			if s.a.qp.Err() || s.b.qp.Err() {
				t.Fatal("QP in the error state")
			}
		})
	}
}

// TestSegmentation checks the opcodes and lengths a 3.5-PMTU WRITE with
// immediate is cut into, and the ACK requests.
func TestSegmentation(t *testing.T) {
	s := newSim(t, Config{PMTU: roce.MTU1024}, simMem)
	data := fill(3584, 1)
	s.b.host.recvs = append(s.b.host.recvs, Recv{ID: 9})
	if err := s.a.qp.Post(SendWR{ID: 1, Opcode: WRRDMAWriteWithImm, Length: 3584, RemoteAddr: 0x10000, RKey: simRKey, Imm: 0xabcd, Local: buf(data)}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		op     roce.Opcode
		n      int
		ackReq bool
	}{{roce.OpWriteFirst, 1024, false}, {roce.OpWriteMiddle, 1024, false}, {roce.OpWriteMiddle, 1024, false}, {roce.OpWriteLastWithImmediate, 512, true}}
	if len(s.a.port.out) != len(want) {
		t.Fatalf("got %d packets, want %d", len(s.a.port.out), len(want))
	}
	for i, w := range want {
		p, err := roce.Parse(s.a.port.out[i])
		if err != nil {
			t.Fatal(err)
		}
		if p.BTH.Opcode != w.op || len(p.Payload) != w.n || p.BTH.AckReq != w.ackReq || p.BTH.PSN != roce.PSN(i) || p.BTH.DestQP != 0x22 {
			t.Errorf("packet %d: got %v %d bytes ackreq %t psn %d, want %v %d %t %d", i, p.BTH.Opcode, len(p.Payload), p.BTH.AckReq, p.BTH.PSN, w.op, w.n, w.ackReq, i)
		}
	}
	s.run(func() bool { return len(s.a.host.sendDone) == 1 })
	if c := s.b.host.recvDone; len(c) != 1 || !c[0].Write || c[0].Imm != 0xabcd || c[0].ByteLen != 3584 || c[0].ID != 9 {
		t.Fatalf("receive completion %+v", c)
	}
	if !bytes.Equal(s.b.host.mr.b[:3584], data) {
		t.Fatal("data differs")
	}
}

// TestTransfersSeeds runs the workload through many loss and reordering
// patterns, both directions at once.
func TestTransfersSeeds(t *testing.T) {
	n := 40
	if testing.Short() {
		n = 8
	}
	for seed := range uint64(n) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			pmtu := []roce.MTU{roce.MTU1024, roce.MTU2048, roce.MTU4096, roce.MTU256}[seed%4]
			psn := roce.PSN(seed * 419430).Add(0)
			s := newSim(t, Config{PMTU: pmtu, SQPSN: psn, RQPSN: psn.Add(uint32(roce.PSNMask) - 10), RetryCnt: 7, RNRRetry: 7, Window: 16 + int(seed)*7, MaxRdAtomic: 1 + int(seed%5)}, simMem)
			s.rng = rand.New(rand.NewPCG(seed*0x9e3779b97f4a7c15+1, seed^0x5bd1e9955bd1e995))
			s.loss, s.reorder = 0.01+float64(seed%4)*0.015, float64(seed%3)*0.03
			workload(t, s, s.a, sizes)
			workload(t, s, s.b, sizes)
		})
	}
}
