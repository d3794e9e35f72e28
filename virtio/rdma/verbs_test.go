package rdma

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vrdma/vrdma/memmap"
)

func openFake(t testing.TB, memSize int) (*Context, *fakeTransport) {
	t.Helper()
	f := newFake(memSize)
	c, err := Open(f)
	if err != nil {
		t.Fatal(err)
	}
	return c, f
}

func TestOpen(t *testing.T) {
	f := newFake(1 << 20)
	f.conf.ABIVersion = 2
	if _, err := Open(f); !errors.Is(err, ErrProtocol) {
		t.Errorf("ABI version 2: got %v, want ErrProtocol", err)
	}
	f = newFake(1 << 20)
	f.conf.NumDoorbellQueues = 0
	if _, err := Open(f); !errors.Is(err, ErrProtocol) {
		t.Errorf("no doorbell queues: got %v, want ErrProtocol", err)
	}
	c, f := openFake(t, 1<<20)
	if op, body := f.last(); op != CmdQueryDevice || len(body) != 0 {
		t.Errorf("Open sent %s with %d bytes, want QUERY_DEVICE with none", op, len(body))
	}
	if err := c.Close(); err != nil || !f.closed {
		t.Errorf("Close: %v, transport closed %v", err, f.closed)
	}
	if _, err := c.AllocPD(); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: got %v, want ErrClosed", err)
	}
}

// TestCommandEncoding checks that every verb sends exactly the request the
// ABI structures describe.
func TestCommandEncoding(t *testing.T) {
	c, f := openFake(t, 64<<20)
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := c.AllocBuffer(3 * PageSize)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.CreateCQ(200)
	if err != nil {
		t.Fatal(err)
	}
	cqOp, cqBody := f.last()
	qp, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 100, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 3, MaxInlineData: 100}, SigAll: true})
	if err != nil {
		t.Fatal(err)
	}
	qpOp, qpBody := f.last()
	var gid [16]byte
	gid[0], gid[15] = 0xfe, 0x42

	pages := func(start uint64, n int) []byte {
		var b []byte
		for i := range n {
			b = binary.LittleEndian.AppendUint64(b, start+uint64(i)*PageSize)
		}
		return b
	}
	cqRing := uint64(cq.mem.Addr)
	qpMem := uint64(qp.mem.Addr)
	tests := []struct {
		name string
		run  func() error
		op   Opcode
		want []byte
	}{
		{"QueryDevice", func() error { _, err := c.QueryDevice(); return err }, CmdQueryDevice, nil},
		{"QueryPort", func() error { _, err := c.QueryPort(); return err }, CmdQueryPort, Marshal(&PortReq{PortNum: 1})},
		{"QueryGID", func() error { _, err := c.QueryGID(); return err }, CmdQueryGID, Marshal(&GIDReq{PortNum: 1})},
		{"AllocPD", func() error { _, err := c.AllocPD(); return err }, CmdCreatePD, nil},
		{"RegMR", func() error { _, err := pd.RegMR(buf, 100, 2*PageSize, AccessLocalWrite|AccessRemoteWrite); return err }, CmdRegMR,
			// 8 KiB of contiguous memory: 8 KiB pages, two of them (the MR starts 100 bytes in).
			append(Marshal(&RegMR{PDN: pd.Num(), Access: 3, IOVA: uint64(buf.Addr) + 100, Length: 2 * PageSize, PageShift: 13, NPages: 2}),
				binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, (uint64(buf.Addr)+100)&^8191), (uint64(buf.Addr)+100)&^8191+8192)...)},
		{"RegMRPageAligned", func() error { _, err := pd.RegMR(buf, PageSize, PageSize, AccessLocalWrite); return err }, CmdRegMR,
			append(Marshal(&RegMR{PDN: pd.Num(), Access: 1, IOVA: uint64(buf.Addr) + PageSize, Length: PageSize, PageShift: 12, NPages: 1}),
				pages(uint64(buf.Addr)+PageSize, 1)...)},
		{"DeregMR", func() error { return (&MR{LKey: 0x1234, pd: pd}).Dereg() }, CmdDeregMR, Marshal(&Handle{Handle: 0x1234})},
		{"CreateCQ", nil, cqOp,
			append(Marshal(&CreateCQ{CQE: 256, NPages: 2, Record: cqRing + 2*PageSize}), pages(cqRing, 2)...)},
		{"ReqNotify", func() error { return cq.ReqNotify(true) }, CmdReqNotifyCQ, Marshal(&NotifyCQ{CQN: cq.Num(), SolicitedOnly: 1})},
		{"ReqNotifyAll", func() error { return cq.ReqNotify(false) }, CmdReqNotifyCQ, Marshal(&NotifyCQ{CQN: cq.Num()})},
		// SQ: 128 WQEs of 256 bytes (64+100 inline → 256) = 8 pages; RQ: 64
		// of 64 bytes (16+48) = 1 page; record after them.
		{"CreateQP", nil, qpOp,
			append(Marshal(&CreateQP{PDN: pd.Num(), SendCQN: cq.Num(), RecvCQN: cq.Num(), QPType: QPTypeRC, MaxSendWR: 128, MaxRecvWR: 64,
				MaxSendSGE: 2, MaxRecvSGE: 3, MaxInlineData: 100, SQWQEShift: 8, RQWQEShift: 6, DoorbellQueue: 0,
				Record: qpMem + 9*PageSize, SQNPages: 8, RQNPages: 1, SQSigAll: 1, Flags: QPFlagRQNotify}), pages(qpMem, 9)...)},
		{"Modify", func() error { return qp.Modify(QPAttr{QPState: QPSErr}, QPAttrState) }, CmdModifyQP,
			Marshal(&QPAttr{QPN: qp.Num(), AttrMask: QPAttrState, QPState: QPSErr})},
		{"Query", func() error { _, err := qp.Query(); return err }, CmdQueryQP, Marshal(&Handle{Handle: qp.Num()})},
		{"ConnectRC", func() error { return qp.ConnectRC(gid, 77, AccessRemoteWrite) }, CmdModifyQP,
			Marshal(&QPAttr{QPN: qp.Num(), AttrMask: QPAttrState | QPAttrSQPSN | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrMaxQPRdAtomic,
				QPState: QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16})},
		{"DestroyQP", func() error { return qp.Destroy() }, CmdDestroyQP, Marshal(&Handle{Handle: qp.Num()})},
		{"DestroyCQ", func() error { return cq.Destroy() }, CmdDestroyCQ, Marshal(&Handle{Handle: cq.Num()})},
		{"DeallocPD", func() error { return pd.Dealloc() }, CmdDestroyPD, Marshal(&Handle{Handle: pd.Num()})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var op Opcode
			var body []byte
			switch tt.op {
			case CmdCreateCQ:
				op, body = cqOp, cqBody
			case CmdCreateQP:
				op, body = qpOp, qpBody
			default:
				if err := tt.run(); err != nil {
					t.Fatal(err)
				}
				op, body = f.last()
			}
			if op != tt.op {
				t.Fatalf("got opcode %s, want %s", op, tt.op)
			}
			if !bytes.Equal(body, tt.want) {
				t.Errorf("got request\n%x\nwant\n%x", body, tt.want)
			}
			f.mu.Lock()
			hdr := f.cmds[len(f.cmds)-1][:CmdHeaderSize]
			f.mu.Unlock()
			if binary.LittleEndian.Uint16(hdr[2:]) != 0 || binary.LittleEndian.Uint32(hdr[4:]) != 0 {
				t.Errorf("header flags/reserved not zero: %x", hdr)
			}
		})
	}
}

func TestConnectRCSequence(t *testing.T) {
	c, f := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	cq, _ := c.CreateCQ(16)
	qp, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	n := len(f.cmds)
	var gid [16]byte
	gid[0] = 0xfe
	if err := qp.ConnectRC(gid, 99, AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	want := []QPAttr{
		{QPN: qp.Num(), AttrMask: QPAttrState | QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags, QPState: QPSInit, PortNum: 1, QPAccessFlags: AccessRemoteRead},
		{QPN: qp.Num(), AttrMask: QPAttrState | QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN | QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer,
			QPState: QPSRTR, PathMTU: MTU4096, DestQPNum: 99, MaxDestRdAtomic: 16, MinRNRTimer: 12, DGID: gid, HopLimit: 1},
		{QPN: qp.Num(), AttrMask: QPAttrState | QPAttrSQPSN | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrMaxQPRdAtomic,
			QPState: QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
	}
	if got := len(f.cmds) - n; got != len(want) {
		t.Fatalf("got %d commands, want %d", got, len(want))
	}
	for i, w := range want {
		if got := f.cmds[n+i][CmdHeaderSize:]; !bytes.Equal(got, Marshal(&w)) {
			t.Errorf("step %d: got %x, want %x", i, got, Marshal(&w))
		}
	}
	f.status[CmdModifyQP] = StatusNotFound
	err = qp.ConnectRC(gid, 99, 0)
	var st Status
	if !errors.As(err, &st) || st != StatusNotFound {
		t.Errorf("got %v, want a NOT_FOUND status", err)
	}
}

func TestRegMRIndirect(t *testing.T) {
	c, f := openFake(t, 48<<20)
	pd, _ := c.AllocPD()
	const n = 40 << 20 // 10240 pages: 80 KiB of page list, above the inline bound
	buf, err := c.AllocBuffer(n)
	if err != nil {
		t.Fatal(err)
	}
	// A guest-physical layout with no two adjacent pages contiguous (each
	// pair swapped) forces 4 KiB pages, hence a long list.
	table := make([]uint64, n/PageSize)
	for i := range table {
		table[i] = uint64(buf.Addr) + uint64(i^1)*PageSize
	}
	buf.dma.Pages = table
	// Catch the page list while the command runs: the fake records the
	// request; the list lives in fake memory until RegMR frees it.
	mr, err := pd.RegMR(buf, 0, n, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	_, body := f.last()
	if len(body) != 48 {
		t.Fatalf("got a request of %d bytes, want 48 (indirect list)", len(body))
	}
	var req RegMR
	if err := Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	if req.NPages != n/PageSize || req.PageShift != PageShift || req.PageList == 0 || req.IOVA != uint64(buf.Addr)+PageSize || req.Length != n {
		t.Fatalf("got %+v", req)
	}
	list := f.at(req.PageList, int(req.NPages)*8)
	for i := range int(req.NPages) {
		if got, want := binary.LittleEndian.Uint64(list[8*i:]), table[i]; got != want {
			t.Fatalf("page %d: got %#x, want %#x", i, got, want)
		}
	}
	if _, ok := f.live[memmap.GPA(req.PageList)]; ok {
		t.Error("indirect page list not freed after the command")
	}
	if mr.Addr != req.IOVA || mr.Length != n || len(mr.Bytes()) != n {
		t.Errorf("got MR %+v", mr)
	}
	// The same buffer, contiguous: one large page, the list inline.
	buf.dma.Pages = nil
	if _, err := pd.RegMR(buf, 0, n, AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	_, body = f.last()
	if err := Unmarshal(body[:48], &req); err != nil {
		t.Fatal(err)
	}
	if req.PageShift != 26 || req.PageList != 0 || req.NPages != 1 || len(body) != 56 ||
		binary.LittleEndian.Uint64(body[48:]) != uint64(buf.Addr)&^(1<<26-1) {
		t.Errorf("contiguous 40 MiB: got %+v and %d bytes", req, len(body))
	}
	// Capped at 4 KiB pages: the long list again.
	c.SetMaxMRPageShift(PageShift)
	if _, err := pd.RegMR(buf, 0, n, AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if _, body = f.last(); len(body) != 48 || Unmarshal(body, &req) != nil || req.PageShift != PageShift || req.NPages != n/PageSize {
		t.Errorf("capped: got %+v", req)
	}
}

func TestStatusErrors(t *testing.T) {
	c, f := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	f.status[CmdDestroyPD] = StatusBusy
	err := pd.Dealloc()
	var st Status
	if !errors.As(err, &st) || st != StatusBusy {
		t.Fatalf("got %v, want BUSY", err)
	}
	if !errors.Is(err, StatusBusy) {
		t.Errorf("errors.Is(%v, StatusBusy) = false", err)
	}
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Op != CmdDestroyPD {
		t.Errorf("got %v, want a *CommandError for DESTROY_PD", err)
	}
	f.status[CmdCreateCQ] = StatusNoResources
	live := len(f.live)
	if _, err := c.CreateCQ(8); !errors.Is(err, StatusNoResources) {
		t.Errorf("got %v, want NO_RESOURCES", err)
	}
	if len(f.live) != live {
		t.Errorf("failed CreateCQ leaked DMA memory: %d buffers, want %d", len(f.live), live)
	}
}

func TestArgumentChecks(t *testing.T) {
	c, _ := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	buf, _ := c.AllocBuffer(PageSize)
	cq, _ := c.CreateCQ(8)
	tests := []struct {
		name string
		run  func() error
	}{
		{"CQ zero", func() error { _, err := c.CreateCQ(0); return err }},
		{"CQ too big", func() error { _, err := c.CreateCQ(1 << 20); return err }},
		{"MR beyond buffer", func() error { _, err := pd.RegMR(buf, 1, PageSize, 0); return err }},
		{"MR zero", func() error { _, err := pd.RegMR(buf, 0, 0, 0); return err }},
		{"MR bad access", func() error { _, err := pd.RegMR(buf, 0, 10, 0x100); return err }},
		{"QP no CQ", func() error { _, err := pd.CreateQP(QPInitAttr{Cap: QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); return err }},
		{"QP zero depth", func() error { _, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq}); return err }},
		{"QP too many SGEs", func() error {
			_, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 9}})
			return err
		}},
		{"QP inline too big", func() error {
			_, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxInlineData: 257}})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.run(); !errors.Is(err, ErrInvalid) {
				t.Errorf("got %v, want ErrInvalid", err)
			}
		})
	}
}

func newQP(t testing.TB, c *Context, cp QPCap) (*QP, *CQ) {
	t.Helper()
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: cp})
	if err != nil {
		t.Fatal(err)
	}
	return qp, cq
}

func TestPostSendWQE(t *testing.T) {
	c, f := openFake(t, 1<<20)
	qp, _ := newQP(t, c, QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 2, MaxInlineData: 64})
	stride := 1 << qp.sqShift // max(64+32, 64+64) = 128
	if stride != 128 {
		t.Fatalf("got stride %d, want 128", stride)
	}
	sgl := []SGE{{Addr: 0x1000, Length: 10, LKey: 7}, {Addr: 0x2000, Length: 20, LKey: 8}}
	wrs := []SendWR{
		{WRID: 1, Opcode: WROpRDMAWrite, Flags: WRFlagSignaled, SGL: sgl, RemoteAddr: 0xdead000, RKey: 9},
		{WRID: 2, Opcode: WROpSendWithImm, Flags: WRFlagSolicited, Inline: []byte("hello"), Imm: 0x01020304},
		{WRID: 3, Opcode: WROpAtomicCmpSwp, SGL: sgl[:1], RemoteAddr: 0x8, RKey: 9, CompareAdd: 5, Swap: 6},
	}
	if err := qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	want := []SendWQE{
		{WRID: 1, Opcode: WROpRDMAWrite, Flags: WRFlagSignaled, NumSGE: 2, RemoteAddr: 0xdead000, RKey: 9},
		{WRID: 2, Opcode: WROpSendWithImm, Flags: WRFlagSolicited | WRFlagInline, ImmData: 0x01020304, InlineLen: 5},
		{WRID: 3, Opcode: WROpAtomicCmpSwp, NumSGE: 1, RemoteAddr: 8, RKey: 9, CompareAdd: 5, Swap: 6},
	}
	for i, w := range want {
		got := qp.sq[i*stride : i*stride+SendWQEHdrSize]
		if !bytes.Equal(got, Marshal(&w)) {
			t.Errorf("WQE %d header: got %x, want %x", i, got, Marshal(&w))
		}
	}
	if got, want := qp.sq[SendWQEHdrSize:SendWQEHdrSize+32], append(Marshal(&sgl[0]), Marshal(&sgl[1])...); !bytes.Equal(got, want) {
		t.Errorf("SGL: got %x, want %x", got, want)
	}
	if got := qp.sq[stride+SendWQEHdrSize : stride+SendWQEHdrSize+5]; string(got) != "hello" {
		t.Errorf("inline: got %q", got)
	}
	if got := binary.LittleEndian.Uint32(qp.rec[QPRecordSQPI:]); got != 3 {
		t.Errorf("sq_pi: got %d, want 3", got)
	}
	if len(f.notifies) != 1 || f.notifies[0] != qp.DoorbellQueue() {
		t.Errorf("notifies: got %v, want [%d]", f.notifies, qp.DoorbellQueue())
	}
	// The engine polls: no notification.
	f.polling = true
	binary.LittleEndian.PutUint32(qp.rec[QPRecordSQCI:], 3)
	if err := qp.PostSend(SendWR{WRID: 4, Opcode: WROpSend}); err != nil {
		t.Fatal(err)
	}
	if len(f.notifies) != 1 {
		t.Errorf("notified while the engine polls: %v", f.notifies)
	}
}

func TestPostSendChecks(t *testing.T) {
	c, _ := openFake(t, 1<<20)
	qp, _ := newQP(t, c, QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 8})
	sge := SGE{Addr: 1, Length: 1, LKey: 1}
	tests := []struct {
		name string
		wr   SendWR
	}{
		{"opcode", SendWR{Opcode: 7}},
		{"negative opcode", SendWR{Opcode: -1}},
		{"flags", SendWR{Flags: 0x10}},
		{"too many SGEs", SendWR{SGL: []SGE{sge, sge}}},
		{"inline too long", SendWR{Inline: make([]byte, 9)}},
		{"inline with SGL", SendWR{Inline: []byte{1}, SGL: []SGE{sge}}},
		{"inline read", SendWR{Opcode: WROpRDMARead, Inline: []byte{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := qp.PostSend(SendWR{Opcode: WROpSend}, tt.wr); !errors.Is(err, ErrInvalid) {
				t.Errorf("got %v, want ErrInvalid", err)
			}
			if got := binary.LittleEndian.Uint32(qp.rec[QPRecordSQPI:]); got != 0 {
				t.Errorf("sq_pi: got %d, want 0 (nothing posted)", got)
			}
		})
	}
	if err := qp.PostRecv(RecvWR{SGL: []SGE{sge, sge}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("recv with 2 SGEs: got %v, want ErrInvalid", err)
	}
}

func TestQueueFull(t *testing.T) {
	c, _ := openFake(t, 1<<20)
	qp, _ := newQP(t, c, QPCap{MaxSendWR: 4, MaxRecvWR: 2})
	wr := SendWR{Opcode: WROpSend}
	for i := range 4 {
		if err := qp.PostSend(wr); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	if err := qp.PostSend(wr); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("5th post: got %v, want ErrQueueFull", err)
	}
	binary.LittleEndian.PutUint32(qp.rec[QPRecordSQCI:], 2) // the device consumed two
	if err := qp.PostSend(wr, wr, wr); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("3 posts into 2 free: got %v, want ErrQueueFull", err)
	}
	if err := qp.PostSend(wr, wr); err != nil {
		t.Fatalf("2 posts into 2 free: %v", err)
	}
	if got := binary.LittleEndian.Uint32(qp.rec[QPRecordSQPI:]); got != 6 {
		t.Errorf("sq_pi: got %d, want 6", got)
	}
	// A consumer index beyond the producer is the device's fault.
	binary.LittleEndian.PutUint32(qp.rec[QPRecordSQCI:], 100)
	if err := qp.PostSend(wr); !errors.Is(err, ErrProtocol) {
		t.Errorf("ci ahead of pi: got %v, want ErrProtocol", err)
	}

	rwr := RecvWR{WRID: 9, SGL: []SGE{{Addr: 0x10, Length: 4, LKey: 3}}}
	if err := qp.PostRecv(rwr, rwr); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostRecv(rwr); !errors.Is(err, ErrQueueFull) {
		t.Errorf("3rd recv: got %v, want ErrQueueFull", err)
	}
	want := append(Marshal(&RecvWQE{WRID: 9, NumSGE: 1}), Marshal(&rwr.SGL[0])...)
	stride := 1 << qp.rqShift
	for i := range 2 {
		if got := qp.rq[i*stride : i*stride+len(want)]; !bytes.Equal(got, want) {
			t.Errorf("recv WQE %d: got %x, want %x", i, got, want)
		}
	}
	if got := binary.LittleEndian.Uint32(qp.rec[QPRecordRQPI:]); got != 2 {
		t.Errorf("rq_pi: got %d, want 2", got)
	}
}

// putCQE plays the device: it writes CQE i and advances pi.
func putCQE(cq *CQ, e CQE) {
	pi := binary.LittleEndian.Uint32(cq.rec[CQRecordPI:])
	off := int(pi&(cq.depth-1)) * CQESize
	copy(cq.ring[off:], Marshal(&e))
	memmap.StoreUint32(cq.rec, CQRecordPI, pi+1)
}

func TestPoll(t *testing.T) {
	c, _ := openFake(t, 1<<20)
	cq, err := c.CreateCQ(3)
	if err != nil {
		t.Fatal(err)
	}
	if cq.CQE() != 4 {
		t.Fatalf("got %d entries, want 4", cq.CQE())
	}
	wc := make([]WC, 3)
	if n, err := cq.Poll(wc); n != 0 || err != nil {
		t.Fatalf("empty CQ: got %d, %v", n, err)
	}
	for round := range 3 { // wraps the ring
		for i := range 3 {
			putCQE(cq, CQE{WRID: uint64(round*10 + i), Status: WCRemAccessErr, Opcode: WCOpRecvRDMAWithImm, WCFlags: WCFlagWithImm,
				QPNum: 5, ByteLen: 100, ImmData: 0xabcd, SrcQP: 6, VendorErr: 3})
		}
		n, err := cq.Poll(wc[:2])
		if n != 2 || err != nil {
			t.Fatalf("round %d: got %d, %v, want 2", round, n, err)
		}
		n, err = cq.Poll(wc[2:])
		if n != 1 || err != nil {
			t.Fatalf("round %d: got %d, %v, want 1", round, n, err)
		}
		for i, w := range wc {
			want := WC{WRID: uint64(round*10 + i), Status: WCRemAccessErr, Opcode: WCOpRecvRDMAWithImm, Flags: WCFlagWithImm,
				QPNum: 5, ByteLen: 100, Imm: 0xabcd, SrcQP: 6, VendorErr: 3}
			if w != want {
				t.Errorf("round %d wc %d: got %+v, want %+v", round, i, w, want)
			}
		}
		if got, want := binary.LittleEndian.Uint32(cq.rec[CQRecordCI:]), uint32(3*(round+1)); got != want {
			t.Errorf("ci: got %d, want %d", got, want)
		}
	}
	memmap.StoreUint32(cq.rec, CQRecordPI, 9+5) // 5 ahead of ci, depth 4
	if n, err := cq.Poll(wc); n != 0 || !errors.Is(err, ErrProtocol) {
		t.Errorf("pi too far ahead: got %d, %v, want 0, ErrProtocol", n, err)
	}
}

func TestEvents(t *testing.T) {
	c, f := openFake(t, 1<<20)
	cq1, _ := c.CreateCQ(4)
	cq2, _ := c.CreateCQ(4)
	f.events = []Event{
		{Type: EventQPFatal, Handle: 77},
		{Type: EventCQCompletion, Handle: 0xffff}, // unknown CQ: dropped
		{Type: EventCQCompletion, Handle: cq2.Num()},
		{Type: EventCQCompletion, Handle: cq1.Num()},
		{Type: EventPortActive, Handle: 1},
	}
	if got, err := c.GetCQEvent(0); err == nil || got != nil {
		t.Errorf("zero timeout: got %v, %v", got, err)
	}
	got, err := c.GetCQEvent(50e6)
	if err != nil || got != cq2 {
		t.Fatalf("got %v, %v, want cq2", got, err)
	}
	ev, err := c.GetAsyncEvent(50e6)
	if err != nil || ev != (Event{Type: EventQPFatal, Handle: 77}) {
		t.Fatalf("got %+v, %v, want QP_FATAL 77", ev, err)
	}
	ev, err = c.GetAsyncEvent(50e6)
	if err != nil || ev.Type != EventPortActive {
		t.Fatalf("got %+v, %v, want PORT_ACTIVE", ev, err)
	}
	if got, err := c.GetCQEvent(50e6); err != nil || got != cq1 {
		t.Fatalf("got %v, %v, want cq1", got, err)
	}
	if _, err := c.GetCQEvent(50e6); !errors.Is(err, ErrTimeout) {
		t.Errorf("no events: got %v, want ErrTimeout", err)
	}
}

func TestPageAddrs(t *testing.T) {
	b := DMABuf{Addr: 0x10000, Buf: make([]byte, 5*PageSize)}
	tests := []struct {
		off, n uint64
		want   []uint64
		ok     bool
	}{
		{0, 1, []uint64{0x10000}, true},
		{0, PageSize, []uint64{0x10000}, true},
		{1, PageSize, []uint64{0x10000, 0x11000}, true},
		{PageSize - 1, 2, []uint64{0x10000, 0x11000}, true},
		{2 * PageSize, 3 * PageSize, []uint64{0x12000, 0x13000, 0x14000}, true},
		{0, 0, nil, false},
		{1, 5 * PageSize, nil, false},
		{^uint64(0), 2, nil, false},
	}
	for _, tt := range tests {
		got, err := b.PageAddrs(tt.off, tt.n)
		if (err == nil) != tt.ok {
			t.Errorf("PageAddrs(%d, %d): got error %v, want ok %v", tt.off, tt.n, err, tt.ok)
			continue
		}
		if err != nil && got != nil {
			t.Errorf("PageAddrs(%d, %d): error with result %v", tt.off, tt.n, got)
		}
		if !equalU64(got, tt.want) {
			t.Errorf("PageAddrs(%d, %d): got %x, want %x", tt.off, tt.n, got, tt.want)
		}
	}
}

func equalU64(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// steady runs one post+complete+poll round as the data path does in steady
// state, with the fake playing the device.
func steady(qp *QP, cq *CQ, wr []SendWR, wc []WC) error {
	if err := qp.PostSend(wr...); err != nil {
		return err
	}
	pi := binary.LittleEndian.Uint32(qp.rec[QPRecordSQPI:])
	memmap.StoreUint32(qp.rec, QPRecordSQCI, pi)
	// Write the CQE by hand: Marshal would allocate.
	cpi := binary.LittleEndian.Uint32(cq.rec[CQRecordPI:])
	e := cq.ring[int(cpi&(cq.depth-1))*CQESize:]
	binary.LittleEndian.PutUint64(e, wr[0].WRID)
	e[9] = WCOpRDMAWrite
	binary.LittleEndian.PutUint32(e[16:], 64)
	memmap.StoreUint32(cq.rec, CQRecordPI, cpi+1)
	n, err := cq.Poll(wc)
	if err == nil && n != 1 {
		err = errors.New("no completion")
	}
	return err
}

func TestSteadyStateAllocs(t *testing.T) {
	c, f := openFake(t, 1<<20)
	f.polling = true
	qp, cq := newQP(t, c, QPCap{MaxSendWR: 16, MaxRecvWR: 16})
	wr := []SendWR{{WRID: 1, Opcode: WROpRDMAWrite, Flags: WRFlagSignaled, SGL: []SGE{{Addr: 1, Length: 64, LKey: 2}}, RemoteAddr: 3, RKey: 4}}
	wc := make([]WC, 4)
	var err error
	allocs := testing.AllocsPerRun(1000, func() {
		if e := steady(qp, cq, wr, wc); e != nil {
			err = e
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if allocs != 0 {
		t.Errorf("got %v allocs per post+poll, want 0", allocs)
	}
}

func BenchmarkPostPoll(b *testing.B) {
	c, f := openFake(b, 1<<20)
	f.polling = true
	qp, cq := newQP(b, c, QPCap{MaxSendWR: 16, MaxRecvWR: 16})
	wr := []SendWR{{WRID: 1, Opcode: WROpRDMAWrite, Flags: WRFlagSignaled, SGL: []SGE{{Addr: 1, Length: 64, LKey: 2}}, RemoteAddr: 3, RKey: 4}}
	wc := make([]WC, 4)
	b.ReportAllocs()
	for b.Loop() {
		if err := steady(qp, cq, wr, wc); err != nil {
			b.Fatal(err)
		}
	}
}
