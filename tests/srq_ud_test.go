package tests

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The SRQ and UD tests: two devices of one in-process daemon, each opened
// by guest/verbs through the virtio-user front-end, with the objects of
// docs/spec.md's "Shared receive queues" and "Semantics (UD)".

// noCompletion checks that cq stays empty for d.
func noCompletion(t *testing.T, cq *verbs.CQ, d time.Duration, what string) {
	t.Helper()
	var wc [1]verbs.WC
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		n, err := cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("%s: got completion %+v, want none", what, wc[0])
		}
		time.Sleep(time.Millisecond)
	}
}

// asyncEvent waits for the next async event of c.
func asyncEvent(t *testing.T, c *verbs.Context) abi.Event {
	t.Helper()
	ev, err := c.GetAsyncEvent(5 * time.Second)
	if err != nil {
		t.Fatalf("GetAsyncEvent: %v", err)
	}
	return ev
}

// srqRig is a's RC QPs qa[i] connected to b's qb[i], all of b's on one
// SRQ.
type srqRig struct {
	a, b   *peer
	srq    *verbs.SRQ
	qa, qb []*verbs.QP
}

func newSRQRig(t *testing.T, n int, attr verbs.SRQInitAttr) *srqRig {
	t.Helper()
	hygiene(t)
	_, socks := startDaemon(t, 2)
	r := &srqRig{a: openPeer(t, socks[0], 0), b: openPeer(t, socks[1], 0)}
	var err error
	if r.srq, err = r.b.pd.CreateSRQ(attr); err != nil {
		t.Fatalf("CreateSRQ: %v", err)
	}
	for range n {
		qa, err := r.a.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.a.cq, RecvCQ: r.a.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 1, MaxSendSGE: 2}})
		if err != nil {
			t.Fatal(err)
		}
		qb, err := r.b.pd.CreateQP(verbs.QPInitAttr{SendCQ: r.b.cq, RecvCQ: r.b.cq, SRQ: r.srq, Cap: verbs.QPCap{MaxSendWR: 4}})
		if err != nil {
			t.Fatalf("CreateQP with SRQ: %v", err)
		}
		if err := qa.ConnectRC(r.b.gid, qb.Num(), qb.PSN(), 0); err != nil {
			t.Fatal(err)
		}
		if err := qb.ConnectRC(r.a.gid, qa.Num(), qa.PSN(), 0); err != nil {
			t.Fatal(err)
		}
		r.qa, r.qb = append(r.qa, qa), append(r.qb, qb)
	}
	return r
}

// send sends n bytes from a's MR at off over qa[i], signaled, and waits
// for its completion.
func (r *srqRig) send(t *testing.T, i, off, n int, wrid uint64) {
	t.Helper()
	if err := r.qa[i].PostSend(verbs.SendWR{WRID: wrid, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{r.a.mr.SGE(off, n)}}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, r.a.cq); wc.Status != abi.WCSuccess || wc.WRID != wrid || wc.QPNum != r.qa[i].Num() {
		t.Fatalf("send %d on qa[%d]: got %+v, want success", wrid, i, wc)
	}
}

// teardown destroys the rig's objects in dependency order: DESTROY_SRQ is
// BUSY while a QP names it.
func (r *srqRig) teardown(t *testing.T) {
	t.Helper()
	if err := r.srq.Destroy(); !errors.Is(err, abi.StatusBusy) {
		t.Errorf("DESTROY_SRQ with QPs on it: got %v, want BUSY", err)
	}
	for i := range r.qa {
		if err := r.qa[i].Destroy(); err != nil {
			t.Errorf("destroy qa[%d]: %v", i, err)
		}
		if err := r.qb[i].Destroy(); err != nil {
			t.Errorf("destroy qb[%d]: %v", i, err)
		}
	}
	if err := r.srq.Destroy(); err != nil {
		t.Errorf("destroy srq: %v", err)
	}
	r.a.teardown(t)
	r.b.teardown(t)
}

// TestVerbsSRQShared: two QPs of device B take their receives from one
// SRQ, in the SRQ's ring order whichever QP a message arrives on; the
// data lands in the WQE's buffer, the CQE names the QP that received it
// and the sender; a QP moved to ERR leaves the SRQ's WQEs to the other
// and posts QP_LAST_WQE_REACHED.
func TestVerbsSRQShared(t *testing.T) {
	r := newSRQRig(t, 2, verbs.SRQInitAttr{MaxWR: 16, MaxSGE: 2})
	a, b := r.a, r.b
	if r.qb[0].SRQ() != r.srq || r.qb[0].Cap().MaxRecvWR != 0 {
		t.Fatalf("QP on the SRQ: srq %v, cap %+v", r.qb[0].SRQ(), r.qb[0].Cap())
	}
	if err := r.qb[0].PostRecv(verbs.RecvWR{}); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("PostRecv on a QP with an SRQ: got %v, want ErrInvalid", err)
	}
	qa, err := r.srq.Query()
	if err != nil {
		t.Fatal(err)
	}
	if qa.MaxWR != 16 || qa.SRQLimit != 0 {
		t.Errorf("QUERY_SRQ: got %+v, want max_wr 16, no limit", qa)
	}
	// Six receives of 1 KiB (the fifth with two SGEs) at 2 KiB strides of B's MR.
	const slot = 2048
	for i := range 6 {
		sgl := []abi.SGE{b.mr.SGE(i*slot, 1024)}
		if i == 4 {
			sgl = []abi.SGE{b.mr.SGE(i*slot, 100), b.mr.SGE(i*slot+200, 924)}
		}
		if err := r.srq.PostRecv(verbs.RecvWR{WRID: uint64(100 + i), SGL: sgl}); err != nil {
			t.Fatal(err)
		}
	}
	fill(a.mr.Bytes()[:8*1024], 5)
	// Messages alternate between the QPs; the SRQ's WQEs are consumed in
	// order 100, 101, … whichever QP receives.
	order := []int{0, 1, 1, 0}
	for k, i := range order {
		n := 200 + 100*k
		r.send(t, i, k*1024, n, uint64(k))
		wc := pollOne(t, b.cq)
		if wc.Status != abi.WCSuccess || wc.WRID != uint64(100+k) || wc.Opcode != abi.WCOpRecv || wc.ByteLen != uint32(n) ||
			wc.QPNum != r.qb[i].Num() || wc.SrcQP != r.qa[i].Num() {
			t.Fatalf("message %d on qb[%d]: got %+v, want wr %d, %d bytes, qp %d from %d", k, i, wc, 100+k, n, r.qb[i].Num(), r.qa[i].Num())
		}
		if got, want := b.mr.Bytes()[k*slot:k*slot+n], a.mr.Bytes()[k*1024:k*1024+n]; !bytes.Equal(got, want) {
			t.Fatalf("message %d: the bytes in SRQ WQE %d differ from the sent ones", k, 100+k)
		}
	}
	// The two-SGE WQE scatters: 100 bytes, then 924 at +200.
	r.send(t, 1, 0, 1024, 4)
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 104 || wc.ByteLen != 1024 || wc.QPNum != r.qb[1].Num() {
		t.Fatalf("two-SGE receive: got %+v", wc)
	}
	got := append(append([]byte(nil), b.mr.Bytes()[4*slot:4*slot+100]...), b.mr.Bytes()[4*slot+200:4*slot+1124]...)
	if !bytes.Equal(got, a.mr.Bytes()[:1024]) {
		t.Fatal("two-SGE receive: the scattered bytes differ")
	}

	// qb[0] to ERR: the SRQ's last WQE stays for qb[1], and the device says
	// qb[0] will consume no more.
	if err := r.qb[0].Modify(abi.QPAttr{QPState: abi.QPSErr}, abi.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if ev := asyncEvent(t, b.ctx); ev.Type != abi.EventQPLastWQE || ev.Handle != r.qb[0].Num() {
		t.Errorf("after qb[0] to ERR: got event %+v, want QP_LAST_WQE_REACHED %d", ev, r.qb[0].Num())
	}
	noCompletion(t, b.cq, 50*time.Millisecond, "qb[0] in ERR with an SRQ (nothing of the SRQ's to flush)")
	r.send(t, 1, 2048, 300, 5)
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 105 || wc.QPNum != r.qb[1].Num() {
		t.Fatalf("after qb[0] went to ERR: got %+v, want WQE 105 on qb[1]", wc)
	}
	if !bytes.Equal(b.mr.Bytes()[5*slot:5*slot+300], a.mr.Bytes()[2048:2048+300]) {
		t.Fatal("after qb[0] went to ERR: the bytes differ")
	}
	r.teardown(t)
}

// TestVerbsSRQEmptyThenPost: a SEND to a QP whose SRQ is empty waits
// (receiver not ready, RNR retry forever) and completes as soon as a
// receive is posted to the SRQ: the post sees notify 1 and rings the
// doorbell (docs/spec.md, struct vrdma_srq_record).
func TestVerbsSRQEmptyThenPost(t *testing.T) {
	r := newSRQRig(t, 1, verbs.SRQInitAttr{MaxWR: 4})
	a, b := r.a, r.b
	fill(a.mr.Bytes()[:64], 3)
	if err := r.qa[0].PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{a.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	noCompletion(t, a.cq, 100*time.Millisecond, "a SEND to an empty SRQ")
	if err := r.srq.PostRecv(verbs.RecvWR{WRID: 9, SGL: []abi.SGE{b.mr.SGE(0, 64)}}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 9 || wc.ByteLen != 64 {
		t.Fatalf("receiver: got %+v", wc)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != 1 {
		t.Fatalf("sender: got %+v", wc)
	}
	if !bytes.Equal(b.mr.Bytes()[:64], a.mr.Bytes()[:64]) {
		t.Fatal("the bytes differ")
	}
	r.teardown(t)
}

// TestVerbsSRQLimit: an armed limit fires SRQ_LIMIT_REACHED once the SRQ
// holds fewer WQEs than the limit after a consumption, then is disarmed
// (QUERY_SRQ answers 0).
func TestVerbsSRQLimit(t *testing.T) {
	r := newSRQRig(t, 1, verbs.SRQInitAttr{MaxWR: 8})
	b := r.b
	for i := range 4 {
		if err := r.srq.PostRecv(verbs.RecvWR{WRID: uint64(i), SGL: []abi.SGE{b.mr.SGE(i*256, 256)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.srq.ArmLimit(3); err != nil {
		t.Fatal(err)
	}
	if a, err := r.srq.Query(); err != nil || a.SRQLimit != 3 {
		t.Fatalf("QUERY_SRQ after arming 3: got %+v, %v", a, err)
	}
	// 4 → 3 WQEs: not fewer than 3, no event.
	r.send(t, 0, 0, 16, 1)
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 0 {
		t.Fatalf("got %+v", wc)
	}
	if ev, err := b.ctx.GetAsyncEvent(100 * time.Millisecond); !errors.Is(err, verbs.ErrTimeout) {
		t.Fatalf("3 WQEs left, limit 3: got event %+v, %v, want none", ev, err)
	}
	// 3 → 2: below the limit.
	r.send(t, 0, 0, 16, 2)
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 1 {
		t.Fatalf("got %+v", wc)
	}
	if ev := asyncEvent(t, b.ctx); ev.Type != abi.EventSRQLimit || ev.Handle != r.srq.Num() {
		t.Fatalf("2 WQEs left, limit 3: got %+v, want SRQ_LIMIT_REACHED %d", ev, r.srq.Num())
	}
	if a, err := r.srq.Query(); err != nil || a.SRQLimit != 0 || a.MaxWR != 8 {
		t.Fatalf("QUERY_SRQ after the event: got %+v, %v, want limit 0", a, err)
	}
	// Disarmed: no second event.
	r.send(t, 0, 0, 16, 3)
	pollOne(t, b.cq)
	if ev, err := b.ctx.GetAsyncEvent(100 * time.Millisecond); !errors.Is(err, verbs.ErrTimeout) {
		t.Fatalf("after the limit fired: got event %+v, %v, want none", ev, err)
	}
	// Armed at creation: fires on the first consumption below it.
	srq2, err := b.pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 4, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if a, err := srq2.Query(); err != nil || a.SRQLimit != 2 || a.MaxWR != 4 {
		t.Fatalf("QUERY_SRQ of an SRQ created with limit 2: got %+v, %v", a, err)
	}
	if err := srq2.Modify(abi.SRQAttr{MaxWR: 8}, abi.SRQAttrMaxWR); !errors.Is(err, verbs.ErrUnsupported) {
		t.Errorf("resize: got %v, want ErrUnsupported", err)
	}
	if err := srq2.Destroy(); err != nil {
		t.Fatal(err)
	}
	r.teardown(t)
}

// udPeer is a peer with a UD QP (its own receive queue) ready with qkey.
type udPeer struct {
	*peer
	ud *verbs.QP
}

const testQKey = 0x11110000

func openUDPeer(t *testing.T, sock string) *udPeer {
	t.Helper()
	p := &udPeer{peer: openPeer(t, sock, 0)}
	var err error
	if p.ud, err = p.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeUD, SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxRecvSGE: 2, MaxInlineData: 64}}); err != nil {
		t.Fatalf("create UD QP: %v", err)
	}
	if err := p.ud.ReadyUD(testQKey); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *udPeer) teardown(t *testing.T) {
	t.Helper()
	if err := p.ud.Destroy(); err != nil {
		t.Errorf("destroy UD QP: %v", err)
	}
	p.peer.teardown(t)
}

func isV4Mapped(g [16]byte) bool {
	return g[10] == 0xff && g[11] == 0xff && [10]byte(g[:10]) == [10]byte{}
}

// checkGRH checks the 40 bytes in front of a datagram of n payload bytes
// from sgid to dgid against docs/spec.md, "Semantics (UD)", byte by byte.
func checkGRH(t *testing.T, grh []byte, sgid, dgid [16]byte, n int) {
	t.Helper()
	if isV4Mapped(sgid) && isV4Mapped(dgid) {
		want := make([]byte, 40)
		ip := want[20:]
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+8+12+8+n+4))
		ip[8], ip[9] = 64, 17
		copy(ip[12:16], sgid[12:])
		copy(ip[16:20], dgid[12:])
		// Fields the spec leaves to the device (TOS, id, flags, checksum)
		// are taken from what arrived.
		copy(ip[1:2], grh[21:22])
		copy(ip[4:8], grh[24:28])
		copy(ip[10:12], grh[30:32])
		if !bytes.Equal(grh, want) {
			t.Errorf("IPv4 GRH:\n got %x\nwant %x", grh, want)
		}
	} else {
		if grh[0]>>4 != 6 || int(binary.BigEndian.Uint16(grh[4:])) != 8+12+8+n+4 || grh[6] != 17 || grh[7] != 64 ||
			!bytes.Equal(grh[8:24], sgid[:]) || !bytes.Equal(grh[24:40], dgid[:]) {
			t.Errorf("IPv6 GRH: got %x; want version 6, payload length %d, next header 17, hop limit 64, %x → %x",
				grh, 8+12+8+n+4, sgid, dgid)
		}
	}
	g, err := verbs.ParseGRH(grh)
	if err != nil || g.SGID != sgid || g.DGID != dgid {
		t.Errorf("ParseGRH: got %+v, %v, want %x → %x", g, err, sgid, dgid)
	}
}

// TestVerbsUDPing: a UD ping from device A to device B and the pong back
// to the GID the ping's GRH names; the receive buffer starts with the GRH,
// the CQE says GRH, src_qp and the immediate; then a datagram with the
// wrong Q_Key, one to a QP that does not exist and one with SEND to an RC
// QP are dropped without touching B's receives, while the sender sees
// success; an oversize datagram is LOC_LEN_ERR.
func TestVerbsUDPing(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b := openUDPeer(t, socks[0]), openUDPeer(t, socks[1])
	if qa, err := a.ud.Query(); err != nil || qa.QPState != abi.QPSRTS || qa.QKey != testQKey {
		t.Fatalf("QUERY_QP of the UD QP: got %+v, %v, want RTS with Q_Key %#x", qa, err, testQKey)
	}
	ahB, err := a.pd.CreateAH(verbs.AHAttr{DGID: b.gid})
	if err != nil {
		t.Fatalf("CreateAH: %v", err)
	}
	const n = 1000
	// B's receive: 40 + n bytes at 4096, two SGEs (the GRH and the first
	// 60 payload bytes, then the rest).
	if err := b.ud.PostRecv(verbs.RecvWR{WRID: 7, SGL: []abi.SGE{b.mr.SGE(4096, 100), b.mr.SGE(8192, n)}}); err != nil {
		t.Fatal(err)
	}
	fill(a.mr.Bytes()[:n], 11)
	if err := a.ud.PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled, Imm: 0xc0ffee,
		SGL: []abi.SGE{a.mr.SGE(0, n)}, AH: ahB, RemoteQPN: b.ud.Num(), RemoteQKey: testQKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != 1 || wc.Opcode != abi.WCOpSend || wc.QPNum != a.ud.Num() {
		t.Fatalf("ping sender: got %+v", wc)
	}
	wc := pollOne(t, b.cq)
	if wc.Status != abi.WCSuccess || wc.WRID != 7 || wc.Opcode != abi.WCOpRecv || wc.ByteLen != abi.GRHSize+n ||
		wc.Flags != abi.WCFlagGRH|abi.WCFlagWithImm || wc.Imm != 0xc0ffee || wc.SrcQP != a.ud.Num() || wc.QPNum != b.ud.Num() {
		t.Fatalf("ping receiver: got %+v, want wr 7, %d bytes, GRH|WITH_IMM, src_qp %d", wc, abi.GRHSize+n, a.ud.Num())
	}
	rb := b.mr.Bytes()
	checkGRH(t, rb[4096:4096+40], a.gid, b.gid, n)
	got := append(append([]byte(nil), rb[4096+40:4096+100]...), rb[8192:8192+n-60]...)
	if !bytes.Equal(got, a.mr.Bytes()[:n]) {
		t.Fatal("ping: the payload after the GRH differs from the sent bytes")
	}

	// The pong goes to the GID the GRH names, with B's own Q_Key (bit 31),
	// inline.
	g, err := verbs.ParseGRH(rb[4096 : 4096+40])
	if err != nil {
		t.Fatal(err)
	}
	ahA, err := b.pd.CreateAH(verbs.AHAttr{DGID: g.SGID})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.ud.PostRecv(verbs.RecvWR{WRID: 8, SGL: []abi.SGE{a.mr.SGE(16384, 40+64)}}); err != nil {
		t.Fatal(err)
	}
	if err := b.ud.PostSend(verbs.SendWR{WRID: 2, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, Inline: []byte("pong"),
		AH: ahA, RemoteQPN: wc.SrcQP, RemoteQKey: abi.QKeyUseQP}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 2 {
		t.Fatalf("pong sender: got %+v", wc)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != 8 || wc.ByteLen != 44 || wc.Flags != abi.WCFlagGRH || wc.SrcQP != b.ud.Num() {
		t.Fatalf("pong receiver: got %+v", wc)
	}
	checkGRH(t, a.mr.Bytes()[16384:16384+40], b.gid, a.gid, 4)
	if got := string(a.mr.Bytes()[16384+40 : 16384+44]); got != "pong" {
		t.Errorf("pong payload: got %q", got)
	}

	// Dropped datagrams: each completes successfully at the sender and
	// leaves B's posted receive (wr 9) to the next valid datagram.
	if err := b.ud.PostRecv(verbs.RecvWR{WRID: 9, SGL: []abi.SGE{b.mr.SGE(0, 40+64)}}); err != nil {
		t.Fatal(err)
	}
	drops := []struct {
		name string
		wr   verbs.SendWR
	}{
		{"Q_Key mismatch", verbs.SendWR{RemoteQPN: b.ud.Num(), RemoteQKey: testQKey + 1}},
		{"the sender's own Q_Key differs", verbs.SendWR{RemoteQPN: b.ud.Num(), RemoteQKey: abi.QKeyUseQP}},
		{"no such QP", verbs.SendWR{RemoteQPN: b.ud.Num() ^ 0x800000, RemoteQKey: testQKey}},
		{"an RC QP", verbs.SendWR{RemoteQPN: b.qp.Num(), RemoteQKey: testQKey}},
	}
	// A's Q_Key differs from B's for the QKeyUseQP case.
	if err := a.ud.Modify(abi.QPAttr{QPState: abi.QPSRTS, QKey: testQKey + 2}, abi.QPAttrState|abi.QPAttrQKey); err != nil {
		t.Fatalf("RTS → RTS with QKEY: %v", err)
	}
	for i, d := range drops {
		wr := d.wr
		wr.WRID, wr.Opcode, wr.Flags, wr.Inline, wr.AH = uint64(20+i), abi.WROpSend, abi.WRFlagSignaled, []byte("drop"), ahB
		if err := a.ud.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != uint64(20+i) {
			t.Fatalf("%s: sender got %+v, want success (UD is unreliable)", d.name, wc)
		}
	}
	noCompletion(t, b.cq, 100*time.Millisecond, "dropped datagrams")
	if err := a.ud.PostSend(verbs.SendWR{WRID: 30, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, Inline: []byte("keep"),
		AH: ahB, RemoteQPN: b.ud.Num(), RemoteQKey: testQKey}); err != nil {
		t.Fatal(err)
	}
	pollOne(t, a.cq)
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 9 || wc.ByteLen != 44 || wc.SrcQP != a.ud.Num() {
		t.Fatalf("after the drops: got %+v, want wr 9 with the valid datagram", wc)
	}
	if got := string(b.mr.Bytes()[40:44]); got != "keep" {
		t.Errorf("after the drops: payload %q, want \"keep\"", got)
	}

	// Longer than the port's active MTU (4096): LOC_LEN_ERR at the sender.
	pa, err := a.ctx.QueryPort()
	if err != nil {
		t.Fatal(err)
	}
	mtu := 128 << pa.ActiveMTU
	if err := a.ud.PostSend(verbs.SendWR{WRID: 31, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, mtu+1)}, AH: ahB, RemoteQPN: b.ud.Num(), RemoteQKey: testQKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCLocLenErr || wc.WRID != 31 {
		t.Fatalf("datagram of MTU+1 = %d bytes: got %+v, want LOC_LEN_ERR", mtu+1, wc)
	}
	for _, ah := range []*verbs.AH{ahA, ahB} {
		if err := ah.Destroy(); err != nil {
			t.Errorf("destroy AH: %v", err)
		}
	}
	a.teardown(t)
	b.teardown(t)
}

// TestVerbsUDRecvTooSmall: a receive WQE with room for less than the GRH
// and the payload completes with LOC_LEN_ERR and moves the receiving QP
// to ERR.
func TestVerbsUDRecvTooSmall(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b := openUDPeer(t, socks[0]), openUDPeer(t, socks[1])
	ahB, err := a.pd.CreateAH(verbs.AHAttr{DGID: b.gid})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ud.PostRecv(verbs.RecvWR{WRID: 5, SGL: []abi.SGE{b.mr.SGE(0, 40+10)}}); err != nil {
		t.Fatal(err)
	}
	if err := a.ud.PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{a.mr.SGE(0, 11)},
		AH: ahB, RemoteQPN: b.ud.Num(), RemoteQKey: testQKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess {
		t.Fatalf("sender: got %+v", wc)
	}
	if wc := pollOne(t, b.cq); wc.Status != abi.WCLocLenErr || wc.WRID != 5 {
		t.Fatalf("receiver: got %+v, want LOC_LEN_ERR", wc)
	}
	if qa, err := b.ud.Query(); err != nil || qa.QPState != abi.QPSErr {
		t.Fatalf("receiving QP after LOC_LEN_ERR: got %+v, %v, want ERR", qa, err)
	}
	if err := ahB.Destroy(); err != nil {
		t.Error(err)
	}
	a.teardown(t)
	b.teardown(t)
}

// TestVerbsUDOnSRQ: UD QPs of device B on one SRQ receive datagrams into
// the SRQ's WQEs in order, each with its GRH.
func TestVerbsUDOnSRQ(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b := openUDPeer(t, socks[0]), openPeer(t, socks[1], 0)
	srq, err := b.pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	var qbs []*verbs.QP
	for range 2 {
		qb, err := b.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeUD, SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 2}})
		if err != nil {
			t.Fatalf("UD QP on an SRQ: %v", err)
		}
		if err := qb.ReadyUD(testQKey); err != nil {
			t.Fatal(err)
		}
		qbs = append(qbs, qb)
	}
	for i := range 2 {
		if err := srq.PostRecv(verbs.RecvWR{WRID: uint64(50 + i), SGL: []abi.SGE{b.mr.SGE(i*1024, 1024)}}); err != nil {
			t.Fatal(err)
		}
	}
	ahB, err := a.pd.CreateAH(verbs.AHAttr{DGID: b.gid})
	if err != nil {
		t.Fatal(err)
	}
	for k, i := range []int{1, 0} {
		msg := []byte{byte('x' + k), 1, 2, 3}
		if err := a.ud.PostSend(verbs.SendWR{WRID: uint64(k), Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, Inline: msg,
			AH: ahB, RemoteQPN: qbs[i].Num(), RemoteQKey: testQKey}); err != nil {
			t.Fatal(err)
		}
		pollOne(t, a.cq)
		wc := pollOne(t, b.cq)
		if wc.Status != abi.WCSuccess || wc.WRID != uint64(50+k) || wc.QPNum != qbs[i].Num() || wc.SrcQP != a.ud.Num() ||
			wc.Flags != abi.WCFlagGRH || wc.ByteLen != 44 {
			t.Fatalf("datagram %d to qb[%d]: got %+v", k, i, wc)
		}
		buf := b.mr.Bytes()[k*1024:]
		checkGRH(t, buf[:40], a.gid, b.gid, len(msg))
		if !bytes.Equal(buf[40:44], msg) {
			t.Errorf("datagram %d: payload %x, want %x", k, buf[40:44], msg)
		}
	}
	for _, qb := range qbs {
		if err := qb.Destroy(); err != nil {
			t.Error(err)
		}
	}
	if err := srq.Destroy(); err != nil {
		t.Error(err)
	}
	if err := ahB.Destroy(); err != nil {
		t.Error(err)
	}
	a.teardown(t)
	b.teardown(t)
}

// TestVerbsUDDestroyedAH: a send WQE naming an AH destroyed before the
// device reached it completes with LOC_QP_OP_ERR (docs/spec.md, CREATE_AH).
func TestVerbsUDDestroyedAH(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b := openUDPeer(t, socks[0]), openUDPeer(t, socks[1])
	ahB, err := a.pd.CreateAH(verbs.AHAttr{DGID: b.gid})
	if err != nil {
		t.Fatal(err)
	}
	if err := ahB.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := b.ud.PostRecv(verbs.RecvWR{WRID: 1, SGL: []abi.SGE{b.mr.SGE(0, 100)}}); err != nil {
		t.Fatal(err)
	}
	if err := a.ud.PostSend(verbs.SendWR{WRID: 2, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, Inline: []byte("x"),
		AH: ahB, RemoteQPN: b.ud.Num(), RemoteQKey: testQKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCLocQPOpErr || wc.WRID != 2 {
		t.Fatalf("send through a destroyed AH: got %+v, want LOC_QP_OP_ERR", wc)
	}
	noCompletion(t, b.cq, 50*time.Millisecond, "a datagram through a destroyed AH")
	a.teardown(t)
	b.teardown(t)
}

// TestVerbsUDIPv4GRH: two devices each add their assigned IPv4 address as
// GID 1; a datagram sent from GID 1 to the other's IPv4-mapped GID
// arrives with the IPv4 form of the GRH (20 zero bytes, then an IPv4
// header with both addresses).
func TestVerbsUDIPv4GRH(t *testing.T) {
	hygiene(t)
	dir := t.TempDir()
	d := daemon.New(testLogger(t), daemon.Config{})
	t.Cleanup(func() { d.Close() })
	addrs := map[string]netip.Addr{"a": netip.MustParseAddr("10.12.0.1"), "b": netip.MustParseAddr("10.12.0.2")}
	peers := map[string]*udPeer{}
	for _, id := range []string{"a", "b"} {
		s := filepath.Join(dir, id+".sock")
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: id, Socket: s,
			Device: rdma.Config{ID: id, AllowedGIDs: []netip.Prefix{netip.PrefixFrom(addrs[id], 32)}}}); err != nil {
			t.Fatal(err)
		}
		p := openUDPeer(t, s)
		g := netip.AddrFrom16(addrs[id].As16()).As16()
		if st, _ := rawCmd(t, p.peer, abi.CmdAddGID, abi.Marshal(&abi.GIDEntry{PortNum: 1, Index: 1, GID: g, GIDType: abi.GIDTypeRoCEv2}), 0); st != abi.StatusOK {
			t.Fatalf("%s: ADD_GID of its address: %v", id, st)
		}
		peers[id] = p
	}
	a, b := peers["a"], peers["b"]
	ga, gb := netip.AddrFrom16(addrs["a"].As16()).As16(), netip.AddrFrom16(addrs["b"].As16()).As16()
	ah, err := a.pd.CreateAH(verbs.AHAttr{DGID: gb, SGIDIndex: 1})
	if err != nil {
		t.Fatalf("CreateAH to B's IPv4 GID: %v", err)
	}
	if err := b.ud.PostRecv(verbs.RecvWR{WRID: 3, SGL: []abi.SGE{b.mr.SGE(0, 40+300)}}); err != nil {
		t.Fatal(err)
	}
	fill(a.mr.Bytes()[:300], 21)
	if err := a.ud.PostSend(verbs.SendWR{WRID: 4, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{a.mr.SGE(0, 300)},
		AH: ah, RemoteQPN: b.ud.Num(), RemoteQKey: testQKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess {
		t.Fatalf("sender: got %+v", wc)
	}
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 3 || wc.ByteLen != 340 || wc.Flags != abi.WCFlagGRH || wc.SrcQP != a.ud.Num() {
		t.Fatalf("receiver: got %+v", wc)
	}
	checkGRH(t, b.mr.Bytes()[:40], ga, gb, 300)
	if g, err := verbs.ParseGRH(b.mr.Bytes()[:40]); err != nil || !g.IPv4 || g.HopLimit != 64 {
		t.Errorf("ParseGRH: got %+v, %v, want the IPv4 form, TTL 64", g, err)
	}
	if !bytes.Equal(b.mr.Bytes()[40:340], a.mr.Bytes()[:300]) {
		t.Error("the payload differs")
	}
	if err := ah.Destroy(); err != nil {
		t.Error(err)
	}
	a.teardown(t)
	b.teardown(t)
}

// TestVerbsSRQRoCE: network QPs consume from their SRQ as local ones do.
// Daemons X and Y carry RoCE on two loopback addresses; two RC QPs on Y
// share an SRQ and are connected over RoCEv2 (path MTU 1024, so messages
// span packets) to two QPs on X. Messages alternate between the QPs and
// land in the SRQ's WQEs in ring order, data verified. A UD AH from X's
// network GID to Y's is accepted (UD over RoCEv2: TestVerbsUDRoCE).
func TestVerbsSRQRoCE(t *testing.T) {
	hygiene(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 27))
	addrX := netip.AddrFrom4([4]byte{127, byte(1 + rng.IntN(250)), byte(rng.IntN(256)), byte(1 + rng.IntN(250))})
	addrY := addrX.Next()
	_, sx := roceDaemon(t, addrX, rdma.Config{ID: "x"})
	_, sy := roceDaemon(t, addrY, rdma.Config{ID: "y"})
	a, b := openPeer(t, sx[0], 0), openPeer(t, sy[0], 0)
	gidX, gidY := udp.GID(addrX), udp.GID(addrY)
	srq, err := b.pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	opts := verbs.ConnectOpts{SGIDIndex: 1, PathMTU: abi.MTU1024}
	var qa, qb []*verbs.QP
	for range 2 {
		x, err := a.pd.CreateQP(verbs.QPInitAttr{SendCQ: a.cq, RecvCQ: a.cq, Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 1}})
		if err != nil {
			t.Fatal(err)
		}
		y, err := b.pd.CreateQP(verbs.QPInitAttr{SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 8}})
		if err != nil {
			t.Fatal(err)
		}
		if err := x.ConnectRCOpts(gidY, y.Num(), y.PSN(), 0, opts); err != nil {
			t.Fatal(err)
		}
		if err := y.ConnectRCOpts(gidX, x.Num(), x.PSN(), 0, opts); err != nil {
			t.Fatal(err)
		}
		qa, qb = append(qa, x), append(qb, y)
	}
	const slot = 8192
	for i := range 4 {
		if err := srq.PostRecv(verbs.RecvWR{WRID: uint64(200 + i), SGL: []abi.SGE{b.mr.SGE(i*slot, slot)}}); err != nil {
			t.Fatal(err)
		}
	}
	fill(a.mr.Bytes()[:4*slot], 17)
	for k, i := range []int{1, 0, 0, 1} {
		n := 3000 + 1000*k // 3 to 6 packets of 1024 bytes
		if err := qa[i].PostSend(verbs.SendWR{WRID: uint64(k), Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{a.mr.SGE(k*slot, n)}}); err != nil {
			t.Fatal(err)
		}
		if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != uint64(k) {
			t.Fatalf("sender %d: got %+v", k, wc)
		}
		wc := pollOne(t, b.cq)
		if wc.Status != abi.WCSuccess || wc.WRID != uint64(200+k) || wc.ByteLen != uint32(n) || wc.QPNum != qb[i].Num() || wc.SrcQP != qa[i].Num() {
			t.Fatalf("message %d over RoCEv2 to qb[%d]: got %+v, want wr %d, %d bytes", k, i, wc, 200+k, n)
		}
		if !bytes.Equal(b.mr.Bytes()[k*slot:k*slot+n], a.mr.Bytes()[k*slot:k*slot+n]) {
			t.Fatalf("message %d: the bytes differ", k)
		}
	}
	if ah, err := a.pd.CreateAH(verbs.AHAttr{DGID: gidY, SGIDIndex: 1}); err != nil {
		t.Errorf("UD AH to another host: %v (TestVerbsUDRoCE sends through one)", err)
	} else if err := ah.Destroy(); err != nil {
		t.Error(err)
	}
	for i := range qa {
		if err := qa[i].Destroy(); err != nil {
			t.Error(err)
		}
		if err := qb[i].Destroy(); err != nil {
			t.Error(err)
		}
	}
	if err := srq.Destroy(); err != nil {
		t.Error(err)
	}
	a.teardown(t)
	b.teardown(t)
}

// TestVerbsSRQPD: an SRQ's receive SGEs are checked against the SRQ's PD,
// not the QP's (docs/spec.md, "Shared receive queues"; the QP may be of
// another PD, as in verbs): a key of the SRQ's PD receives, a key of the
// QP's PD is LOC_PROT_ERR at the responder and REM_OP_ERR at the requester.
func TestVerbsSRQPD(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b := openPeer(t, socks[0], 0), openPeer(t, socks[1], 0)
	pd2, err := b.ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf2, err := b.ctx.AllocBuffer(4096)
	if err != nil {
		t.Fatal(err)
	}
	mr2, err := pd2.RegMR(buf2, 0, 4096, abi.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd2.CreateSRQ(verbs.SRQInitAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	qb, err := b.pd.CreateQP(verbs.QPInitAttr{SendCQ: b.cq, RecvCQ: b.cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 2}})
	if err != nil {
		t.Fatalf("QP in another PD than its SRQ: %v", err)
	}
	if err := a.qp.ConnectRC(b.gid, qb.Num(), qb.PSN(), 0); err != nil {
		t.Fatal(err)
	}
	if err := qb.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), 0); err != nil {
		t.Fatal(err)
	}
	// WQE 1: the SRQ's PD's key; WQE 2: the QP's PD's key.
	if err := srq.PostRecv(verbs.RecvWR{WRID: 1, SGL: []abi.SGE{mr2.SGE(0, 4096)}},
		verbs.RecvWR{WRID: 2, SGL: []abi.SGE{b.mr.SGE(0, 4096)}}); err != nil {
		t.Fatal(err)
	}
	fill(a.mr.Bytes()[:512], 40)
	send := func(id uint64) verbs.WC {
		t.Helper()
		if err := a.qp.PostSend(verbs.SendWR{WRID: id, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{a.mr.SGE(0, 512)}}); err != nil {
			t.Fatal(err)
		}
		return pollOne(t, a.cq)
	}
	if wc := send(10); wc.Status != abi.WCSuccess {
		t.Fatalf("into the SRQ's PD's MR: sender got %+v", wc)
	}
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 1 || wc.QPNum != qb.Num() {
		t.Fatalf("into the SRQ's PD's MR: got %+v", wc)
	}
	if !bytes.Equal(mr2.Bytes()[:512], a.mr.Bytes()[:512]) {
		t.Fatal("the bytes differ")
	}
	if wc := send(11); wc.Status != abi.WCRemOpErr {
		t.Fatalf("into the QP's PD's MR: sender got %+v, want REM_OP_ERR", wc)
	}
	if wc := pollOne(t, b.cq); wc.Status != abi.WCLocProtErr || wc.WRID != 2 {
		t.Fatalf("into the QP's PD's MR: receiver got %+v, want LOC_PROT_ERR", wc)
	}
	// The spec orders neither event before the other.
	got := map[abi.Event]bool{asyncEvent(t, b.ctx): true, asyncEvent(t, b.ctx): true}
	for _, want := range []abi.Event{{Type: abi.EventQPFatal, Handle: qb.Num()}, {Type: abi.EventQPLastWQE, Handle: qb.Num()}} {
		if !got[want] {
			t.Errorf("after the responder's error: got events %v, want QP_FATAL and QP_LAST_WQE_REACHED for %d", got, qb.Num())
		}
	}
	if err := qb.Destroy(); err != nil {
		t.Error(err)
	}
	if err := srq.Destroy(); err != nil {
		t.Error(err)
	}
	if err := mr2.Dereg(); err != nil {
		t.Error(err)
	}
	buf2.Free()
	if err := pd2.Dealloc(); err != nil {
		t.Error(err)
	}
	a.teardown(t)
	b.teardown(t)
}

// TestVerbsUDTransitions checks docs/spec.md's UD transition table: QKEY
// is required at RESET → INIT, RC's attributes are INVALID in a UD QP's
// masks, and SQ_PSN is required at RTR → RTS.
func TestVerbsUDTransitions(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 1)
	p := openPeer(t, socks[0], 0)
	ud, err := p.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeUD, SendCQ: p.cq, RecvCQ: p.cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	if err != nil {
		t.Fatal(err)
	}
	init := abi.QPAttr{QPState: abi.QPSInit, PortNum: 1, QKey: 5}
	initMask := abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey
	steps := []struct {
		name string
		attr abi.QPAttr
		mask int
		want abi.Status // 0: OK
	}{
		{"INIT without QKEY", init, initMask &^ abi.QPAttrQKey, abi.StatusInvalid},
		{"INIT with ACCESS_FLAGS", init, initMask | abi.QPAttrAccessFlags, abi.StatusInvalid},
		{"INIT", init, initMask, 0},
		{"RTR with AV", abi.QPAttr{QPState: abi.QPSRTR, DGID: p.gid}, abi.QPAttrState | abi.QPAttrAV, abi.StatusInvalid},
		{"RTR with DEST_QPN", abi.QPAttr{QPState: abi.QPSRTR, DestQPNum: 5}, abi.QPAttrState | abi.QPAttrDestQPN, abi.StatusInvalid},
		{"RTR with QKEY", abi.QPAttr{QPState: abi.QPSRTR, QKey: 6}, abi.QPAttrState | abi.QPAttrQKey, 0},
		{"RTS without SQ_PSN", abi.QPAttr{QPState: abi.QPSRTS}, abi.QPAttrState, abi.StatusInvalid},
		{"RTS with TIMEOUT", abi.QPAttr{QPState: abi.QPSRTS, Timeout: 14}, abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout, abi.StatusInvalid},
		{"RTS", abi.QPAttr{QPState: abi.QPSRTS, SQPSN: 1}, abi.QPAttrState | abi.QPAttrSQPSN, 0},
	}
	for _, s := range steps {
		err := ud.Modify(s.attr, s.mask)
		if s.want == 0 && err != nil || s.want != 0 && !errors.Is(err, s.want) {
			t.Fatalf("%s: got %v, want %v", s.name, err, s.want)
		}
	}
	if qa, err := ud.Query(); err != nil || qa.QPState != abi.QPSRTS || qa.QKey != 6 {
		t.Fatalf("QUERY_QP: got %+v, %v, want RTS with Q_Key 6", qa, err)
	}
	if err := ud.Destroy(); err != nil {
		t.Error(err)
	}
	p.teardown(t)
}
