package verbs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
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
	if op, body := f.last(); op != abi.CmdQueryDevice || len(body) != 0 {
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
	buf, err := c.AllocBuffer(3 * abi.PageSize)
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
			b = binary.LittleEndian.AppendUint64(b, start+uint64(i)*abi.PageSize)
		}
		return b
	}
	cqRing := uint64(cq.mem.Addr)
	qpMem := uint64(qp.mem.Addr)
	tests := []struct {
		name string
		run  func() error
		op   abi.Opcode
		want []byte
	}{
		{"QueryDevice", func() error { _, err := c.QueryDevice(); return err }, abi.CmdQueryDevice, nil},
		{"QueryPort", func() error { _, err := c.QueryPort(); return err }, abi.CmdQueryPort, abi.Marshal(&abi.PortReq{PortNum: 1})},
		{"QueryGID", func() error { _, err := c.QueryGID(); return err }, abi.CmdQueryGID, abi.Marshal(&abi.GIDReq{PortNum: 1})},
		{"AllocPD", func() error { _, err := c.AllocPD(); return err }, abi.CmdCreatePD, nil},
		{"RegMR", func() error {
			_, err := pd.RegMR(buf, 100, 2*abi.PageSize, abi.AccessLocalWrite|abi.AccessRemoteWrite)
			return err
		}, abi.CmdRegMR,
			// 8 KiB of contiguous memory: 8 KiB pages, two of them (the MR starts 100 bytes in).
			append(abi.Marshal(&abi.RegMR{PDN: pd.Num(), Access: 3, IOVA: uint64(buf.Addr) + 100, Length: 2 * abi.PageSize, PageShift: 13, NPages: 2}),
				binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, (uint64(buf.Addr)+100)&^8191), (uint64(buf.Addr)+100)&^8191+8192)...)},
		{"RegMRPageAligned", func() error { _, err := pd.RegMR(buf, abi.PageSize, abi.PageSize, abi.AccessLocalWrite); return err }, abi.CmdRegMR,
			append(abi.Marshal(&abi.RegMR{PDN: pd.Num(), Access: 1, IOVA: uint64(buf.Addr) + abi.PageSize, Length: abi.PageSize, PageShift: 12, NPages: 1}),
				pages(uint64(buf.Addr)+abi.PageSize, 1)...)},
		{"DeregMR", func() error { return (&MR{LKey: 0x1234, pd: pd}).Dereg() }, abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: 0x1234})},
		{"CreateCQ", nil, cqOp,
			append(abi.Marshal(&abi.CreateCQ{CQE: 256, NPages: 2, Record: cqRing + 2*abi.PageSize}), pages(cqRing, 2)...)},
		{"ReqNotify", func() error { return cq.ReqNotify(true) }, abi.CmdReqNotifyCQ, abi.Marshal(&abi.NotifyCQ{CQN: cq.Num(), SolicitedOnly: 1})},
		{"ReqNotifyAll", func() error { return cq.ReqNotify(false) }, abi.CmdReqNotifyCQ, abi.Marshal(&abi.NotifyCQ{CQN: cq.Num()})},
		// SQ: 128 WQEs of 256 bytes (64+100 inline → 256) = 8 pages; RQ: 64
		// of 64 bytes (16+48) = 1 page; record after them.
		{"CreateQP", nil, qpOp,
			append(abi.Marshal(&abi.CreateQP{PDN: pd.Num(), SendCQN: cq.Num(), RecvCQN: cq.Num(), QPType: abi.QPTypeRC, MaxSendWR: 128, MaxRecvWR: 64,
				MaxSendSGE: 2, MaxRecvSGE: 3, MaxInlineData: 100, SQWQEShift: 8, RQWQEShift: 6, DoorbellQueue: 0,
				Record: qpMem + 9*abi.PageSize, SQNPages: 8, RQNPages: 1, SQSigAll: 1, Flags: abi.QPFlagRQNotify})[:abi.CreateQPV1Size], pages(qpMem, 9)...)},
		{"Modify", func() error { return qp.Modify(abi.QPAttr{QPState: abi.QPSErr}, abi.QPAttrState) }, abi.CmdModifyQP,
			abi.Marshal(&abi.QPAttr{QPN: qp.Num(), AttrMask: abi.QPAttrState, QPState: abi.QPSErr})},
		{"Query", func() error { _, err := qp.Query(); return err }, abi.CmdQueryQP, abi.Marshal(&abi.Handle{Handle: qp.Num()})},
		{"ConnectRC", func() error { return qp.ConnectRC(gid, 77, 0x123456, abi.AccessRemoteWrite) }, abi.CmdModifyQP,
			abi.Marshal(&abi.QPAttr{QPN: qp.Num(), AttrMask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic,
				QPState: abi.QPSRTS, SQPSN: qp.PSN(), Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16})},
		{"DestroyQP", func() error { return qp.Destroy() }, abi.CmdDestroyQP, abi.Marshal(&abi.Handle{Handle: qp.Num()})},
		{"DestroyCQ", func() error { return cq.Destroy() }, abi.CmdDestroyCQ, abi.Marshal(&abi.Handle{Handle: cq.Num()})},
		{"DeallocPD", func() error { return pd.Dealloc() }, abi.CmdDestroyPD, abi.Marshal(&abi.Handle{Handle: pd.Num()})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var op abi.Opcode
			var body []byte
			switch tt.op {
			case abi.CmdCreateCQ:
				op, body = cqOp, cqBody
			case abi.CmdCreateQP:
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
			hdr := f.cmds[len(f.cmds)-1][:abi.CmdHeaderSize]
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
	const remotePSN = 0xabcdef
	if err := qp.ConnectRC(gid, 99, remotePSN, abi.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	want := []abi.QPAttr{
		{QPN: qp.Num(), AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags, QPState: abi.QPSInit, PortNum: 1, QPAccessFlags: abi.AccessRemoteRead},
		{QPN: qp.Num(), AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer,
			QPState: abi.QPSRTR, PathMTU: abi.MTU4096, DestQPNum: 99, RQPSN: remotePSN, MaxDestRdAtomic: 16, MinRNRTimer: 12, DGID: gid, HopLimit: 1},
		{QPN: qp.Num(), AttrMask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic,
			QPState: abi.QPSRTS, SQPSN: qp.PSN(), Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 16},
	}
	if got := len(f.cmds) - n; got != len(want) {
		t.Fatalf("got %d commands, want %d", got, len(want))
	}
	for i, w := range want {
		if got := f.cmds[n+i][abi.CmdHeaderSize:]; !bytes.Equal(got, abi.Marshal(&w)) {
			t.Errorf("step %d: got %x, want %x", i, got, abi.Marshal(&w))
		}
	}
	f.status[abi.CmdModifyQP] = abi.StatusNotFound
	err = qp.ConnectRC(gid, 99, 0, 0)
	var st abi.Status
	if !errors.As(err, &st) || st != abi.StatusNotFound {
		t.Errorf("got %v, want a NOT_FOUND status", err)
	}
}

// TestQPPSNRandom checks that CreateQP draws each QP's initial send PSN at
// random over 24 bits (docs/wire.md, "Security"): never above 0xffffff, not
// all equal, and spread over the range (both halves of the top bit occur).
func TestQPPSNRandom(t *testing.T) {
	c, _ := openFake(t, 8<<20)
	pd, _ := c.AllocPD()
	cq, _ := c.CreateCQ(16)
	const n = 64
	seen := map[uint32]bool{}
	var or, and uint32 = 0, 0xffffff
	for i := 0; i < n; i++ {
		qp, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
		if err != nil {
			t.Fatal(err)
		}
		p := qp.PSN()
		if p > 0xffffff {
			t.Fatalf("got PSN %#x, want 24 bits", p)
		}
		seen[p] = true
		or |= p
		and &= p
	}
	// 64 draws of 24 bits: a collision has odds about 2^-12, a bit that is
	// the same in all 64 about 2^-63 per bit.
	if len(seen) < n-2 {
		t.Errorf("got %d distinct PSNs of %d QPs, want about %d", len(seen), n, n)
	}
	if or != 0xffffff || and != 0 {
		t.Errorf("got PSN bits or %#x and %#x, want every bit both set and clear somewhere", or, and)
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
	table := make([]uint64, n/abi.PageSize)
	for i := range table {
		table[i] = uint64(buf.Addr) + uint64(i^1)*abi.PageSize
	}
	buf.dma.Pages = table
	// Catch the page list while the command runs: the fake records the
	// request; the list lives in fake memory until RegMR frees it.
	mr, err := pd.RegMR(buf, 0, n, abi.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	_, body := f.last()
	if len(body) != 48 {
		t.Fatalf("got a request of %d bytes, want 48 (indirect list)", len(body))
	}
	var req abi.RegMR
	if err := abi.Unmarshal(body, &req); err != nil {
		t.Fatal(err)
	}
	if req.NPages != n/abi.PageSize || req.PageShift != abi.PageShift || req.PageList == 0 || req.IOVA != uint64(buf.Addr)+abi.PageSize || req.Length != n {
		t.Fatalf("got %+v", req)
	}
	list := f.at(req.PageList, int(req.NPages)*8)
	for i := range int(req.NPages) {
		if got, want := binary.LittleEndian.Uint64(list[8*i:]), table[i]; got != want {
			t.Fatalf("page %d: got %#x, want %#x", i, got, want)
		}
	}
	if _, ok := f.live[abi.GPA(req.PageList)]; ok {
		t.Error("indirect page list not freed after the command")
	}
	if mr.Addr != req.IOVA || mr.Length != n || len(mr.Bytes()) != n {
		t.Errorf("got MR %+v", mr)
	}
	// The same buffer, contiguous: one large page, the list inline.
	buf.dma.Pages = nil
	if _, err := pd.RegMR(buf, 0, n, abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	_, body = f.last()
	if err := abi.Unmarshal(body[:48], &req); err != nil {
		t.Fatal(err)
	}
	if req.PageShift != 26 || req.PageList != 0 || req.NPages != 1 || len(body) != 56 ||
		binary.LittleEndian.Uint64(body[48:]) != uint64(buf.Addr)&^(1<<26-1) {
		t.Errorf("contiguous 40 MiB: got %+v and %d bytes", req, len(body))
	}
	// Capped at 4 KiB pages: the long list again.
	c.SetMaxMRPageShift(abi.PageShift)
	if _, err := pd.RegMR(buf, 0, n, abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if _, body = f.last(); len(body) != 48 || abi.Unmarshal(body, &req) != nil || req.PageShift != abi.PageShift || req.NPages != n/abi.PageSize {
		t.Errorf("capped: got %+v", req)
	}
}

func TestStatusErrors(t *testing.T) {
	c, f := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	f.status[abi.CmdDestroyPD] = abi.StatusBusy
	err := pd.Dealloc()
	var st abi.Status
	if !errors.As(err, &st) || st != abi.StatusBusy {
		t.Fatalf("got %v, want BUSY", err)
	}
	if !errors.Is(err, abi.StatusBusy) {
		t.Errorf("errors.Is(%v, StatusBusy) = false", err)
	}
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Op != abi.CmdDestroyPD {
		t.Errorf("got %v, want a *CommandError for DESTROY_PD", err)
	}
	f.status[abi.CmdCreateCQ] = abi.StatusNoResources
	live := len(f.live)
	if _, err := c.CreateCQ(8); !errors.Is(err, abi.StatusNoResources) {
		t.Errorf("got %v, want NO_RESOURCES", err)
	}
	if len(f.live) != live {
		t.Errorf("failed CreateCQ leaked DMA memory: %d buffers, want %d", len(f.live), live)
	}
}

func TestArgumentChecks(t *testing.T) {
	c, _ := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	buf, _ := c.AllocBuffer(abi.PageSize)
	cq, _ := c.CreateCQ(8)
	tests := []struct {
		name string
		run  func() error
	}{
		{"CQ zero", func() error { _, err := c.CreateCQ(0); return err }},
		{"CQ too big", func() error { _, err := c.CreateCQ(1 << 20); return err }},
		{"MR beyond buffer", func() error { _, err := pd.RegMR(buf, 1, abi.PageSize, 0); return err }},
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
	sgl := []abi.SGE{{Addr: 0x1000, Length: 10, LKey: 7}, {Addr: 0x2000, Length: 20, LKey: 8}}
	wrs := []SendWR{
		{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, SGL: sgl, RemoteAddr: 0xdead000, RKey: 9},
		{WRID: 2, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSolicited, Inline: []byte("hello"), Imm: 0x01020304},
		{WRID: 3, Opcode: abi.WROpAtomicCmpSwp, SGL: sgl[:1], RemoteAddr: 0x8, RKey: 9, CompareAdd: 5, Swap: 6},
	}
	if err := qp.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	want := []abi.SendWQE{
		{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 2, RemoteAddr: 0xdead000, RKey: 9},
		{WRID: 2, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSolicited | abi.WRFlagInline, ImmData: 0x01020304, InlineLen: 5},
		{WRID: 3, Opcode: abi.WROpAtomicCmpSwp, NumSGE: 1, RemoteAddr: 8, RKey: 9, CompareAdd: 5, Swap: 6},
	}
	for i, w := range want {
		got := qp.sq[i*stride : i*stride+abi.SendWQEHdrSize]
		if !bytes.Equal(got, abi.Marshal(&w)) {
			t.Errorf("WQE %d header: got %x, want %x", i, got, abi.Marshal(&w))
		}
	}
	if got, want := qp.sq[abi.SendWQEHdrSize:abi.SendWQEHdrSize+32], append(abi.Marshal(&sgl[0]), abi.Marshal(&sgl[1])...); !bytes.Equal(got, want) {
		t.Errorf("SGL: got %x, want %x", got, want)
	}
	if got := qp.sq[stride+abi.SendWQEHdrSize : stride+abi.SendWQEHdrSize+5]; string(got) != "hello" {
		t.Errorf("inline: got %q", got)
	}
	if got := binary.LittleEndian.Uint32(qp.rec[abi.QPRecordSQPI:]); got != 3 {
		t.Errorf("sq_pi: got %d, want 3", got)
	}
	if len(f.notifies) != 1 || f.notifies[0] != qp.DoorbellQueue() {
		t.Errorf("notifies: got %v, want [%d]", f.notifies, qp.DoorbellQueue())
	}
	// The engine polls: no notification.
	f.polling = true
	binary.LittleEndian.PutUint32(qp.rec[abi.QPRecordSQCI:], 3)
	if err := qp.PostSend(SendWR{WRID: 4, Opcode: abi.WROpSend}); err != nil {
		t.Fatal(err)
	}
	if len(f.notifies) != 1 {
		t.Errorf("notified while the engine polls: %v", f.notifies)
	}
}

func TestPostSendChecks(t *testing.T) {
	c, _ := openFake(t, 1<<20)
	qp, _ := newQP(t, c, QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 8})
	sge := abi.SGE{Addr: 1, Length: 1, LKey: 1}
	tests := []struct {
		name string
		wr   SendWR
	}{
		{"opcode", SendWR{Opcode: 7}},
		{"negative opcode", SendWR{Opcode: -1}},
		{"flags", SendWR{Flags: 0x10}},
		{"too many SGEs", SendWR{SGL: []abi.SGE{sge, sge}}},
		{"inline too long", SendWR{Inline: make([]byte, 9)}},
		{"inline with SGL", SendWR{Inline: []byte{1}, SGL: []abi.SGE{sge}}},
		{"inline read", SendWR{Opcode: abi.WROpRDMARead, Inline: []byte{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := qp.PostSend(SendWR{Opcode: abi.WROpSend}, tt.wr); !errors.Is(err, ErrInvalid) {
				t.Errorf("got %v, want ErrInvalid", err)
			}
			if got := binary.LittleEndian.Uint32(qp.rec[abi.QPRecordSQPI:]); got != 0 {
				t.Errorf("sq_pi: got %d, want 0 (nothing posted)", got)
			}
		})
	}
	if err := qp.PostRecv(RecvWR{SGL: []abi.SGE{sge, sge}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("recv with 2 SGEs: got %v, want ErrInvalid", err)
	}
}

func TestQueueFull(t *testing.T) {
	c, _ := openFake(t, 1<<20)
	qp, _ := newQP(t, c, QPCap{MaxSendWR: 4, MaxRecvWR: 2})
	wr := SendWR{Opcode: abi.WROpSend}
	for i := range 4 {
		if err := qp.PostSend(wr); err != nil {
			t.Fatalf("post %d: %v", i, err)
		}
	}
	if err := qp.PostSend(wr); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("5th post: got %v, want ErrQueueFull", err)
	}
	binary.LittleEndian.PutUint32(qp.rec[abi.QPRecordSQCI:], 2) // the device consumed two
	if err := qp.PostSend(wr, wr, wr); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("3 posts into 2 free: got %v, want ErrQueueFull", err)
	}
	if err := qp.PostSend(wr, wr); err != nil {
		t.Fatalf("2 posts into 2 free: %v", err)
	}
	if got := binary.LittleEndian.Uint32(qp.rec[abi.QPRecordSQPI:]); got != 6 {
		t.Errorf("sq_pi: got %d, want 6", got)
	}
	// A consumer index beyond the producer is the device's fault.
	binary.LittleEndian.PutUint32(qp.rec[abi.QPRecordSQCI:], 100)
	if err := qp.PostSend(wr); !errors.Is(err, ErrProtocol) {
		t.Errorf("ci ahead of pi: got %v, want ErrProtocol", err)
	}

	rwr := RecvWR{WRID: 9, SGL: []abi.SGE{{Addr: 0x10, Length: 4, LKey: 3}}}
	if err := qp.PostRecv(rwr, rwr); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostRecv(rwr); !errors.Is(err, ErrQueueFull) {
		t.Errorf("3rd recv: got %v, want ErrQueueFull", err)
	}
	want := append(abi.Marshal(&abi.RecvWQE{WRID: 9, NumSGE: 1}), abi.Marshal(&rwr.SGL[0])...)
	stride := 1 << qp.rqShift
	for i := range 2 {
		if got := qp.rq[i*stride : i*stride+len(want)]; !bytes.Equal(got, want) {
			t.Errorf("recv WQE %d: got %x, want %x", i, got, want)
		}
	}
	if got := binary.LittleEndian.Uint32(qp.rec[abi.QPRecordRQPI:]); got != 2 {
		t.Errorf("rq_pi: got %d, want 2", got)
	}
}

// putCQE plays the device: it writes CQE i and advances pi.
func putCQE(cq *CQ, e abi.CQE) {
	pi := binary.LittleEndian.Uint32(cq.rec[abi.CQRecordPI:])
	off := int(pi&(cq.depth-1)) * abi.CQESize
	copy(cq.ring[off:], abi.Marshal(&e))
	abi.StoreUint32(cq.rec, abi.CQRecordPI, pi+1)
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
			putCQE(cq, abi.CQE{WRID: uint64(round*10 + i), Status: abi.WCRemAccessErr, Opcode: abi.WCOpRecvRDMAWithImm, WCFlags: abi.WCFlagWithImm,
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
			want := WC{WRID: uint64(round*10 + i), Status: abi.WCRemAccessErr, Opcode: abi.WCOpRecvRDMAWithImm, Flags: abi.WCFlagWithImm,
				QPNum: 5, ByteLen: 100, Imm: 0xabcd, SrcQP: 6, VendorErr: 3}
			if w != want {
				t.Errorf("round %d wc %d: got %+v, want %+v", round, i, w, want)
			}
		}
		if got, want := binary.LittleEndian.Uint32(cq.rec[abi.CQRecordCI:]), uint32(3*(round+1)); got != want {
			t.Errorf("ci: got %d, want %d", got, want)
		}
	}
	abi.StoreUint32(cq.rec, abi.CQRecordPI, 9+5) // 5 ahead of ci, depth 4
	if n, err := cq.Poll(wc); n != 0 || !errors.Is(err, ErrProtocol) {
		t.Errorf("pi too far ahead: got %d, %v, want 0, ErrProtocol", n, err)
	}
}

func TestEvents(t *testing.T) {
	c, f := openFake(t, 1<<20)
	cq1, _ := c.CreateCQ(4)
	cq2, _ := c.CreateCQ(4)
	f.events = []abi.Event{
		{Type: abi.EventQPFatal, Handle: 77},
		{Type: abi.EventCQCompletion, Handle: 0xffff}, // unknown CQ: dropped
		{Type: abi.EventCQCompletion, Handle: cq2.Num()},
		{Type: abi.EventCQCompletion, Handle: cq1.Num()},
		{Type: abi.EventPortActive, Handle: 1},
	}
	if got, err := c.GetCQEvent(0); err == nil || got != nil {
		t.Errorf("zero timeout: got %v, %v", got, err)
	}
	got, err := c.GetCQEvent(50e6)
	if err != nil || got != cq2 {
		t.Fatalf("got %v, %v, want cq2", got, err)
	}
	ev, err := c.GetAsyncEvent(50e6)
	if err != nil || ev != (abi.Event{Type: abi.EventQPFatal, Handle: 77}) {
		t.Fatalf("got %+v, %v, want QP_FATAL 77", ev, err)
	}
	ev, err = c.GetAsyncEvent(50e6)
	if err != nil || ev.Type != abi.EventPortActive {
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
	b := DMABuf{Addr: 0x10000, Buf: make([]byte, 5*abi.PageSize)}
	tests := []struct {
		off, n uint64
		want   []uint64
		ok     bool
	}{
		{0, 1, []uint64{0x10000}, true},
		{0, abi.PageSize, []uint64{0x10000}, true},
		{1, abi.PageSize, []uint64{0x10000, 0x11000}, true},
		{abi.PageSize - 1, 2, []uint64{0x10000, 0x11000}, true},
		{2 * abi.PageSize, 3 * abi.PageSize, []uint64{0x12000, 0x13000, 0x14000}, true},
		{0, 0, nil, false},
		{1, 5 * abi.PageSize, nil, false},
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
	pi := binary.LittleEndian.Uint32(qp.rec[abi.QPRecordSQPI:])
	abi.StoreUint32(qp.rec, abi.QPRecordSQCI, pi)
	// Write the CQE by hand: Marshal would allocate.
	cpi := binary.LittleEndian.Uint32(cq.rec[abi.CQRecordPI:])
	e := cq.ring[int(cpi&(cq.depth-1))*abi.CQESize:]
	binary.LittleEndian.PutUint64(e, wr[0].WRID)
	e[9] = abi.WCOpRDMAWrite
	binary.LittleEndian.PutUint32(e[16:], 64)
	abi.StoreUint32(cq.rec, abi.CQRecordPI, cpi+1)
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
	wr := []SendWR{{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{{Addr: 1, Length: 64, LKey: 2}}, RemoteAddr: 3, RKey: 4}}
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
	wr := []SendWR{{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{{Addr: 1, Length: 64, LKey: 2}}, RemoteAddr: 3, RKey: 4}}
	wc := make([]WC, 4)
	b.ReportAllocs()
	for b.Loop() {
		if err := steady(qp, cq, wr, wc); err != nil {
			b.Fatal(err)
		}
	}
}
