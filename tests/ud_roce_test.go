package tests

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestVerbsUDRoCE: UD datagrams between two daemons over RoCEv2
// (docs/wire.md § UD). Daemons X and Y carry RoCE on two loopback
// addresses; a UD QP on each. A pings B with immediate from X's network
// GID (sgid index 1) to Y's: the CQE says GRH, src_qp, byte_len 40 +
// payload and the immediate, the GRH is the IPv4 header the packet
// arrived with (its total length counts the ImmDt too), the payload is
// the sent bytes. B pongs to the GID and QP number the receive names,
// inline, with its own Q_Key. A wrong Q_Key and an unknown QP number are
// dropped with the sender completing successfully; the next valid
// datagram takes the receive they left. MTU+1 is LOC_LEN_ERR at the
// sender; an AH across address families is INVALID.
func TestVerbsUDRoCE(t *testing.T) {
	hygiene(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 28))
	addrX := netip.AddrFrom4([4]byte{127, byte(1 + rng.IntN(250)), byte(rng.IntN(256)), byte(1 + rng.IntN(250))})
	addrY := addrX.Next()
	_, sx := roceDaemon(t, addrX, rdma.Config{ID: "x"})
	_, sy := roceDaemon(t, addrY, rdma.Config{ID: "y"})
	a, b := openUDPeer(t, sx[0]), openUDPeer(t, sy[0])
	gidX, gidY := udp.GID(addrX), udp.GID(addrY)

	ahB, err := a.pd.CreateAH(verbs.AHAttr{DGID: gidY, SGIDIndex: 1})
	if err != nil {
		t.Fatalf("CreateAH to another host: %v", err)
	}
	const n = 1000
	if err := b.ud.PostRecv(verbs.RecvWR{WRID: 7, SGL: []abi.SGE{b.mr.SGE(4096, 100), b.mr.SGE(8192, n)}}); err != nil {
		t.Fatal(err)
	}
	fill(a.mr.Bytes()[:n], 13)
	if err := a.ud.PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled, Imm: 0xc0ffee,
		SGL: []abi.SGE{a.mr.SGE(0, n)}, AH: ahB, RemoteQPN: b.ud.Num(), RemoteQKey: testQKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != 1 || wc.Opcode != abi.WCOpSend {
		t.Fatalf("ping sender: got %+v", wc)
	}
	wc := pollOne(t, b.cq)
	if wc.Status != abi.WCSuccess || wc.WRID != 7 || wc.ByteLen != abi.GRHSize+n ||
		wc.Flags != abi.WCFlagGRH|abi.WCFlagWithImm || wc.Imm != 0xc0ffee || wc.SrcQP != a.ud.Num() || wc.QPNum != b.ud.Num() {
		t.Fatalf("ping receiver: got %+v, want wr 7, %d bytes, GRH|WITH_IMM, src_qp %d", wc, abi.GRHSize+n, a.ud.Num())
	}
	rb := b.mr.Bytes()
	checkGRH(t, rb[4096:4096+40], gidX, gidY, n+4) // the ImmDt's 4 bytes were in the packet
	got := append(append([]byte(nil), rb[4096+40:4096+100]...), rb[8192:8192+n-60]...)
	if !bytes.Equal(got, a.mr.Bytes()[:n]) {
		t.Fatal("ping: the payload after the GRH differs from the sent bytes")
	}

	g, err := verbs.ParseGRH(rb[4096 : 4096+40])
	if err != nil {
		t.Fatal(err)
	}
	ahA, err := b.pd.CreateAH(verbs.AHAttr{DGID: g.SGID, SGIDIndex: 1})
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
	checkGRH(t, a.mr.Bytes()[16384:16384+40], gidY, gidX, 4)
	if got := string(a.mr.Bytes()[16384+40 : 16384+44]); got != "pong" {
		t.Errorf("pong payload: got %q", got)
	}

	if err := b.ud.PostRecv(verbs.RecvWR{WRID: 9, SGL: []abi.SGE{b.mr.SGE(0, 40+64)}}); err != nil {
		t.Fatal(err)
	}
	for i, wr := range []verbs.SendWR{
		{RemoteQPN: b.ud.Num(), RemoteQKey: testQKey + 1},
		{RemoteQPN: b.ud.Num() ^ 0x800000, RemoteQKey: testQKey},
		{RemoteQPN: b.qp.Num(), RemoteQKey: testQKey},
	} {
		wr.WRID, wr.Opcode, wr.Flags, wr.Inline, wr.AH = uint64(20+i), abi.WROpSend, abi.WRFlagSignaled, []byte("drop"), ahB
		if err := a.ud.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != uint64(20+i) {
			t.Fatalf("drop %d: sender got %+v, want success (UD is unreliable)", i, wc)
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
	if _, err := a.pd.CreateAH(verbs.AHAttr{DGID: netip.MustParseAddr("fd00::1").As16(), SGIDIndex: 1}); !errors.Is(err, abi.StatusInvalid) {
		t.Errorf("AH from an IPv4 network GID to an IPv6 host: got %v, want INVALID", err)
	}
	for _, ah := range []*verbs.AH{ahA, ahB} {
		if err := ah.Destroy(); err != nil {
			t.Errorf("destroy AH: %v", err)
		}
	}
	a.teardown(t)
	b.teardown(t)
}
