//go:build cgo && linux

package ibv

import (
	"bytes"
	"encoding/binary"
	"os"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// testIOVA is where the loopback test registers its buffer: deliberately
// not the buffer's host address, as vrdmad registers guest memory at the
// guest's addresses.
const testIOVA = 0x7000_0000_0000

// Offsets in the loopback test's buffer.
const (
	offSrc     = 0
	offDst     = 4096
	offRecv    = 8192
	offRead    = 12288
	offAtomic  = 16384
	offFetched = 16392
	bufSize    = 64 << 10
)

// TestDeviceLoopback runs RC traffic between two QPs of one device:
// WRITE, WRITE_WITH_IMM, SEND/RECV, READ, FETCH_ADD and CMP_SWP, with
// the data checked, a completion event through a channel, and everything
// destroyed. It needs a device: VRDMA_IBV_DEVICE (e.g. rxe0), and
// optionally VRDMA_IBV_GID (default: the first RoCE v2 IPv4 GID).
func TestDeviceLoopback(t *testing.T) {
	devName := os.Getenv("VRDMA_IBV_DEVICE")
	if devName == "" {
		t.Skip("VRDMA_IBV_DEVICE is not set (an RDMA device such as rxe0)")
	}
	const port = 1
	ctx, err := Open(devName)
	if err != nil {
		t.Fatalf("Open(%q): %v", devName, err)
	}
	defer closeOK(t, "context", ctx.Close)

	da, err := ctx.QueryDevice()
	if err != nil {
		t.Fatalf("QueryDevice: %v", err)
	}
	t.Logf("device %s: %+v", ctx.Name(), da)
	pa, err := ctx.QueryPort(port)
	if err != nil {
		t.Fatalf("QueryPort: %v", err)
	}
	t.Logf("port %d: %+v", port, pa)
	if pa.State != PortActive {
		t.Fatalf("port %d state %d, want active", port, pa.State)
	}
	gidIndex := -1
	if s := os.Getenv("VRDMA_IBV_GID"); s != "" {
		if gidIndex, err = strconv.Atoi(s); err != nil {
			t.Fatalf("VRDMA_IBV_GID=%q: %v", s, err)
		}
	}
	var gid GID
	for i := 0; i < pa.GIDTblLen; i++ {
		g, err := ctx.QueryGID(port, i)
		if err != nil || g == (GID{}) {
			continue
		}
		typ, err := ctx.GIDType(port, i)
		t.Logf("gid %d: %s type %d (%v)", i, g, typ, err)
		if st, serr := ctx.gidTypeSysfs(port, i); serr != nil || err == nil && st != typ {
			t.Errorf("gid %d: sysfs type %d (%v), GIDType %d", i, st, serr, typ)
		}
		if gidIndex < 0 && err == nil && typ == GIDTypeRoCEv2 && g.IsIPv4Mapped() {
			gidIndex = i
		}
		if i == gidIndex {
			gid = g
		}
	}
	if gidIndex < 0 || gid == (GID{}) {
		t.Fatalf("no usable GID (index %d); set VRDMA_IBV_GID", gidIndex)
	}
	t.Logf("using GID %d: %s", gidIndex, gid)
	if ev, ok, err := ctx.TryGetAsyncEvent(); ok || err != nil {
		t.Logf("async event at start: %+v %v %v", ev, ok, err)
	}

	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatalf("AllocPD: %v", err)
	}
	defer closeOK(t, "PD", pd.Close)

	buf, err := unix.Mmap(-1, 0, bufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	host := uintptr(unsafe.Pointer(&buf[0]))
	if host == testIOVA {
		t.Fatal("the buffer landed at the test IOVA")
	}
	access := AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
	mr, err := pd.RegMR(host, bufSize, testIOVA, access)
	if err != nil {
		t.Fatalf("RegMR: %v", err)
	}
	defer closeOK(t, "MR", mr.Close)
	t.Logf("MR: host %#x iova %#x lkey %#x rkey %#x", host, mr.IOVA(), mr.LKey(), mr.RKey())

	ch, err := ctx.NewCompChannel()
	if err != nil {
		t.Fatalf("NewCompChannel: %v", err)
	}
	defer closeOK(t, "comp channel", ch.Close)
	cqA, err := ctx.CreateCQ(64, ch, 0xa)
	if err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	defer closeOK(t, "CQ A", cqA.Destroy)
	cqB, err := ctx.CreateCQ(64, ch, 0xb)
	if err != nil {
		t.Fatalf("CreateCQ: %v", err)
	}
	defer closeOK(t, "CQ B", cqB.Destroy)

	caps := QPCaps{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}
	qa, err := pd.CreateQP(QPInit{Type: QPTRC, SendCQ: cqA, RecvCQ: cqA, Caps: caps})
	if err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	defer closeOK(t, "QP A", qa.Destroy)
	qb, err := pd.CreateQP(QPInit{Type: QPTRC, SendCQ: cqB, RecvCQ: cqB, Caps: caps})
	if err != nil {
		t.Fatalf("CreateQP: %v", err)
	}
	defer closeOK(t, "QP B", qb.Destroy)
	t.Logf("QPs %#x %#x, caps %+v", qa.Num(), qb.Num(), qa.Caps())

	rd := uint8(min(da.MaxQPRdAtom, 16))
	for _, p := range []struct{ qp, peer *QP }{{qa, qb}, {qb, qa}} {
		if err := p.qp.Modify(&QPAttr{QPState: QPSInit, PKeyIndex: 0, PortNum: port, QPAccessFlags: access},
			AttrState|AttrPKeyIndex|AttrPort|AttrAccessFlags); err != nil {
			t.Fatalf("QP %#x to INIT: %v", p.qp.Num(), err)
		}
		rtr := &QPAttr{QPState: QPSRTR, PathMTU: pa.ActiveMTU, DestQPNum: p.peer.Num(), RQPSN: 0x100,
			MaxDestRdAtomic: rd, MinRNRTimer: 12,
			AH: AHAttr{DGID: gid, SGIDIndex: uint8(gidIndex), HopLimit: 64, IsGlobal: true, PortNum: port}}
		if err := p.qp.Modify(rtr, AttrState|AttrAV|AttrPathMTU|AttrDestQPN|AttrRQPSN|AttrMaxDestRdAtomic|AttrMinRNRTimer); err != nil {
			t.Fatalf("QP %#x to RTR: %v", p.qp.Num(), err)
		}
	}
	for _, qp := range []*QP{qa, qb} {
		if err := qp.Modify(&QPAttr{QPState: QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, SQPSN: 0x100, MaxRdAtomic: rd},
			AttrState|AttrTimeout|AttrRetryCnt|AttrRNRRetry|AttrSQPSN|AttrMaxQPRdAtomic); err != nil {
			t.Fatalf("QP %#x to RTS: %v", qp.Num(), err)
		}
		qa, err := qp.Query(AttrState | AttrDestQPN | AttrAV | AttrPathMTU)
		if err != nil || qa.QPState != QPSRTS {
			t.Fatalf("QP %#x: Query = %+v, %v; want RTS", qp.Num(), qa, err)
		}
		if qa.AH.DGID != gid {
			t.Errorf("QP %#x: queried DGID %s, want %s", qp.Num(), qa.AH.DGID, gid)
		}
	}

	lkey, rkey := mr.LKey(), mr.RKey()
	sge := func(off, n int) SGE { return SGE{Addr: testIOVA + uint64(off), Length: uint32(n), LKey: lkey} }
	wc := make([]WC, 16)
	expect := func(cq *CQ, wantOp WCOpcode, wantID uint64) WC {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			n, err := cq.Poll(wc[:1])
			if err != nil {
				t.Fatalf("Poll: %v", err)
			}
			if n == 1 {
				w := wc[0]
				if w.Status != WCSuccess || w.Opcode != wantOp || w.WRID != wantID {
					t.Fatalf("WC %+v (%v): want opcode %d, wr_id %d, success", w, w.Status, wantOp, wantID)
				}
				return w
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("no completion (opcode %d, wr_id %d) in 10 s", wantOp, wantID)
		return WC{}
	}
	post := func(qp *QP, wrs []SendWR, sges []SGE) {
		t.Helper()
		if n, err := qp.PostSend(wrs, sges); n != len(wrs) || err != nil {
			t.Fatalf("PostSend = %d, %v", n, err)
		}
	}

	// Receives on B for the WRITE_WITH_IMM and the SEND.
	if n, err := qb.PostRecv([]RecvWR{{WRID: 1, NumSGE: 1}, {WRID: 2, FirstSGE: 1, NumSGE: 1}},
		[]SGE{sge(offRecv, 0), sge(offRecv+1024, 1024)}); n != 2 || err != nil {
		t.Fatalf("PostRecv = %d, %v", n, err)
	}

	// WRITE, as a chain of four (one PostSend), only the last signaled.
	for i := 0; i < 1024; i++ {
		buf[offSrc+i] = byte(i*7 + 3)
	}
	var wrs []SendWR
	var sges []SGE
	for i := 0; i < 4; i++ {
		sges = append(sges, sge(offSrc+256*i, 256))
		wrs = append(wrs, SendWR{WRID: 10 + uint64(i), Opcode: WRRDMAWrite, FirstSGE: uint32(i), NumSGE: 1,
			RemoteAddr: testIOVA + offDst + 256*uint64(i), RKey: rkey})
	}
	wrs[3].SendFlags = SendSignaled
	post(qa, wrs, sges)
	expect(cqA, WCOpRDMAWrite, 13)
	if !bytes.Equal(buf[offDst:offDst+1024], buf[offSrc:offSrc+1024]) {
		t.Fatal("WRITE: destination differs from source")
	}

	// WRITE_WITH_IMM, with B's CQ armed: the completion raises an event.
	if err := cqB.ReqNotify(false); err != nil {
		t.Fatalf("ReqNotify: %v", err)
	}
	type evr struct {
		cq  *CQ
		err error
	}
	evc := make(chan evr, 1)
	go func() {
		cq, err := ch.GetCQEvent()
		evc <- evr{cq, err}
	}()
	copy(buf[offSrc:], "immediate!")
	post(qa, []SendWR{{WRID: 20, Opcode: WRRDMAWriteWithImm, SendFlags: SendSignaled, Imm: Htonl(0x12345678),
		NumSGE: 1, RemoteAddr: testIOVA + offDst, RKey: rkey}}, []SGE{sge(offSrc, 10)})
	expect(cqA, WCOpRDMAWrite, 20)
	select {
	case e := <-evc:
		if e.err != nil || e.cq != cqB || e.cq.UserContext() != 0xb {
			t.Fatalf("GetCQEvent = %p, %v; want CQ B (%p)", e.cq, e.err, cqB)
		}
		cqB.AckEvents(1)
	case <-time.After(10 * time.Second):
		t.Fatal("no CQ event in 10 s")
	}
	w := expect(cqB, WCOpRecvRDMAWithImm, 1)
	if w.WCFlags&WCWithImm == 0 || Ntohl(w.ImmData) != 0x12345678 || w.ByteLen != 10 || w.QPNum != qb.Num() {
		t.Errorf("WRITE_WITH_IMM WC %+v: want imm 0x12345678, 10 bytes, QP %#x", w, qb.Num())
	}
	if string(buf[offDst:offDst+10]) != "immediate!" {
		t.Errorf("WRITE_WITH_IMM wrote %q", buf[offDst:offDst+10])
	}

	// SEND/RECV (two SGEs, solicited, the second inline-able).
	copy(buf[offSrc:], "hello, ")
	copy(buf[offSrc+100:], "verbs")
	post(qa, []SendWR{{WRID: 30, Opcode: WRSend, SendFlags: SendSignaled | SendSolicited, NumSGE: 2}},
		[]SGE{sge(offSrc, 7), sge(offSrc+100, 5)})
	expect(cqA, WCOpSend, 30)
	w = expect(cqB, WCOpRecv, 2)
	if w.ByteLen != 12 || string(buf[offRecv+1024:offRecv+1024+12]) != "hello, verbs" {
		t.Errorf("SEND: WC %+v, received %q", w, buf[offRecv+1024:offRecv+1024+12])
	}

	// READ back what the WRITEs placed.
	post(qa, []SendWR{{WRID: 40, Opcode: WRRDMARead, SendFlags: SendSignaled, NumSGE: 1,
		RemoteAddr: testIOVA + offDst + 256, RKey: rkey}}, []SGE{sge(offRead, 512)})
	expect(cqA, WCOpRDMARead, 40)
	if !bytes.Equal(buf[offRead:offRead+512], buf[offDst+256:offDst+768]) {
		t.Error("READ: data differs")
	}

	// Atomics.
	binary.NativeEndian.PutUint64(buf[offAtomic:], 10)
	post(qa, []SendWR{{WRID: 50, Opcode: WRAtomicFetchAndAdd, SendFlags: SendSignaled, NumSGE: 1,
		RemoteAddr: testIOVA + offAtomic, RKey: rkey, CompareAdd: 5}}, []SGE{sge(offFetched, 8)})
	expect(cqA, WCOpFetchAdd, 50)
	if got, mem := binary.NativeEndian.Uint64(buf[offFetched:]), binary.NativeEndian.Uint64(buf[offAtomic:]); got != 10 || mem != 15 {
		t.Errorf("FETCH_ADD: fetched %d, memory %d; want 10, 15", got, mem)
	}
	post(qa, []SendWR{{WRID: 51, Opcode: WRAtomicCmpAndSwp, SendFlags: SendSignaled, NumSGE: 1,
		RemoteAddr: testIOVA + offAtomic, RKey: rkey, CompareAdd: 15, Swap: 99}}, []SGE{sge(offFetched, 8)})
	expect(cqA, WCOpCompSwap, 51)
	if got, mem := binary.NativeEndian.Uint64(buf[offFetched:]), binary.NativeEndian.Uint64(buf[offAtomic:]); got != 15 || mem != 99 {
		t.Errorf("CMP_SWP: fetched %d, memory %d; want 15, 99", got, mem)
	}

	// A WRITE with a wrong rkey fails remotely and moves the QP to ERR.
	post(qa, []SendWR{{WRID: 60, Opcode: WRRDMAWrite, SendFlags: SendSignaled, NumSGE: 1,
		RemoteAddr: testIOVA + offDst, RKey: rkey ^ 0xff00}}, []SGE{sge(offSrc, 8)})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := cqA.Poll(wc[:1]); n == 1 {
			if wc[0].WRID != 60 || wc[0].Status == WCSuccess {
				t.Errorf("bad-rkey WRITE: WC %+v (%v), want an error", wc[0], wc[0].Status)
			} else {
				t.Logf("bad-rkey WRITE: %v (vendor err %#x)", wc[0].Status, wc[0].VendorErr)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion for the bad-rkey WRITE")
		}
		time.Sleep(time.Millisecond)
	}
	// Drain async events (QP errors are reported there).
	time.Sleep(100 * time.Millisecond)
	for {
		ev, ok, err := ctx.TryGetAsyncEvent()
		if err != nil {
			t.Fatalf("TryGetAsyncEvent: %v", err)
		}
		if !ok {
			break
		}
		t.Logf("async event: %v %+v", ev.Type, ev)
	}
}

func closeOK(t *testing.T, what string, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Errorf("closing %s: %v", what, err)
	}
}
