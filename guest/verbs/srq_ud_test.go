package verbs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// pages returns n consecutive 4 KiB page addresses from start, as an
// inline page list.
func pageBytes(start uint64, n int) []byte {
	var b []byte
	for i := range n {
		b = binary.LittleEndian.AppendUint64(b, start+uint64(i)*abi.PageSize)
	}
	return b
}

// TestSRQUDCommandEncoding checks that the SRQ, AH and UD verbs send
// exactly the requests docs/spec.md describes.
func TestSRQUDCommandEncoding(t *testing.T) {
	c, f := openFake(t, 16<<20)
	pd, _ := c.AllocPD()
	pd2, _ := c.AllocPD()
	cq, _ := c.CreateCQ(16)
	// 100 WRs round up to 128; 3 SGEs: 16 + 48 = 64-byte stride; 2 pages.
	srq, err := pd2.CreateSRQ(SRQInitAttr{MaxWR: 100, MaxSGE: 3, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	srqOp, srqBody := f.last()
	srqMem := uint64(srq.mem.Addr)
	// An RC QP on the SRQ (of another PD, as verbs allow): no receive queue.
	qp, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: QPCap{MaxSendWR: 8, MaxRecvWR: 99, MaxRecvSGE: 7}})
	if err != nil {
		t.Fatal(err)
	}
	qpOp, qpBody := f.last()
	qpMem := uint64(qp.mem.Addr)
	ud, err := pd.CreateQP(QPInitAttr{Type: abi.QPTypeUD, SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	udOp, udBody := f.last()
	udMem := uint64(ud.mem.Addr)
	var gid [16]byte
	gid[10], gid[11], gid[12], gid[15] = 0xff, 0xff, 10, 7
	ah, err := pd.CreateAH(AHAttr{DGID: gid, SGIDIndex: 1})
	if err != nil {
		t.Fatal(err)
	}
	ahOp, ahBody := f.last()

	tests := []struct {
		name     string
		run      func() error // nil: the request recorded above
		op, want abi.Opcode
		got      []byte
		body     []byte
	}{
		{name: "CreateSRQ", op: srqOp, want: abi.CmdCreateSRQ, got: srqBody,
			body: append(abi.Marshal(&abi.CreateSRQ{PDN: pd2.Num(), MaxWR: 128, MaxSGE: 3, SRQLimit: 10, WQEShift: 6,
				DoorbellQueue: uint32(srq.DoorbellQueue()), Record: srqMem + 2*abi.PageSize, NPages: 2}), pageBytes(srqMem, 2)...)},
		{name: "CreateQPWithSRQ", op: qpOp, want: abi.CmdCreateQP, got: qpBody,
			body: append(abi.Marshal(&abi.CreateQP{PDN: pd.Num(), SendCQN: cq.Num(), RecvCQN: cq.Num(), QPType: abi.QPTypeRC,
				MaxSendWR: 8, MaxSendSGE: 1, SQWQEShift: 7, DoorbellQueue: uint32(qp.DoorbellQueue()),
				Record: qpMem + abi.PageSize, SQNPages: 1, Flags: abi.QPFlagRQNotify | abi.QPFlagSRQ, SRQN: srq.Num()}), pageBytes(qpMem, 1)...)},
		{name: "CreateQPUD", op: udOp, want: abi.CmdCreateQP, got: udBody,
			body: append(abi.Marshal(&abi.CreateQP{PDN: pd.Num(), SendCQN: cq.Num(), RecvCQN: cq.Num(), QPType: abi.QPTypeUD,
				MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, SQWQEShift: 7, RQWQEShift: 5,
				DoorbellQueue: uint32(ud.DoorbellQueue()), Record: udMem + 2*abi.PageSize, SQNPages: 1, RQNPages: 1,
				Flags: abi.QPFlagRQNotify})[:abi.CreateQPV1Size], pageBytes(udMem, 2)...)},
		{name: "CreateAH", op: ahOp, want: abi.CmdCreateAH, got: ahBody,
			body: abi.Marshal(&abi.CreateAH{PDN: pd.Num(), PortNum: 1, DGID: gid, SGIDIndex: 1})},
		{name: "ArmLimit", run: func() error { return srq.ArmLimit(5) }, want: abi.CmdModifySRQ,
			body: abi.Marshal(&abi.SRQAttr{SRQN: srq.Num(), AttrMask: abi.SRQAttrLimit, SRQLimit: 5})},
		{name: "Disarm", run: func() error { return srq.Modify(abi.SRQAttr{SRQN: 77, MaxWR: 3}, abi.SRQAttrLimit) }, want: abi.CmdModifySRQ,
			body: abi.Marshal(&abi.SRQAttr{SRQN: srq.Num(), AttrMask: abi.SRQAttrLimit, MaxWR: 3})},
		{name: "QuerySRQ", run: func() error {
			f.srqAttr = &abi.SRQAttr{SRQN: srq.Num(), MaxWR: 128, SRQLimit: 5}
			a, err := srq.Query()
			if err == nil && a != *f.srqAttr {
				t.Errorf("got %+v, want %+v", a, *f.srqAttr)
			}
			return err
		}, want: abi.CmdQuerySRQ, body: abi.Marshal(&abi.Handle{Handle: srq.Num()})},
		{name: "DestroyAH", run: ah.Destroy, want: abi.CmdDestroyAH, body: abi.Marshal(&abi.Handle{Handle: ah.Num()})},
		{name: "DestroyQP", run: qp.Destroy, want: abi.CmdDestroyQP, body: abi.Marshal(&abi.Handle{Handle: qp.Num()})},
		{name: "DestroySRQ", run: srq.Destroy, want: abi.CmdDestroySRQ, body: abi.Marshal(&abi.Handle{Handle: srq.Num()})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			op, body := tt.op, tt.got
			if tt.run != nil {
				if err := tt.run(); err != nil {
					t.Fatal(err)
				}
				op, body = f.last()
			}
			if op != tt.want {
				t.Fatalf("got opcode %s, want %s", op, tt.want)
			}
			if !bytes.Equal(body, tt.body) {
				t.Errorf("got request\n%x\nwant\n%x", body, tt.body)
			}
		})
	}
	if got := qp.Cap(); got.MaxRecvWR != 0 || got.MaxRecvSGE != 0 || got.MaxSendWR != 8 {
		t.Errorf("QP on an SRQ: got cap %+v, want no receive queue", got)
	}
	if qp.SRQ() != srq || qp.Type() != abi.QPTypeRC || ud.Type() != abi.QPTypeUD || srq.MaxWR() != 128 || srq.MaxSGE() != 3 {
		t.Errorf("accessors: srq %v type %d/%d depth %d sge %d", qp.SRQ(), qp.Type(), ud.Type(), srq.MaxWR(), srq.MaxSGE())
	}
	if _, ok := f.live[srq.mem.Addr]; ok {
		t.Error("DestroySRQ left its ring allocated")
	}
}

func TestReadyUDSequence(t *testing.T) {
	c, f := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	cq, _ := c.CreateCQ(16)
	qp, err := pd.CreateQP(QPInitAttr{Type: abi.QPTypeUD, SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	n := len(f.cmds)
	const qkey = 0x11111111
	if err := qp.ReadyUD(qkey); err != nil {
		t.Fatal(err)
	}
	// docs/spec.md's UD transition table: RESET → INIT needs STATE,
	// PKEY_INDEX, PORT, QKEY; INIT → RTR STATE; RTR → RTS STATE, SQ_PSN.
	want := []abi.QPAttr{
		{QPN: qp.Num(), AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey, QPState: abi.QPSInit, PortNum: 1, QKey: qkey},
		{QPN: qp.Num(), AttrMask: abi.QPAttrState, QPState: abi.QPSRTR},
		{QPN: qp.Num(), AttrMask: abi.QPAttrState | abi.QPAttrSQPSN, QPState: abi.QPSRTS, SQPSN: qp.PSN()},
	}
	if got := len(f.cmds) - n; got != len(want) {
		t.Fatalf("got %d commands, want %d", got, len(want))
	}
	for i, w := range want {
		if got := f.cmds[n+i][abi.CmdHeaderSize:]; !bytes.Equal(got, abi.Marshal(&w)) {
			t.Errorf("step %d: got %x, want %x", i, got, abi.Marshal(&w))
		}
	}
	rc, _ := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
	if err := rc.ReadyUD(1); !errors.Is(err, ErrInvalid) {
		t.Errorf("ReadyUD on RC: got %v, want ErrInvalid", err)
	}
	n = len(f.cmds)
	if err := qp.ConnectRC([16]byte{}, 5, 0, 0); !errors.Is(err, ErrInvalid) || len(f.cmds) != n {
		t.Errorf("ConnectRC on UD: got %v and %d commands, want ErrInvalid and none", err, len(f.cmds)-n)
	}
	f.status[abi.CmdModifyQP] = abi.StatusInvalid
	if err := qp.ReadyUD(1); !errors.Is(err, abi.StatusInvalid) {
		t.Errorf("refused MODIFY_QP: got %v, want INVALID", err)
	}
}

func TestSRQPostRecv(t *testing.T) {
	c, f := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	srq, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 4, MaxSGE: 2})
	if err != nil {
		t.Fatal(err)
	}
	if stride := 1 << srq.shift; stride != 64 { // 16 + 2×16 → 64
		t.Fatalf("got stride %d, want 64", stride)
	}
	sgl := []abi.SGE{{Addr: 0x1000, Length: 10, LKey: 7}, {Addr: 0x2000, Length: 20, LKey: 8}}
	// notify 0: the device awaits nothing, so no doorbell step.
	if err := srq.PostRecv(RecvWR{WRID: 1, SGL: sgl}, RecvWR{WRID: 2, SGL: sgl[1:]}, RecvWR{WRID: 3}); err != nil {
		t.Fatal(err)
	}
	wants := [][]byte{
		append(abi.Marshal(&abi.RecvWQE{WRID: 1, NumSGE: 2}), append(abi.Marshal(&sgl[0]), abi.Marshal(&sgl[1])...)...),
		append(abi.Marshal(&abi.RecvWQE{WRID: 2, NumSGE: 1}), abi.Marshal(&sgl[1])...),
		abi.Marshal(&abi.RecvWQE{WRID: 3}),
	}
	for i, w := range wants {
		if got := srq.ring[i*64 : i*64+len(w)]; !bytes.Equal(got, w) {
			t.Errorf("WQE %d: got %x, want %x", i, got, w)
		}
	}
	if got := binary.LittleEndian.Uint32(srq.rec[abi.SRQRecordPI:]); got != 3 {
		t.Errorf("pi: got %d, want 3", got)
	}
	if len(f.notifies) != 0 {
		t.Errorf("notified with notify 0: %v", f.notifies)
	}
	// One slot left.
	if err := srq.PostRecv(RecvWR{WRID: 4}, RecvWR{WRID: 5}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("2 into 1 free: got %v, want ErrQueueFull", err)
	}
	if got := binary.LittleEndian.Uint32(srq.rec[abi.SRQRecordPI:]); got != 3 {
		t.Errorf("pi after a refused post: got %d, want 3", got)
	}
	// A message waits for a receive: notify 1 asks for the doorbell step.
	abi.StoreUint32(srq.rec, abi.SRQRecordNotify, 1)
	if err := srq.PostRecv(RecvWR{WRID: 4}); err != nil {
		t.Fatal(err)
	}
	if len(f.notifies) != 1 || f.notifies[0] != srq.DoorbellQueue() {
		t.Errorf("notify 1: got notifies %v, want [%d]", f.notifies, srq.DoorbellQueue())
	}
	// The device consumed two; the engine polls: no notification.
	abi.StoreUint32(srq.rec, abi.SRQRecordCI, 2)
	f.polling = true
	if err := srq.PostRecv(RecvWR{WRID: 5}, RecvWR{WRID: 6}); err != nil {
		t.Fatal(err)
	}
	if len(f.notifies) != 1 {
		t.Errorf("notified while the engine polls: %v", f.notifies)
	}
	// WQE 5 wrapped into slot 0.
	if got := binary.LittleEndian.Uint64(srq.ring[0:]); got != 5 {
		t.Errorf("slot 0 after the wrap: wr_id %d, want 5", got)
	}
	if err := srq.PostRecv(RecvWR{SGL: []abi.SGE{sgl[0], sgl[0], sgl[0]}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("3 SGEs into max 2: got %v, want ErrInvalid", err)
	}
	// A consumer index beyond the producer is the device's fault.
	abi.StoreUint32(srq.rec, abi.SRQRecordCI, 100)
	if err := srq.PostRecv(RecvWR{}); !errors.Is(err, ErrProtocol) {
		t.Errorf("ci ahead of pi: got %v, want ErrProtocol", err)
	}
}

func TestSRQChecks(t *testing.T) {
	c, f := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	cq, _ := c.CreateCQ(8)
	srq, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 3})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: QPCap{MaxSendWR: 1}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		run  func() error
		want error
	}{
		{"depth zero", func() error { _, err := pd.CreateSRQ(SRQInitAttr{}); return err }, ErrInvalid},
		{"depth above max_qp_wr", func() error { _, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 4097}); return err }, ErrInvalid},
		{"too many SGEs", func() error { _, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 1, MaxSGE: 9}); return err }, ErrInvalid},
		{"negative SGEs", func() error { _, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 1, MaxSGE: -1}); return err }, ErrInvalid},
		{"limit above depth", func() error { _, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 3, Limit: 5}); return err }, ErrInvalid},
		{"modify mask zero", func() error { return srq.Modify(abi.SRQAttr{}, 0) }, ErrInvalid},
		{"modify mask unknown", func() error { return srq.Modify(abi.SRQAttr{}, 4|abi.SRQAttrLimit) }, ErrInvalid},
		{"arm above depth", func() error { return srq.ArmLimit(5) }, ErrInvalid},
		{"resize", func() error { return srq.Modify(abi.SRQAttr{MaxWR: 8}, abi.SRQAttrMaxWR) }, ErrUnsupported},
		{"post recv to a QP on an SRQ", func() error { return qp.PostRecv(RecvWR{}) }, ErrInvalid},
		{"QP type", func() error {
			_, err := pd.CreateQP(QPInitAttr{Type: 3, SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 1, MaxRecvWR: 1}})
			return err
		}, ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := len(f.cmds)
			if err := tt.run(); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
			if len(f.cmds) != n {
				t.Errorf("sent %d commands for a request the library refuses", len(f.cmds)-n)
			}
		})
	}
	if err := srq.ArmLimit(4); err != nil { // the depth itself is a valid limit
		t.Errorf("arm at the depth: %v", err)
	}

	// Hostile QUERY_SRQ answers.
	for _, a := range []abi.SRQAttr{
		{SRQN: srq.Num() + 1, MaxWR: 4},
		{SRQN: srq.Num(), MaxWR: 8},
		{SRQN: srq.Num(), MaxWR: 4, SRQLimit: 5},
	} {
		f.srqAttr = &a
		if got, err := srq.Query(); !errors.Is(err, ErrProtocol) || got != (abi.SRQAttr{}) {
			t.Errorf("answer %+v: got %+v, %v, want ErrProtocol and nothing", a, got, err)
		}
	}

	// A refused CREATE_SRQ leaves no DMA memory behind; UNSUPPORTED
	// matches ErrUnsupported as well as the status.
	live := len(f.live)
	f.status[abi.CmdCreateSRQ] = abi.StatusUnsupported
	_, err = pd.CreateSRQ(SRQInitAttr{MaxWR: 2})
	if !errors.Is(err, ErrUnsupported) || !errors.Is(err, abi.StatusUnsupported) {
		t.Errorf("refused CREATE_SRQ: got %v, want ErrUnsupported and UNSUPPORTED", err)
	}
	if len(f.live) != live {
		t.Errorf("failed CreateSRQ leaked DMA memory: %d buffers, want %d", len(f.live), live)
	}
	f.status[abi.CmdDestroySRQ] = abi.StatusBusy
	if err := srq.Destroy(); !errors.Is(err, abi.StatusBusy) || errors.Is(err, ErrUnsupported) {
		t.Errorf("DESTROY_SRQ answered BUSY: got %v", err)
	}
	if _, ok := f.live[srq.mem.Addr]; !ok {
		t.Error("a refused DestroySRQ freed the ring the device still uses")
	}

	// A device without SRQs: ErrUnsupported, no command, no memory.
	f2 := newFake(1 << 20)
	f2.conf.MaxSRQ = 0
	c2, err := Open(f2)
	if err != nil {
		t.Fatal(err)
	}
	pd2, _ := c2.AllocPD()
	n, live2 := len(f2.cmds), len(f2.live)
	if _, err := pd2.CreateSRQ(SRQInitAttr{MaxWR: 1}); !errors.Is(err, ErrUnsupported) {
		t.Errorf("max_srq 0: got %v, want ErrUnsupported", err)
	}
	if len(f2.cmds) != n || len(f2.live) != live2 {
		t.Errorf("max_srq 0: sent %d commands, %d buffers", len(f2.cmds)-n, len(f2.live)-live2)
	}
}

func TestUDPostSend(t *testing.T) {
	c, f := openFake(t, 1<<20)
	pd, _ := c.AllocPD()
	pd2, _ := c.AllocPD()
	cq, _ := c.CreateCQ(8)
	ud, err := pd.CreateQP(QPInitAttr{Type: abi.QPTypeUD, SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxInlineData: 32}})
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := pd.CreateQP(QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	ah, _ := pd.CreateAH(AHAttr{})
	ah2, _ := pd2.CreateAH(AHAttr{})
	sge := abi.SGE{Addr: 0x3000, Length: 100, LKey: 5}
	wrs := []SendWR{
		// RDMA fields a UD QP ignores must not reach the WQE.
		{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{sge}, AH: ah, RemoteQPN: 0xabcdef, RemoteQKey: 0x1234,
			RemoteAddr: 0xdead, RKey: 9, CompareAdd: 1, Swap: 2},
		{WRID: 2, Opcode: abi.WROpSendWithImm, Inline: []byte("dgram"), Imm: 0x55, AH: ah, RemoteQPN: 7, RemoteQKey: abi.QKeyUseQP},
	}
	if err := ud.PostSend(wrs...); err != nil {
		t.Fatal(err)
	}
	want := []abi.SendWQE{
		{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, NumSGE: 1, AH: ah.Num(), RemoteQPN: 0xabcdef, RemoteQKey: 0x1234},
		{WRID: 2, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagInline, ImmData: 0x55, InlineLen: 5, AH: ah.Num(), RemoteQPN: 7, RemoteQKey: abi.QKeyUseQP},
	}
	stride := 1 << ud.sqShift
	for i, w := range want {
		if got := ud.sq[i*stride : i*stride+abi.SendWQEHdrSize]; !bytes.Equal(got, abi.Marshal(&w)) {
			t.Errorf("WQE %d: got %x, want %x", i, got, abi.Marshal(&w))
		}
	}
	if got := ud.sq[stride+abi.SendWQEHdrSize : stride+abi.SendWQEHdrSize+5]; string(got) != "dgram" {
		t.Errorf("inline: got %q", got)
	}
	if got := binary.LittleEndian.Uint32(ud.rec[abi.QPRecordSQPI:]); got != 2 {
		t.Errorf("sq_pi: got %d, want 2", got)
	}
	if len(f.notifies) != 1 {
		t.Errorf("notifies: got %v, want one", f.notifies)
	}

	tests := []struct {
		name string
		qp   *QP
		wr   SendWR
	}{
		{"RDMA write on UD", ud, SendWR{Opcode: abi.WROpRDMAWrite, AH: ah}},
		{"atomic on UD", ud, SendWR{Opcode: abi.WROpAtomicFetchAdd, AH: ah, SGL: []abi.SGE{sge}}},
		{"fence on UD", ud, SendWR{Opcode: abi.WROpSend, Flags: abi.WRFlagFence, AH: ah}},
		{"no AH", ud, SendWR{Opcode: abi.WROpSend, RemoteQPN: 5}},
		{"AH of another PD", ud, SendWR{Opcode: abi.WROpSend, AH: ah2}},
		{"QPN beyond 24 bits", ud, SendWR{Opcode: abi.WROpSend, AH: ah, RemoteQPN: 1 << 24}},
		{"inline too long", ud, SendWR{Opcode: abi.WROpSend, AH: ah, Inline: make([]byte, 33)}},
		{"AH on RC", rc, SendWR{Opcode: abi.WROpSend, AH: ah}},
		{"remote QPN on RC", rc, SendWR{Opcode: abi.WROpSend, RemoteQPN: 3}},
		{"Q_Key on RC", rc, SendWR{Opcode: abi.WROpSend, RemoteQKey: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := binary.LittleEndian.Uint32(tt.qp.rec[abi.QPRecordSQPI:])
			if err := tt.qp.PostSend(tt.wr); !errors.Is(err, ErrInvalid) {
				t.Errorf("got %v, want ErrInvalid", err)
			}
			if got := binary.LittleEndian.Uint32(tt.qp.rec[abi.QPRecordSQPI:]); got != before {
				t.Errorf("sq_pi moved %d -> %d on a refused post", before, got)
			}
		})
	}
	// An RC send reusing a slot a UD-shaped WQE never occupied still has
	// zero UD fields: the header is cleared per WQE.
	if err := rc.PostSend(SendWR{WRID: 9, Opcode: abi.WROpRDMAWrite, RemoteAddr: 0x10, RKey: 3}); err != nil {
		t.Fatal(err)
	}
	var w abi.SendWQE
	if err := abi.Unmarshal(rc.sq[:abi.SendWQEHdrSize], &w); err != nil || w.AH != 0 || w.RemoteQPN != 0 || w.RemoteQKey != 0 || w.RemoteAddr != 0x10 {
		t.Errorf("RC WQE: got %+v, %v", w, err)
	}
}

// TestPollUD checks that a UD receive completion exposes the GRH flag and
// the sending QP.
func TestPollUD(t *testing.T) {
	c, _ := openFake(t, 1<<20)
	cq, _ := c.CreateCQ(4)
	putCQE(cq, abi.CQE{WRID: 3, Opcode: abi.WCOpRecv, WCFlags: abi.WCFlagGRH | abi.WCFlagWithImm, QPNum: 0x123456, ByteLen: abi.GRHSize + 5,
		ImmData: 9, SrcQP: 0xfedcba})
	var wc [2]WC
	n, err := cq.Poll(wc[:])
	if err != nil || n != 1 {
		t.Fatalf("got %d, %v", n, err)
	}
	want := WC{WRID: 3, Opcode: abi.WCOpRecv, Flags: abi.WCFlagGRH | abi.WCFlagWithImm, QPNum: 0x123456, ByteLen: 45, Imm: 9, SrcQP: 0xfedcba}
	if wc[0] != want {
		t.Errorf("got %+v, want %+v", wc[0], want)
	}
}

func TestParseGRH(t *testing.T) {
	v4 := func(a, b, c, d byte) [16]byte {
		return [16]byte{10: 0xff, 11: 0xff, 12: a, 13: b, 14: c, 15: d}
	}
	ipv4 := make([]byte, 40)
	copy(ipv4[20:], []byte{0x45, 0, 0, 20 + 8 + 12 + 8 + 5 + 4, 0, 0, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2})
	ipv6 := make([]byte, 45)
	ipv6[0] = 0x60
	ipv6[6], ipv6[7] = 17, 64
	s6 := [16]byte{0: 0xfe, 1: 0x80, 15: 1}
	d6 := [16]byte{0: 0xfe, 1: 0x80, 15: 2}
	copy(ipv6[8:], s6[:])
	copy(ipv6[24:], d6[:])
	bad := append([]byte(nil), ipv4...)
	bad[3] = 1 // not 20 zero bytes
	tests := []struct {
		name string
		b    []byte
		want GRH
		ok   bool
	}{
		{"IPv4", ipv4, GRH{SGID: v4(10, 0, 0, 1), DGID: v4(10, 0, 0, 2), IPv4: true, HopLimit: 64}, true},
		{"IPv6 with payload", ipv6, GRH{SGID: s6, DGID: d6, HopLimit: 64}, true},
		{"short", ipv6[:39], GRH{}, false},
		{"no IP header", make([]byte, 40), GRH{}, false},
		{"IPv4 without the zero pad", bad, GRH{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseGRH(tt.b)
			if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrProtocol)) {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
			if got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSRQEvents(t *testing.T) {
	c, f := openFake(t, 1<<20)
	cq, _ := c.CreateCQ(4)
	f.events = []abi.Event{
		{Type: abi.EventCQCompletion, Handle: cq.Num()},
		{Type: abi.EventSRQLimit, Handle: 0x4242},
		{Type: abi.EventQPLastWQE, Handle: 0x17},
	}
	for _, want := range []abi.Event{{Type: abi.EventSRQLimit, Handle: 0x4242}, {Type: abi.EventQPLastWQE, Handle: 0x17}} {
		if ev, err := c.GetAsyncEvent(50e6); err != nil || ev != want {
			t.Errorf("got %+v, %v, want %+v", ev, err, want)
		}
	}
	if got, err := c.GetCQEvent(50e6); err != nil || got != cq {
		t.Errorf("the CQ event set aside: got %v, %v", got, err)
	}
}

func TestSRQUDSteadyStateAllocs(t *testing.T) {
	c, f := openFake(t, 1<<20)
	f.polling = true
	pd, _ := c.AllocPD()
	cq, _ := c.CreateCQ(16)
	srq, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 16})
	if err != nil {
		t.Fatal(err)
	}
	ud, err := pd.CreateQP(QPInitAttr{Type: abi.QPTypeUD, SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: QPCap{MaxSendWR: 16}})
	if err != nil {
		t.Fatal(err)
	}
	ah, _ := pd.CreateAH(AHAttr{})
	rwr := []RecvWR{{WRID: 1, SGL: []abi.SGE{{Addr: 1, Length: 64, LKey: 2}}}}
	swr := []SendWR{{WRID: 2, Opcode: abi.WROpSend, SGL: []abi.SGE{{Addr: 1, Length: 64, LKey: 2}}, AH: ah, RemoteQPN: 5, RemoteQKey: 6}}
	var err2 error
	allocs := testing.AllocsPerRun(1000, func() {
		if e := srq.PostRecv(rwr...); e != nil {
			err2 = e
		}
		abi.StoreUint32(srq.rec, abi.SRQRecordCI, binary.LittleEndian.Uint32(srq.rec[abi.SRQRecordPI:]))
		if e := ud.PostSend(swr...); e != nil {
			err2 = e
		}
		abi.StoreUint32(ud.rec, abi.QPRecordSQCI, binary.LittleEndian.Uint32(ud.rec[abi.QPRecordSQPI:]))
	})
	if err2 != nil {
		t.Fatal(err2)
	}
	if allocs != 0 {
		t.Errorf("got %v allocs per SRQ post + UD send, want 0", allocs)
	}
}
