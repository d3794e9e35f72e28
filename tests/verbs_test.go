package tests

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// peer is one verbs user: a device opened through the virtio-user
// transport with a PD, a CQ, an RC QP and a registered buffer.
type peer struct {
	ctx *verbs.Context
	f   *frontend.Frontend
	gid [16]byte
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	buf *verbs.Buffer
	mr  *verbs.MR
}

const peerBuf = 64 << 10

// openPeer opens a verbs context on the device at sock (memSize bytes of
// guest memory; zero: the default) with a PD, a CQ, an RC QP and a
// registered buffer of peerBuf bytes.
func openPeer(t *testing.T, sock string, memSize uint64) *peer {
	t.Helper()
	return openPeerCfg(t, sock, frontend.Config{MemorySize: memSize})
}

// teardown destroys p's objects in dependency order; every step must
// succeed.
func (p *peer) teardown(t *testing.T) {
	t.Helper()
	if err := p.qp.Destroy(); err != nil {
		t.Errorf("destroy qp: %v", err)
	}
	if err := p.cq.Destroy(); err != nil {
		t.Errorf("destroy cq: %v", err)
	}
	if err := p.mr.Dereg(); err != nil {
		t.Errorf("dereg mr: %v", err)
	}
	p.buf.Free()
	if err := p.pd.Dealloc(); err != nil {
		t.Errorf("dealloc pd: %v", err)
	}
}

// pair starts a daemon with two devices and connects an RC QP pair.
func pair(t *testing.T) (a, b *peer) {
	t.Helper()
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b = openPeer(t, socks[0], 0), openPeer(t, socks[1], 0)
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// pollOne waits for one completion on cq.
func pollOne(t *testing.T, cq *verbs.CQ) verbs.WC {
	t.Helper()
	var wc [1]verbs.WC
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
		if time.Now().After(deadline) {
			t.Fatal("no completion within 5 s")
		}
		time.Sleep(10 * time.Microsecond)
	}
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func TestVerbsQuery(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b := openPeer(t, socks[0], 0), openPeer(t, socks[1], 0)
	if a.gid == b.gid {
		t.Errorf("two devices share GID %x", a.gid)
	}
	if a.gid != a.ctx.Config().PortGID {
		t.Errorf("QUERY_GID %x differs from config space %x", a.gid, a.ctx.Config().PortGID)
	}
	da, err := a.ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if da.VendorID != 0x1af4 || da.VendorPartID != 0x106a || da.PhysPortCnt != 1 || da.MaxQP == 0 {
		t.Errorf("QUERY_DEVICE: %+v", da)
	}
	pa, err := a.ctx.QueryPort()
	if err != nil {
		t.Fatal(err)
	}
	if pa.State != abi.PortActive || pa.LinkLayer != abi.LinkLayerEthernet || pa.GIDTblLen != abi.GIDTableLen {
		t.Errorf("QUERY_PORT: %+v", pa)
	}
	qa, err := a.qp.Query()
	if err != nil {
		t.Fatal(err)
	}
	if qa.QPN != a.qp.Num() || qa.QPState != abi.QPSReset {
		t.Errorf("QUERY_QP of a new QP: %+v", qa)
	}
	a.teardown(t)
	b.teardown(t)
}

func TestVerbsConnectState(t *testing.T) {
	a, b := pair(t)
	for _, p := range []*peer{a, b} {
		qa, err := p.qp.Query()
		if err != nil {
			t.Fatal(err)
		}
		if qa.QPState != abi.QPSRTS {
			t.Errorf("qp %d: state %d, want RTS", p.qp.Num(), qa.QPState)
		}
	}
	qa, _ := a.qp.Query()
	if qa.DestQPNum != b.qp.Num() || qa.DGID != b.gid || qa.PathMTU != abi.MTU4096 {
		t.Errorf("a's QP: dest %d gid %x mtu %d, want %d %x %d", qa.DestQPNum, qa.DGID, qa.PathMTU, b.qp.Num(), b.gid, abi.MTU4096)
	}
	a.teardown(t)
	b.teardown(t)
}

func TestVerbsRDMAWrite(t *testing.T) {
	a, b := pair(t)
	src := a.mr.Bytes()
	fill(src[:3000], 1)
	fill(src[5000:5000+5000], 2)
	dst := b.mr.Bytes()
	for i := range dst {
		dst[i] = 0xee
	}
	// Two SGEs gathered into one contiguous remote range that crosses pages.
	err := a.qp.PostSend(verbs.SendWR{WRID: 11, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 3000), a.mr.SGE(5000, 5000)}, RemoteAddr: b.mr.Addr + 4000, RKey: b.mr.RKey})
	if err != nil {
		t.Fatal(err)
	}
	wc := pollOne(t, a.cq)
	if wc.Status != abi.WCSuccess || wc.WRID != 11 || wc.Opcode != abi.WCOpRDMAWrite || wc.QPNum != a.qp.Num() {
		t.Fatalf("got %+v", wc)
	}
	want := append(append([]byte(nil), src[:3000]...), src[5000:10000]...)
	if got := dst[4000 : 4000+8000]; !bytes.Equal(got, want) {
		t.Errorf("remote bytes differ from the gathered source")
	}
	for _, r := range [][2]int{{0, 4000}, {12000, peerBuf}} {
		for i := r[0]; i < r[1]; i++ {
			if dst[i] != 0xee {
				t.Fatalf("byte %d outside the write changed to %#x", i, dst[i])
			}
		}
	}
	// Inline write.
	if err := a.qp.PostSend(verbs.SendWR{WRID: 12, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		Inline: []byte("inline bytes"), RemoteAddr: b.mr.Addr + 100, RKey: b.mr.RKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != 12 {
		t.Fatalf("got %+v", wc)
	}
	if got := string(dst[100:112]); got != "inline bytes" {
		t.Errorf("inline write: got %q", got)
	}
	a.teardown(t)
	b.teardown(t)
}

func TestVerbsRDMARead(t *testing.T) {
	a, b := pair(t)
	fill(b.mr.Bytes(), 9)
	dst := a.mr.Bytes()
	// Scatter a remote range into two local SGEs.
	err := a.qp.PostSend(verbs.SendWR{WRID: 21, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{a.mr.SGE(8192, 4096), a.mr.SGE(20000, 10000)}, RemoteAddr: b.mr.Addr + 777, RKey: b.mr.RKey})
	if err != nil {
		t.Fatal(err)
	}
	wc := pollOne(t, a.cq)
	if wc.Status != abi.WCSuccess || wc.WRID != 21 || wc.Opcode != abi.WCOpRDMARead {
		t.Fatalf("got %+v", wc)
	}
	src := b.mr.Bytes()[777 : 777+14096]
	if !bytes.Equal(dst[8192:8192+4096], src[:4096]) || !bytes.Equal(dst[20000:30000], src[4096:]) {
		t.Error("read bytes differ from the remote source")
	}
	a.teardown(t)
	b.teardown(t)
}

func TestVerbsSendRecv(t *testing.T) {
	a, b := pair(t)
	// Receive into two SGEs; a bigger scatter list than the message.
	if err := b.qp.PostRecv(verbs.RecvWR{WRID: 31, SGL: []abi.SGE{b.mr.SGE(0, 100), b.mr.SGE(4096, 8000)}}); err != nil {
		t.Fatal(err)
	}
	fill(a.mr.Bytes()[:5000], 3)
	if err := a.qp.PostSend(verbs.SendWR{WRID: 32, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 5000)}, Imm: 0xcafe}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != 32 || wc.Opcode != abi.WCOpSend {
		t.Fatalf("sender: got %+v", wc)
	}
	wc := pollOne(t, b.cq)
	if wc.Status != abi.WCSuccess || wc.WRID != 31 || wc.Opcode != abi.WCOpRecv || wc.ByteLen != 5000 ||
		wc.Flags&abi.WCFlagWithImm == 0 || wc.Imm != 0xcafe || wc.SrcQP != a.qp.Num() || wc.QPNum != b.qp.Num() {
		t.Fatalf("receiver: got %+v", wc)
	}
	got := append(append([]byte(nil), b.mr.Bytes()[:100]...), b.mr.Bytes()[4096:4096+4900]...)
	if !bytes.Equal(got, a.mr.Bytes()[:5000]) {
		t.Error("received bytes differ from the sent ones")
	}
	// An inline send, then RDMA WRITE WITH IMM consuming a receive.
	if err := b.qp.PostRecv(verbs.RecvWR{WRID: 33, SGL: []abi.SGE{b.mr.SGE(30000, 64)}}, verbs.RecvWR{WRID: 34}); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(verbs.SendWR{WRID: 35, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, Inline: []byte("ping")},
		verbs.SendWR{WRID: 36, Opcode: abi.WROpRDMAWriteWithImm, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{a.mr.SGE(0, 256)},
			RemoteAddr: b.mr.Addr + 40000, RKey: b.mr.RKey, Imm: 0x5a5a}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []uint64{35, 36} {
		if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != id {
			t.Fatalf("sender: got %+v, want wr %d", wc, id)
		}
	}
	if wc := pollOne(t, b.cq); wc.Status != abi.WCSuccess || wc.WRID != 33 || wc.ByteLen != 4 {
		t.Fatalf("inline receive: got %+v", wc)
	}
	if got := string(b.mr.Bytes()[30000:30004]); got != "ping" {
		t.Errorf("inline send: got %q", got)
	}
	wc = pollOne(t, b.cq)
	if wc.Status != abi.WCSuccess || wc.WRID != 34 || wc.Opcode != abi.WCOpRecvRDMAWithImm || wc.Imm != 0x5a5a || wc.Flags&abi.WCFlagWithImm == 0 {
		t.Fatalf("write with imm: got %+v", wc)
	}
	if !bytes.Equal(b.mr.Bytes()[40000:40256], a.mr.Bytes()[:256]) {
		t.Error("write-with-imm bytes differ")
	}
	a.teardown(t)
	b.teardown(t)
}

func TestVerbsAtomics(t *testing.T) {
	a, b := pair(t)
	remote := b.mr.Bytes()[64:72]
	binary.LittleEndian.PutUint64(remote, 1000)
	local := a.mr.Bytes()
	post := func(wr verbs.SendWR) verbs.WC {
		t.Helper()
		if err := a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		return pollOne(t, a.cq)
	}
	wc := post(verbs.SendWR{WRID: 41, Opcode: abi.WROpAtomicFetchAdd, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr + 64, RKey: b.mr.RKey, CompareAdd: 5})
	if wc.Status != abi.WCSuccess || wc.Opcode != abi.WCOpFetchAdd {
		t.Fatalf("fetch-add: %+v", wc)
	}
	if got := binary.LittleEndian.Uint64(local); got != 1000 {
		t.Errorf("fetch-add returned %d, want 1000", got)
	}
	if got := binary.LittleEndian.Uint64(remote); got != 1005 {
		t.Errorf("after fetch-add: %d, want 1005", got)
	}
	// A compare that fails leaves the value; one that matches swaps.
	for _, c := range []struct {
		cmp, want uint64
	}{{1, 1005}, {1005, 77}} {
		wc := post(verbs.SendWR{WRID: 42, Opcode: abi.WROpAtomicCmpSwp, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{a.mr.SGE(8, 8)}, RemoteAddr: b.mr.Addr + 64, RKey: b.mr.RKey, CompareAdd: c.cmp, Swap: 77})
		if wc.Status != abi.WCSuccess || wc.Opcode != abi.WCOpCompSwap {
			t.Fatalf("cmp-swap: %+v", wc)
		}
		if got := binary.LittleEndian.Uint64(local[8:]); got != 1005 {
			t.Errorf("cmp %d: returned %d, want 1005", c.cmp, got)
		}
		if got := binary.LittleEndian.Uint64(remote); got != c.want {
			t.Errorf("cmp %d: remote %d, want %d", c.cmp, got, c.want)
		}
	}
	a.teardown(t)
	b.teardown(t)
}

func TestVerbsRemoteAccessError(t *testing.T) {
	a, b := pair(t)
	// A READ-only MR on b: writing to it is a remote access error.
	ro, err := b.pd.RegMR(b.buf, 0, 4096, abi.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(verbs.SendWR{WRID: 51, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 16)}, RemoteAddr: ro.Addr, RKey: ro.RKey},
		verbs.SendWR{WRID: 52, Opcode: abi.WROpRDMAWrite, SGL: []abi.SGE{a.mr.SGE(0, 16)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.WRID != 51 || wc.Status != abi.WCRemAccessErr {
		t.Fatalf("got %+v, want REM_ACCESS_ERR", wc)
	}
	if wc := pollOne(t, a.cq); wc.WRID != 52 || wc.Status != abi.WCWRFlushErr {
		t.Fatalf("got %+v, want WR_FLUSH_ERR", wc)
	}
	if qa, err := a.qp.Query(); err != nil || qa.QPState != abi.QPSErr {
		t.Errorf("requester QP: %+v, %v, want ERR", qa, err)
	}
	// The MR is still in use by nobody: it deregisters; the PD is busy
	// while the other MR and QP live.
	if err := ro.Dereg(); err != nil {
		t.Fatal(err)
	}
	err = b.pd.Dealloc()
	var st abi.Status
	if !errors.As(err, &st) || st != abi.StatusBusy {
		t.Errorf("dealloc of a used PD: got %v, want BUSY", err)
	}
	a.teardown(t)
	b.teardown(t)
}

func TestVerbsQueueFullAndEvents(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b := openPeer(t, socks[0], 0), openPeer(t, socks[1], 0)
	// In RESET nothing executes: the send queue fills up.
	wr := verbs.SendWR{Opcode: abi.WROpRDMAWrite, SGL: []abi.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey}
	wrs := make([]verbs.SendWR, a.qp.Cap().MaxSendWR)
	for i := range wrs {
		wrs[i] = wr
	}
	if err := a.qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.PostSend(wr); !errors.Is(err, verbs.ErrQueueFull) {
		t.Fatalf("post into a full SQ: got %v, want ErrQueueFull", err)
	}
	// Moving to RESET discards posted WQEs and frees the slots.
	if err := a.qp.Modify(abi.QPAttr{QPState: abi.QPSReset}, abi.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), 0); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	if err := a.cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	wr.Flags, wr.WRID = abi.WRFlagSignaled, 61
	if err := a.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	cq, err := a.ctx.GetCQEvent(5 * time.Second)
	if err != nil || cq != a.cq {
		t.Fatalf("GetCQEvent: got %v, %v, want a's CQ", cq, err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != 61 {
		t.Fatalf("got %+v", wc)
	}
	a.teardown(t)
	b.teardown(t)
}

func TestVerbsIndirectMR(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	a, b := openPeer(t, socks[0], 128<<20), openPeer(t, socks[1], 0)
	const n = 40 << 20 // 10240 pages: an 80 KiB page list goes indirect
	buf, err := a.ctx.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	// Contiguous memory takes large pages (a short inline list) unless
	// the library is told to describe it in 4 KiB pages.
	a.ctx.SetMaxMRPageShift(abi.PageShift)
	mr, err := a.pd.RegMR(buf, 0, n, abi.AccessLocalWrite)
	a.ctx.SetMaxMRPageShift(abi.MaxPageShift)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), 0); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	// Write from the first and the last page of the big MR: both ends of
	// the indirect page list must be right.
	fill(mr.Bytes()[:4096], 5)
	fill(mr.Bytes()[n-4096:], 6)
	if err := a.qp.PostSend(verbs.SendWR{WRID: 71, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{mr.SGE(0, 4096), mr.SGE(n-4096, 4096)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess {
		t.Fatalf("got %+v", wc)
	}
	if !bytes.Equal(b.mr.Bytes()[:4096], mr.Bytes()[:4096]) || !bytes.Equal(b.mr.Bytes()[4096:8192], mr.Bytes()[n-4096:]) {
		t.Error("bytes from the big MR differ")
	}
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	// The same bytes in large pages, from 4 KiB in: one or two entries,
	// the same data path.
	mr, err = a.pd.RegMR(buf, 4096, n-4096, abi.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	fill(mr.Bytes()[n-8192:], 7)
	if err := a.qp.PostSend(verbs.SendWR{WRID: 72, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{mr.SGE(n-8192, 4096)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess {
		t.Fatalf("got %+v", wc)
	}
	if !bytes.Equal(b.mr.Bytes()[:4096], mr.Bytes()[n-8192:]) {
		t.Error("bytes from the large-page MR differ")
	}
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	buf.Free()
	a.teardown(t)
	b.teardown(t)
}
