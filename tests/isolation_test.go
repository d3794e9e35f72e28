package tests

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/metrics"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Same-host tenant isolation (security issue 25): the devices of one
// vrdmad are tenants that must not reach one another. An attacker device
// A knows the GID and QP number of a victim device B's QP, which is
// connected to a bystander device C's QP, and the handles of B's objects.
// "A QP accepts requests only from the QP it is connected to" (docs/spec.md
// § Semantics): A's requests to B's QP must end exactly as requests to a
// QP that does not exist (RETRY_EXC_ERR), leave B untouched and be counted
// on B's device (engine.Stats.WrongPeer, vrdma_wrong_peer_requests_total);
// B's QP numbers must tell nothing of one another; commands naming B's
// handles on A's control queue must find nothing (NOT_FOUND: "no such
// handle"). In every case B's traffic with C goes on, verified.

// isoRig is one daemon with an attacker a (dev0), a victim b (dev1) and a
// bystander c (dev2); b.qp and c.qp are connected to each other and have
// moved verified bytes both ways.
type isoRig struct {
	d       *daemon.Daemon
	a, b, c *peer
}

func newIsoRig(t *testing.T) *isoRig {
	t.Helper()
	hygiene(t)
	d, socks := startDaemon(t, 3)
	r := &isoRig{d: d, a: openPeer(t, socks[0], 0), b: openPeer(t, socks[1], 0), c: openPeer(t, socks[2], 0)}
	connectPair(t, r.b, r.c)
	verifiedWrite(t, r.b, r.c, 0x01)
	verifiedWrite(t, r.c, r.b, 0x02)
	return r
}

// withQP returns a copy of p whose QP is q (same PD, CQ and MR), for the
// helpers that take a peer (connectPair, verifiedWrite).
func (p *peer) withQP(q *verbs.QP) *peer {
	cp := *p
	cp.qp = q
	return &cp
}

// victimPair gives b and c a fresh QP each, connected to each other, and
// checks that they move verified bytes both ways.
func (r *isoRig) victimPair(t *testing.T, seed byte) (vb, vc *peer) {
	t.Helper()
	vb, vc = r.b.withQP(newPeerQP(t, r.b)), r.c.withQP(newPeerQP(t, r.c))
	connectPair(t, vb, vc)
	verifiedWrite(t, vb, vc, seed)
	verifiedWrite(t, vc, vb, seed+1)
	return vb, vc
}

// attackerQP creates a raw QP of p on p's CQ and connects it to the QP
// dest of the device with GID gid (rnr_retry 0: a SEND never waits).
func attackerQP(t *testing.T, p *peer, gid [16]byte, dest uint32) *rawQP {
	t.Helper()
	q, st := createRawQP(t, p, rawQPSpec{cq: p.cq.Num()})
	if st != abi.StatusOK {
		t.Fatalf("attacker CREATE_QP: got %v, want OK", st)
	}
	q.connect(t, gid, dest, 0)
	return q
}

// reconnect moves the raw QP to RESET and connects it again to (gid, dest).
func (q *rawQP) reconnect(t *testing.T, gid [16]byte, dest uint32) {
	t.Helper()
	if st := q.modify(t, abi.QPAttr{QPState: abi.QPSReset, AttrMask: abi.QPAttrState}); st != abi.StatusOK {
		t.Fatalf("raw qp %#x to RESET: got %v, want OK", q.num, st)
	}
	q.connect(t, gid, dest, 0)
}

// wcShape is what a requester learns from a completion besides its own
// wr_id and QP number: two completions with equal shapes are
// indistinguishable to it.
func wcShape(wc verbs.WC) verbs.WC {
	wc.WRID, wc.QPNum = 0, 0
	return wc
}

// absentQPN returns a QP number that no device of r has (QUERY_QP answers
// NOT_FOUND on each).
func (r *isoRig) absentQPN(t *testing.T, rng *rand.Rand) uint32 {
	t.Helper()
	for range 64 {
		n := 2 + rng.Uint32N(1<<24-3)
		found := false
		for _, p := range []*peer{r.a, r.b, r.c} {
			if st, _ := rawCmd(t, p, abi.CmdQueryQP, abi.Marshal(&abi.Handle{Handle: n}), 96); st != abi.StatusNotFound {
				found = true
			}
		}
		if !found {
			return n
		}
	}
	t.Fatal("no free QP number in 64 draws")
	return 0
}

// wrongPeer is the device's WrongPeer counter: requests from a QP that its
// QP was not connected to.
func wrongPeer(t *testing.T, d *daemon.Daemon, id string) uint64 {
	t.Helper()
	dv, ok := d.Device(id)
	if !ok {
		t.Fatalf("device %s gone", id)
	}
	return dv.Dev.Stats().Engine.WrongPeer
}

// wrongPeerMetric scrapes vrdma_wrong_peer_requests_total from a collector
// over d, by device label.
func wrongPeerMetric(t *testing.T, d *daemon.Daemon) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := reg.Register(metrics.NewCollector(metrics.DaemonSource{D: d}, metrics.BuildInfo{})); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "vrdma_wrong_peer_requests_total" {
			continue
		}
		out := map[string]float64{}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "device" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
		return out
	}
	t.Fatal("vrdma_wrong_peer_requests_total is not exported")
	return nil
}

// sameBytes fails t if got differs from want, naming the first difference.
func sameBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: byte %d is %#02x, want %#02x (unchanged)", what, i, got[i], want[i])
			return
		}
	}
}

// cqEmpty fails t if cq holds a completion.
func cqEmpty(t *testing.T, what string, cq *verbs.CQ) {
	t.Helper()
	var wc [4]verbs.WC
	n, err := cq.Poll(wc[:])
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%s: got completions %+v, want none", what, wc[:n])
	}
}

// qpState is p's QP's state and dest QPN (QUERY_QP through the verbs library).
func qpState(t *testing.T, q *verbs.QP) (state, dest uint32) {
	t.Helper()
	at, err := q.Query()
	if err != nil {
		t.Fatalf("QUERY_QP %#x: %v", q.Num(), err)
	}
	return at.QPState, at.DestQPNum
}

// sendVerified sends 64 fresh bytes from s to d over s.qp into a receive
// posted on d.qp at offset off of d's MR, and checks d's receive
// completion (wr_id, source QP, length) and the bytes.
func sendVerified(t *testing.T, s, d *peer, recvID uint64, off int, seed byte, post bool) {
	t.Helper()
	if post {
		if err := d.qp.PostRecv(verbs.RecvWR{WRID: recvID, SGL: []abi.SGE{d.mr.SGE(off, 4096)}}); err != nil {
			t.Fatal(err)
		}
	}
	src := s.mr.Bytes()[48<<10 : 48<<10+64]
	fill(src, seed)
	if err := s.qp.PostSend(verbs.SendWR{WRID: uint64(seed), Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mr.SGE(48<<10, 64)}}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, s.cq); wc.WRID != uint64(seed) || wc.Status != abi.WCSuccess {
		t.Fatalf("bystander SEND: got %+v, want wr %d SUCCESS", wc, seed)
	}
	wc := pollOne(t, d.cq)
	if wc.WRID != recvID || wc.Status != abi.WCSuccess || wc.Opcode != abi.WCOpRecv || wc.QPNum != d.qp.Num() ||
		wc.SrcQP != s.qp.Num() || wc.ByteLen != 64 {
		t.Fatalf("bystander receive: got %+v, want wr %#x SUCCESS RECV on qp %#x from qp %#x, 64 bytes",
			wc, recvID, d.qp.Num(), s.qp.Num())
	}
	if !bytes.Equal(d.mr.Bytes()[off:off+64], src) {
		t.Fatal("bystander SEND: the bytes received differ from the bytes sent")
	}
}

// Offsets in the peers' 64 KiB MRs (verifiedWrite uses [0, 4K) as source
// and [8K, 12K) as destination; sendVerified sends from [48K, 48K+64)).
const (
	isoTarget = 16 << 10 // B's bytes the attacker writes, reads, and atomically changes (8-aligned)
	isoRecv0  = 32 << 10 // B's first posted receive
	isoRecv1  = 36 << 10 // B's second posted receive
	isoLocal  = 40 << 10 // A's READ / atomic destination, A's WRITE / SEND source
)

// TestIsolationCrossTenantQP: attacker A connects a QP to victim B's QP
// (B's GID and QPN), which is connected to bystander C's. For every verb A
// posts one WR and gets exactly the completion it gets for the same WR to
// a QP number that no device has (RETRY_EXC_ERR): a hit and a miss are
// indistinguishable. B's memory is byte-for-byte unchanged, B's posted
// receives are not consumed and B's CQ gets nothing, B's QP stays RTS
// towards C, A's READ brings back none of B's bytes, and C↔B traffic
// (SEND into the receives posted before the attack, WRITE, both ways)
// completes verified. B's device counts every attack (WrongPeer, and the
// metric); A's and C's count nothing.
func TestIsolationCrossTenantQP(t *testing.T) {
	r := newIsoRig(t)
	a, b := r.a, r.b
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 25))
	before := map[string]uint64{}
	for _, id := range []string{"dev0", "dev1", "dev2"} {
		before[id] = wrongPeer(t, r.d, id)
	}
	sge := func(n uint32) abi.SGE { return abi.SGE{Addr: a.mr.Addr + isoLocal, Length: n, LKey: a.mr.LKey} }
	// Each case builds A's WQE against B's MR; cur is B's 8 bytes at
	// isoTarget (a CMP_SWP that would hit compares equal to them).
	cases := []struct {
		name string
		wqe  func(cur uint64) []byte
	}{
		{"SEND", func(uint64) []byte {
			return wqe(abi.SendWQE{Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, NumSGE: 1}, sge(64))
		}},
		{"SEND_WITH_IMM", func(uint64) []byte {
			return wqe(abi.SendWQE{Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled, NumSGE: 1, ImmData: 0xbadc0de}, sge(64))
		}},
		{"RDMA_WRITE with B's rkey", func(uint64) []byte {
			return wqe(abi.SendWQE{Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
				RemoteAddr: b.mr.Addr + isoTarget, RKey: b.mr.RKey}, sge(256))
		}},
		{"RDMA_WRITE_WITH_IMM with B's rkey", func(uint64) []byte {
			return wqe(abi.SendWQE{Opcode: abi.WROpRDMAWriteWithImm, Flags: abi.WRFlagSignaled, NumSGE: 1, ImmData: 0xbadc0de,
				RemoteAddr: b.mr.Addr + isoTarget, RKey: b.mr.RKey}, sge(256))
		}},
		{"RDMA_READ of B's MR", func(uint64) []byte {
			return wqe(abi.SendWQE{Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, NumSGE: 1,
				RemoteAddr: b.mr.Addr + isoTarget, RKey: b.mr.RKey}, sge(256))
		}},
		{"ATOMIC_CMP_AND_SWP", func(cur uint64) []byte {
			return wqe(abi.SendWQE{Opcode: abi.WROpAtomicCmpSwp, Flags: abi.WRFlagSignaled, NumSGE: 1,
				RemoteAddr: b.mr.Addr + isoTarget, RKey: b.mr.RKey, CompareAdd: cur, Swap: ^cur}, sge(8))
		}},
		{"ATOMIC_FETCH_AND_ADD", func(uint64) []byte {
			return wqe(abi.SendWQE{Opcode: abi.WROpAtomicFetchAdd, Flags: abi.WRFlagSignaled, NumSGE: 1,
				RemoteAddr: b.mr.Addr + isoTarget, RKey: b.mr.RKey, CompareAdd: 1}, sge(8))
		}},
		{"RDMA_WRITE with a wrong rkey", func(uint64) []byte {
			return wqe(abi.SendWQE{Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
				RemoteAddr: b.mr.Addr + isoTarget, RKey: b.mr.RKey ^ 0x5a5a00}, sge(256))
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seed := byte(0x10 * (i + 1))
			vb, vc := r.victimPair(t, seed)
			// B posts two receives; B's and A's memory get known bytes.
			for k, off := range []int{isoRecv0, isoRecv1} {
				if err := vb.qp.PostRecv(verbs.RecvWR{WRID: uint64(0x100 + k), SGL: []abi.SGE{b.mr.SGE(off, 4096)}}); err != nil {
					t.Fatal(err)
				}
			}
			fill(b.mr.Bytes(), seed+3)
			bWant := bytes.Clone(b.mr.Bytes())
			local := a.mr.Bytes()[isoLocal : isoLocal+4096]
			for k := range local {
				local[k] = 0xa5
			}
			aWant := bytes.Clone(local)
			cur := binary.LittleEndian.Uint64(b.mr.Bytes()[isoTarget:])
			w := tc.wqe(cur)

			// The miss: the same WR to a QP number no device has.
			miss := attackerQP(t, a, b.gid, r.absentQPN(t, rng))
			binary.LittleEndian.PutUint64(w, 0x1111)
			miss.post(t, w)
			missWC := pollOne(t, a.cq)
			if missWC.WRID != 0x1111 || missWC.QPNum != miss.num {
				t.Fatalf("miss: got %+v, want wr 0x1111 on qp %#x", missWC, miss.num)
			}
			if missWC.Status != abi.WCRetryExcErr {
				t.Errorf("miss: got %v, want RETRY_EXC_ERR (a request to a QP that does not exist, docs/spec.md)", missWC.Status)
			}

			// The hit: the same WR to B's QP, connected to C's.
			hit := attackerQP(t, a, b.gid, vb.qp.Num())
			binary.LittleEndian.PutUint64(w, 0x2222)
			hit.post(t, w)
			hitWC := pollOne(t, a.cq)
			if hitWC.WRID != 0x2222 || hitWC.QPNum != hit.num {
				t.Fatalf("hit: got %+v, want wr 0x2222 on qp %#x", hitWC, hit.num)
			}
			if wcShape(hitWC) != wcShape(missWC) {
				t.Errorf("attacker's completion: got %+v for B's QP, want %+v as for a QP that does not exist", hitWC, missWC)
			}
			if hs, ms := hit.state(t), miss.state(t); hs != ms {
				t.Errorf("attacker's QP state: got %d after B's QP, want %d as after a missing QP", hs, ms)
			}

			// Nothing of B changed, nothing of B came back.
			sameBytes(t, "B's memory", b.mr.Bytes(), bWant)
			sameBytes(t, "A's READ/atomic destination", local, aWant)
			cqEmpty(t, "B's CQ after the attack", b.cq)
			if st, dest := qpState(t, vb.qp); st != abi.QPSRTS || dest != vc.qp.Num() {
				t.Errorf("B's QP: got state %d towards %#x, want RTS (3) towards C's %#x", st, dest, vc.qp.Num())
			}
			if t.Failed() {
				return // the traffic below would only repeat the failure
			}

			// C's SENDs land in B's receives in order (none was taken),
			// then B→C, and WRITEs both ways.
			sendVerified(t, vc, vb, 0x100, isoRecv0, seed+4, false)
			sendVerified(t, vc, vb, 0x101, isoRecv1, seed+5, false)
			sendVerified(t, vb, vc, 0x200, isoRecv0, seed+6, true)
			verifiedWrite(t, vc, vb, seed+7)
			verifiedWrite(t, vb, vc, seed+8)
			cqEmpty(t, "B's CQ after the bystander traffic", b.cq)
			cqEmpty(t, "C's CQ after the bystander traffic", r.c.cq)
		})
	}
	// The rig's own pair is untouched too.
	if st, dest := qpState(t, r.b.qp); st != abi.QPSRTS || dest != r.c.qp.Num() {
		t.Errorf("B's first QP: got state %d towards %#x, want RTS towards %#x", st, dest, r.c.qp.Num())
	}
	verifiedWrite(t, r.b, r.c, 0xe0)
	verifiedWrite(t, r.c, r.b, 0xe1)

	// Every attack is counted on B, nothing on A or C.
	want := map[string]uint64{"dev0": 0, "dev1": uint64(len(cases)), "dev2": 0}
	for _, id := range []string{"dev0", "dev1", "dev2"} {
		if got := wrongPeer(t, r.d, id) - before[id]; got != want[id] {
			t.Errorf("%s: WrongPeer grew by %d, want %d", id, got, want[id])
		}
	}
	m := wrongPeerMetric(t, r.d)
	for _, id := range []string{"dev0", "dev1", "dev2"} {
		if got, want := m[id], float64(wrongPeer(t, r.d, id)); got != want {
			t.Errorf("vrdma_wrong_peer_requests_total{device=%q}: got %v, want %v (Stats().Engine.WrongPeer)", id, got, want)
		}
	}
	noRingErrors(t, r.d, "dev1", "dev2")
}

// TestIsolationQPNProbing: QP numbers are no oracle. Consecutive QP
// numbers of a device are far apart and two devices' numbers, created in
// the same order, share no structure (uniform 24-bit numbers), so one
// known QPN says nothing of the others. An attacker that connects to B's
// real QPN and to 64 other numbers (B's neighbours and random ones) with
// the most telling WR of all (a WRITE with a wrong rkey: REM_ACCESS_ERR on
// a hit, before the fix) gets the same completion every time, and B's
// QPs and its traffic with C are unaffected.
func TestIsolationQPNProbing(t *testing.T) {
	t.Run("numbers", func(t *testing.T) {
		hygiene(t)
		d, socks := startDaemon(t, 2)
		x, y := openPeer(t, socks[0], 0), openPeer(t, socks[1], 0)
		const n = 64
		var xs, ys []uint32
		seen := map[uint32]bool{x.qp.Num(): true, y.qp.Num(): true}
		for range n {
			for _, s := range []struct {
				p   *peer
				out *[]uint32
			}{{x, &xs}, {y, &ys}} {
				q := newPeerQP(t, s.p)
				num := q.Num()
				if num == 0 || num >= 1<<24 {
					t.Fatalf("QPN %#x: want 1 … 2^24-1", num)
				}
				if seen[num] {
					t.Fatalf("QPN %#x given twice in one daemon", num)
				}
				seen[num] = true
				*s.out = append(*s.out, num)
			}
		}
		t.Logf("dev0 QPNs %#x…, dev1 QPNs %#x…", xs[:4], ys[:4])
		abs := func(v int64) int64 { return max(v, -v) }
		for _, s := range []struct {
			id   string
			nums []uint32
		}{{"dev0", xs}, {"dev1", ys}} {
			near := 0
			for i := 1; i < n; i++ {
				if abs(int64(s.nums[i])-int64(s.nums[i-1])) < 4096 {
					near++
				}
			}
			if near > 2 {
				t.Errorf("%s: %d of %d consecutive QPNs differ by less than 4096, want at most 2 (uniform 24-bit numbers)",
					s.id, near, n-1)
			}
		}
		// Same order on two devices: neither a constant offset nor
		// shared low bytes.
		d0 := int64(xs[0]) - int64(ys[0])
		sameOff, sameLow := 0, 0
		for i := 1; i < n; i++ {
			if abs(int64(xs[i])-int64(ys[i])-d0) < 4096 {
				sameOff++
			}
		}
		for i := range n {
			if xs[i]&0xff == ys[i]&0xff {
				sameLow++
			}
		}
		if sameOff > 2 {
			t.Errorf("dev0's and dev1's i-th QPNs keep nearly the offset of the first pair in %d of %d cases, want at most 2", sameOff, n-1)
		}
		if sameLow == n {
			t.Errorf("dev0's and dev1's i-th QPNs share their low byte in all %d cases", n)
		}
		noRingErrors(t, d, "dev0", "dev1")
	})

	t.Run("probes", func(t *testing.T) {
		r := newIsoRig(t)
		a, b := r.a, r.b
		vb, vc := r.victimPair(t, 0x30)
		before := wrongPeer(t, r.d, "dev1")
		realQPN := vb.qp.Num()
		// B's real QPN first, then its neighbours (±1 … ±16, and ± the
		// old per-device sequence step 256 × 1 … 8), then random numbers:
		// 65 at most, bounded; each a valid QPN (2 … 2^24-2), once.
		cand := []uint32{realQPN}
		for k := 1; k <= 16; k++ {
			cand = append(cand, realQPN+uint32(k), realQPN-uint32(k))
		}
		for k := 1; k <= 8; k++ {
			cand = append(cand, realQPN+uint32(256*k), realQPN-uint32(256*k))
		}
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 64))
		for range 16 {
			cand = append(cand, 2+rng.Uint32N(1<<24-3))
		}
		var targets []uint32
		picked := map[uint32]bool{}
		for _, n := range cand {
			if n >= 2 && n < 1<<24-1 && !picked[n] {
				picked[n] = true
				targets = append(targets, n)
			}
		}
		live := map[uint32]bool{r.b.qp.Num(): true, vb.qp.Num(): true} // B's QPs in RTS
		var wantCount uint64
		q := attackerQP(t, a, b.gid, realQPN)
		fill(b.mr.Bytes(), 0x31)
		bWant := bytes.Clone(b.mr.Bytes())
		var first verbs.WC
		var odd []string // probes whose completion differs from the first's
		for i, dest := range targets {
			if i > 0 {
				q.reconnect(t, b.gid, dest)
			}
			if live[dest] {
				wantCount++
			}
			q.post(t, wqe(abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
				RemoteAddr: b.mr.Addr + isoTarget, RKey: b.mr.RKey ^ 0x5a5a00},
				abi.SGE{Addr: a.mr.Addr, Length: 64, LKey: a.mr.LKey}))
			wc := pollOne(t, a.cq)
			if wc.WRID != uint64(i) || wc.QPNum != q.num {
				t.Fatalf("probe %d: got %+v, want wr %d on qp %#x", i, wc, i, q.num)
			}
			if i == 0 {
				first = wc
				if wc.Status != abi.WCRetryExcErr {
					t.Errorf("probe of B's real QPN %#x: got %v, want RETRY_EXC_ERR", dest, wc.Status)
				}
			} else if wcShape(wc) != wcShape(first) {
				odd = append(odd, fmt.Sprintf("%#x: %v", dest, wc.Status))
			}
		}
		if len(odd) > 0 {
			t.Errorf("%d of %d probes completed otherwise than B's real QPN (%v), an oracle: %v",
				len(odd), len(targets)-1, first.Status, odd[:min(len(odd), 8)])
		}
		sameBytes(t, "B's memory", b.mr.Bytes(), bWant)
		cqEmpty(t, "B's CQ after the probes", b.cq)
		for _, p := range []*peer{r.b, vb} {
			if st, _ := qpState(t, p.qp); st != abi.QPSRTS {
				t.Errorf("B's QP %#x: got state %d after the probes, want RTS (3)", p.qp.Num(), st)
			}
		}
		if got := wrongPeer(t, r.d, "dev1") - before; got != wantCount {
			t.Errorf("dev1: WrongPeer grew by %d, want %d (the probes that named a QP of B in RTS)", got, wantCount)
		}
		if t.Failed() {
			return
		}
		verifiedWrite(t, vc, vb, 0x32)
		verifiedWrite(t, vb, vc, 0x33)
		verifiedWrite(t, r.b, r.c, 0x34)
		verifiedWrite(t, r.c, r.b, 0x35)
		sendVerified(t, vc, vb, 0x300, isoRecv0, 0x36, true)
		noRingErrors(t, r.d, "dev1", "dev2")
	})
}

// createQPReq is a CREATE_QP request on p's memory (fresh rings and
// record, depth 16, 4 SGEs, 64 bytes inline) naming the PD and CQs given.
func createQPReq(t *testing.T, p *peer, pdn, sendCQ, recvCQ uint32) []byte {
	t.Helper()
	const depth, maxSGE, inline = 16, 4, 64
	sqShift := uint32(abi.MinSQWQEShift)
	for 1<<sqShift < abi.SendWQEHdrSize+abi.SGESize*maxSGE || 1<<sqShift < abi.SendWQEHdrSize+inline {
		sqShift++
	}
	rqShift := uint32(abi.MinRQWQEShift)
	for 1<<rqShift < abi.RecvWQEHdrSize+abi.SGESize*maxSGE {
		rqShift++
	}
	sqN := int((uint64(depth)<<sqShift + abi.PageSize - 1) / abi.PageSize)
	rqN := int((uint64(depth)<<rqShift + abi.PageSize - 1) / abi.PageSize)
	req := abi.Marshal(&abi.CreateQP{
		PDN: pdn, SendCQN: sendCQ, RecvCQN: recvCQ, QPType: abi.QPTypeRC,
		MaxSendWR: depth, MaxRecvWR: depth, MaxSendSGE: maxSGE, MaxRecvSGE: maxSGE, MaxInlineData: inline,
		SQWQEShift: sqShift, RQWQEShift: rqShift, Record: p.dma(t, abi.PageSize),
		SQNPages: uint32(sqN), RQNPages: uint32(rqN),
	})
	req = appendPages(req, pagesAt(p.dma(t, uint64(sqN)*abi.PageSize), sqN))
	return appendPages(req, pagesAt(p.dma(t, uint64(rqN)*abi.PageSize), rqN))
}

// TestIsolationForeignHandles: handles are scoped to their device. A's
// control commands naming B's objects (PD, MR keys, CQ, QP, AH) answer
// NOT_FOUND ("no such handle", docs/spec.md), return nothing of B's and
// change nothing of B's: B's QP stays RTS towards C, B's CQ is not armed,
// B's spare objects (nothing depends on them, so a destroy reaching them
// would succeed) still exist, and B↔C traffic completes verified. A WQE of
// A whose SGE names B's lkey completes with LOC_PROT_ERR and moves no byte
// of B's, while A's QP to C works with A's own key.
func TestIsolationForeignHandles(t *testing.T) {
	r := newIsoRig(t)
	a, b, c := r.a, r.b, r.c
	// B's spares: a PD with an MR and an AH, a CQ and a RESET QP of their
	// own; nothing else uses them.
	spd, err := b.ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	sbuf, err := b.ctx.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	smr, err := spd.RegMR(sbuf, 0, 4096, abi.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	scq, err := b.ctx.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	sqp, err := b.pd.CreateQP(verbs.QPInitAttr{SendCQ: b.cq, RecvCQ: b.cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	st, resp := rawCmd(t, b, abi.CmdCreateAH, abi.Marshal(&abi.CreateAH{PDN: spd.Num(), PortNum: 1, DGID: c.gid}), 8)
	if st != abi.StatusOK {
		t.Fatalf("B's CREATE_AH: got %v, want OK", st)
	}
	sah := binary.LittleEndian.Uint32(resp)

	// A handle of B that A happens to hold too (per-device namespaces)
	// would not be a cross-tenant probe.
	aHas := map[uint32]string{a.pd.Num(): "PD", a.cq.Num(): "CQ", a.mr.LKey: "lkey", a.qp.Num(): "QP"}
	for h, what := range map[uint32]string{b.pd.Num(): "PD", spd.Num(): "PD", b.cq.Num(): "CQ", scq.Num(): "CQ",
		b.mr.LKey: "lkey", smr.LKey: "lkey", b.qp.Num(): "QP", sqp.Num(): "QP"} {
		if aHas[h] == what {
			t.Skipf("B's %s %#x is also A's: rerun", what, h)
		}
	}

	page := a.dma(t, abi.PageSize)
	regMR := func(pdn uint32) []byte {
		return appendPages(abi.Marshal(&abi.RegMR{PDN: pdn, Access: abi.AccessAll, IOVA: 1 << 30, Length: abi.PageSize,
			PageShift: abi.PageShift, NPages: 1}), []uint64{page})
	}
	h := func(n uint32) []byte { return abi.Marshal(&abi.Handle{Handle: n}) }
	cmds := []struct {
		name    string
		op      abi.Opcode
		payload []byte
		resp    int
	}{
		{"REG_MR in B's PD", abi.CmdRegMR, regMR(b.pd.Num()), 8},
		{"REG_MR in B's spare PD", abi.CmdRegMR, regMR(spd.Num()), 8},
		{"CREATE_QP in B's PD", abi.CmdCreateQP, createQPReq(t, a, b.pd.Num(), a.cq.Num(), a.cq.Num()), 8},
		{"CREATE_QP on B's CQ", abi.CmdCreateQP, createQPReq(t, a, a.pd.Num(), b.cq.Num(), b.cq.Num()), 8},
		{"CREATE_QP receiving on B's spare CQ", abi.CmdCreateQP, createQPReq(t, a, a.pd.Num(), a.cq.Num(), scq.Num()), 8},
		{"CREATE_QP all B's", abi.CmdCreateQP, createQPReq(t, a, b.pd.Num(), b.cq.Num(), b.cq.Num()), 8},
		{"CREATE_AH in B's PD", abi.CmdCreateAH, abi.Marshal(&abi.CreateAH{PDN: b.pd.Num(), PortNum: 1, DGID: c.gid}), 8},
		{"DEREG_MR of B's lkey", abi.CmdDeregMR, h(b.mr.LKey), 0},
		{"DEREG_MR of B's spare lkey", abi.CmdDeregMR, h(smr.LKey), 0},
		{"DEREG_MR of B's rkey", abi.CmdDeregMR, h(b.mr.RKey), 0},
		{"QUERY_QP of B's QP", abi.CmdQueryQP, h(b.qp.Num()), 96},
		{"MODIFY_QP of B's QP to ERR", abi.CmdModifyQP,
			abi.Marshal(&abi.QPAttr{QPN: b.qp.Num(), AttrMask: abi.QPAttrState, QPState: abi.QPSErr}), 0},
		{"MODIFY_QP of B's QP to RESET", abi.CmdModifyQP,
			abi.Marshal(&abi.QPAttr{QPN: b.qp.Num(), AttrMask: abi.QPAttrState, QPState: abi.QPSReset}), 0},
		{"MODIFY_QP of B's QP (RTS→RTS, access flags)", abi.CmdModifyQP,
			abi.Marshal(&abi.QPAttr{QPN: b.qp.Num(), AttrMask: abi.QPAttrState | abi.QPAttrAccessFlags, QPState: abi.QPSRTS,
				QPAccessFlags: abi.AccessAll &^ abi.AccessLocalWrite}), 0},
		{"REQ_NOTIFY_CQ of B's CQ", abi.CmdReqNotifyCQ, abi.Marshal(&abi.NotifyCQ{CQN: b.cq.Num()}), 0},
		{"REQ_NOTIFY_CQ of B's spare CQ", abi.CmdReqNotifyCQ, abi.Marshal(&abi.NotifyCQ{CQN: scq.Num()}), 0},
		{"DESTROY_QP of B's QP", abi.CmdDestroyQP, h(b.qp.Num()), 0},
		{"DESTROY_QP of B's spare QP", abi.CmdDestroyQP, h(sqp.Num()), 0},
		{"DESTROY_CQ of B's CQ", abi.CmdDestroyCQ, h(b.cq.Num()), 0},
		{"DESTROY_CQ of B's spare CQ", abi.CmdDestroyCQ, h(scq.Num()), 0},
		{"DESTROY_AH of B's AH", abi.CmdDestroyAH, h(sah), 0},
		{"DESTROY_PD of B's PD", abi.CmdDestroyPD, h(b.pd.Num()), 0},
		{"DESTROY_PD of B's spare PD", abi.CmdDestroyPD, h(spd.Num()), 0},
	}
	for i, tc := range cmds {
		t.Run(tc.name, func(t *testing.T) {
			st, resp := rawCmd(t, a, tc.op, tc.payload, tc.resp)
			if st != abi.StatusNotFound {
				t.Errorf("A's %v: got %v, want NOT_FOUND (no such handle)", tc.op, st)
			}
			if !bytes.Equal(resp, make([]byte, len(resp))) {
				t.Errorf("A's %v: got response bytes %x, want none (zero)", tc.op, resp)
			}
			if st, dest := qpState(t, b.qp); st != abi.QPSRTS || dest != c.qp.Num() {
				t.Fatalf("B's QP: got state %d towards %#x, want RTS (3) towards C's %#x", st, dest, c.qp.Num())
			}
			verifiedWrite(t, b, c, byte(0x40+2*i))
			verifiedWrite(t, c, b, byte(0x41+2*i))
		})
	}
	// B's CQ was not armed by A: B's traffic raised no event on B.
	if cq, err := b.ctx.GetCQEvent(100 * time.Millisecond); err == nil {
		t.Errorf("B got a CQ_COMPLETION event for CQ %#x: armed by A's REQ_NOTIFY_CQ", cq.Num())
	}
	// B's objects are all there: SEND both ways, and B itself can still
	// query and destroy its spares (children first).
	sendVerified(t, c, b, 0x400, isoRecv0, 0x70, true)
	sendVerified(t, b, c, 0x401, isoRecv0, 0x71, true)
	if at, err := sqp.Query(); err != nil || at.QPState != abi.QPSReset {
		t.Errorf("B's spare QP: got state %d (%v), want RESET (0)", at.QPState, err)
	}
	for _, s := range []struct {
		name string
		f    func() error
	}{
		{"spare QP", sqp.Destroy},
		{"spare CQ", scq.Destroy},
		{"spare MR", smr.Dereg},
		{"spare AH", func() error {
			if st, _ := rawCmd(t, b, abi.CmdDestroyAH, h(sah), 0); st != abi.StatusOK {
				return fmt.Errorf("DESTROY_AH: %v", st)
			}
			return nil
		}},
		{"spare PD", spd.Dealloc},
	} {
		if err := s.f(); err != nil {
			t.Errorf("B destroys its %s: %v, want success", s.name, err)
		}
	}
	sbuf.Free()

	// A WQE of A naming B's lkey, on A's QP connected to C's: LOC_PROT_ERR,
	// no byte of B's read or written, C's QP unaffected.
	lk := b.mr.LKey
	lkCases := []struct {
		name string
		wqe  []byte
	}{
		{"RDMA_WRITE from B's lkey", wqe(abi.SendWQE{WRID: 0xbad, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
			RemoteAddr: c.mr.Addr + isoTarget, RKey: c.mr.RKey}, abi.SGE{Addr: b.mr.Addr, Length: 256, LKey: lk})},
		{"SEND from B's lkey", wqe(abi.SendWQE{WRID: 0xbad, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, NumSGE: 1},
			abi.SGE{Addr: b.mr.Addr, Length: 256, LKey: lk})},
		{"RDMA_READ into B's lkey", wqe(abi.SendWQE{WRID: 0xbad, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled, NumSGE: 1,
			RemoteAddr: c.mr.Addr + isoTarget, RKey: c.mr.RKey}, abi.SGE{Addr: b.mr.Addr + isoTarget, Length: 256, LKey: lk})},
		{"ATOMIC_FETCH_AND_ADD into B's lkey", wqe(abi.SendWQE{WRID: 0xbad, Opcode: abi.WROpAtomicFetchAdd, Flags: abi.WRFlagSignaled,
			NumSGE: 1, RemoteAddr: c.mr.Addr + isoTarget, RKey: c.mr.RKey, CompareAdd: 1},
			abi.SGE{Addr: b.mr.Addr + isoTarget, Length: 8, LKey: lk})},
	}
	for i, tc := range lkCases {
		t.Run(tc.name, func(t *testing.T) {
			seed := byte(0x80 + 0x10*i)
			aq, st := createRawQP(t, a, rawQPSpec{cq: a.cq.Num()})
			if st != abi.StatusOK {
				t.Fatalf("A's CREATE_QP: got %v, want OK", st)
			}
			cq, st := createRawQP(t, c, rawQPSpec{cq: c.cq.Num()})
			if st != abi.StatusOK {
				t.Fatalf("C's CREATE_QP: got %v, want OK", st)
			}
			aq.connect(t, c.gid, cq.num, 0)
			cq.connect(t, a.gid, aq.num, 0)
			// The connection works with A's own key.
			src := a.mr.Bytes()[:256]
			fill(src, seed)
			aq.post(t, wqe(abi.SendWQE{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
				RemoteAddr: c.mr.Addr + isoTarget, RKey: c.mr.RKey}, a.mr.SGE(0, 256)))
			if wc := pollOne(t, a.cq); wc.WRID != 1 || wc.Status != abi.WCSuccess {
				t.Fatalf("A's WRITE to C with its own lkey: got %+v, want SUCCESS", wc)
			}
			if !bytes.Equal(c.mr.Bytes()[isoTarget:isoTarget+256], src) {
				t.Fatal("A's WRITE to C: the bytes that arrived differ from the bytes sent")
			}
			fill(b.mr.Bytes(), seed+1)
			fill(c.mr.Bytes(), seed+2)
			bWant, cWant := bytes.Clone(b.mr.Bytes()), bytes.Clone(c.mr.Bytes())
			aq.post(t, tc.wqe)
			if wc := pollOne(t, a.cq); wc.WRID != 0xbad || wc.Status != abi.WCLocProtErr || wc.QPNum != aq.num {
				t.Errorf("A's WQE with B's lkey: got %+v, want wr 0xbad LOC_PROT_ERR (4) on qp %#x", wc, aq.num)
			}
			sameBytes(t, "B's memory", b.mr.Bytes(), bWant)
			sameBytes(t, "C's memory", c.mr.Bytes(), cWant)
			cqEmpty(t, "B's CQ", b.cq)
			cqEmpty(t, "C's CQ", c.cq)
			if s := cq.state(t); s != abi.QPSRTS {
				t.Errorf("C's QP after A's local error: got state %d, want RTS (3)", s)
			}
			verifiedWrite(t, b, c, seed+3)
			verifiedWrite(t, c, b, seed+4)
		})
	}
	// The final word: B's QP towards C, and verified bytes.
	if st, dest := qpState(t, b.qp); st != abi.QPSRTS || dest != c.qp.Num() {
		t.Errorf("B's QP: got state %d towards %#x, want RTS (3) towards C's %#x", st, dest, c.qp.Num())
	}
	verifiedWrite(t, b, c, 0xf0)
	verifiedWrite(t, c, b, 0xf1)
	noRingErrors(t, r.d, "dev1", "dev2")
}

// startRoCEDaemon is startDaemon with a RoCE network on one loopback
// address (a random one of 127/8, so that concurrent tests do not share
// UDP 4791): every device's network GID (entry 1) is that address's, and
// a QP connected to it from entry 1 goes through the host's own address.
func startRoCEDaemon(t *testing.T, n int) (*daemon.Daemon, []string, [16]byte) {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 4791))
	addr := netip.AddrFrom4([4]byte{127, byte(1 + rng.IntN(250)), byte(rng.IntN(256)), byte(1 + rng.IntN(250))})
	var devs []rdma.Config
	for i := range n {
		devs = append(devs, rdma.Config{ID: fmt.Sprintf("dev%d", i)})
	}
	d, socks := roceDaemon(t, addr, devs...)
	return d, socks, udp.GID(addr)
}

// roceDaemon starts a daemon carrying RoCE on addr with the devices devs
// (their sockets named by ID, in order); everything goes at the test's end.
func roceDaemon(t *testing.T, addr netip.Addr, devs ...rdma.Config) (*daemon.Daemon, []string) {
	t.Helper()
	net, err := hostnet.New(udp.Config{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := net.Listen(addr); err != nil {
		t.Skipf("RoCE endpoint on %v: %v", addr, err)
	}
	t.Cleanup(func() { net.Close() })
	dir := t.TempDir()
	d := daemon.New(testLogger(t), daemon.Config{RoCE: net, RoCEAddrs: []netip.Addr{addr}})
	t.Cleanup(func() { d.Close() })
	var socks []string
	for _, dev := range devs {
		s := filepath.Join(dir, dev.ID+".sock")
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: dev.ID, Socket: s, Device: dev}); err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
	}
	return d, socks
}

// TestIsolationOwnRoCEAddress: the same attack through the host's own
// RoCE address. With a network, B's QP may be connected to C's through it
// (every device's network GID is the host address's, so B's and C's
// packets, and A's, would all come from that address and port, and only
// the PSN would tell them apart). A remote QP has one peer on a host
// (engine: Fabric.claimConn), so A's QP cannot connect to B's QPN or C's
// there at all: RTR answers BUSY, with any PSN, B's expected one
// included. A's QP connected to a QPN nobody holds gets an error
// completion. Nothing of B changes, B's QP stays RTS towards C, and B↔C
// traffic completes verified (C's next WRITE is not taken for a
// duplicate).
func TestIsolationOwnRoCEAddress(t *testing.T) {
	hygiene(t)
	d, socks, netGID := startRoCEDaemon(t, 3)
	a, b, c := openPeer(t, socks[0], 0), openPeer(t, socks[1], 0), openPeer(t, socks[2], 0)
	for _, p := range []*peer{a, b, c} {
		if g, err := p.ctx.QueryGIDAt(1); err != nil || g != netGID {
			t.Fatalf("GID 1: got %x (%v), want the network GID %x", g, err, netGID)
		}
	}
	acc := abi.AccessAll &^ abi.AccessLocalWrite
	if err := b.qp.ConnectRCOpts(netGID, c.qp.Num(), c.qp.PSN(), acc, verbs.ConnectOpts{SGIDIndex: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.qp.ConnectRCOpts(netGID, b.qp.Num(), b.qp.PSN(), acc, verbs.ConnectOpts{SGIDIndex: 1}); err != nil {
		t.Fatal(err)
	}
	verifiedWrite(t, b, c, 0x01)
	verifiedWrite(t, c, b, 0x02)
	fill(b.mr.Bytes(), 0x71)
	bWant := bytes.Clone(b.mr.Bytes())

	// rtr moves a fresh raw QP of A to INIT and tries RTR towards dest
	// through the host's address, with rq_psn psn.
	rtr := func(t *testing.T, dest, psn uint32) (*rawQP, abi.Status) {
		t.Helper()
		q, st := createRawQP(t, a, rawQPSpec{cq: a.cq.Num()})
		if st != abi.StatusOK {
			t.Fatalf("attacker CREATE_QP: got %v, want OK", st)
		}
		if st := q.modify(t, abi.QPAttr{QPState: abi.QPSInit, PortNum: 1, QPAccessFlags: uint32(acc),
			AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags}); st != abi.StatusOK {
			t.Fatalf("attacker INIT: %v", st)
		}
		return q, q.modify(t, abi.QPAttr{QPState: abi.QPSRTR, PathMTU: abi.MTU4096, DestQPNum: dest, MinRNRTimer: 1,
			DGID: netGID, SGIDIndex: 1, HopLimit: 1, RQPSN: psn,
			AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN |
				abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer})
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for _, tc := range []struct {
		name      string
		dest, psn uint32
	}{
		{"B's QPN, PSN 0", b.qp.Num(), 0},
		{"B's QPN, a random PSN", b.qp.Num(), rng.Uint32N(1 << 24)},
		{"B's QPN, the PSN B expects next", b.qp.Num(), (c.qp.PSN() + 1) & (1<<24 - 1)},
		{"C's QPN", c.qp.Num(), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, st := rtr(t, tc.dest, tc.psn)
			if st != abi.StatusBusy {
				t.Fatalf("attacker's RTR to a remote QP another QP of the host holds: got %v, want BUSY", st)
			}
			if got := q.state(t); got != abi.QPSInit {
				t.Fatalf("attacker's QP after the refused RTR: state %d, want INIT (1)", got)
			}
		})
	}

	// A QPN nobody holds: A connects, and its WRITE ends in error.
	t.Run("a QPN nobody holds", func(t *testing.T) {
		dest := (b.qp.Num() ^ 0x5a5a5a) &^ 1
		if dest < 2 {
			dest = 2
		}
		q, st := rtr(t, dest, 0)
		if st != abi.StatusOK {
			t.Fatalf("attacker's RTR to a free QPN: got %v, want OK", st)
		}
		if st := q.modify(t, abi.QPAttr{QPState: abi.QPSRTS, SQPSN: 0, Timeout: 8, RetryCnt: 2, RNRRetry: 0,
			AttrMask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry |
				abi.QPAttrMaxQPRdAtomic}); st != abi.StatusOK {
			t.Fatalf("attacker's RTS: %v", st)
		}
		q.post(t, wqe(abi.SendWQE{WRID: 0xbad, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
			RemoteAddr: b.mr.Addr + isoTarget, RKey: b.mr.RKey}, abi.SGE{Addr: a.mr.Addr + isoLocal, Length: 256, LKey: a.mr.LKey}))
		if wc := pollOne(t, a.cq); wc.WRID != 0xbad || wc.Status == abi.WCSuccess {
			t.Errorf("attacker's WR: got %+v, want an error completion", wc)
		}
	})

	sameBytes(t, "B's memory", b.mr.Bytes(), bWant)
	cqEmpty(t, "B's CQ after the attacks", b.cq)
	if st, dest := qpState(t, b.qp); st != abi.QPSRTS || dest != c.qp.Num() {
		t.Fatalf("B's QP: got state %d towards %#x, want RTS (3) towards C's %#x", st, dest, c.qp.Num())
	}
	verifiedWrite(t, c, b, 0x72)
	verifiedWrite(t, b, c, 0x73)
	noRingErrors(t, d, "dev1", "dev2")
}
