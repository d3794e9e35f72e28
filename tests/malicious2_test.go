package tests

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// The rest of the malicious-guest suite: memory that vanishes under a remote
// operation, used rings the guest scribbles, WQEs with huge SGE counts and
// lengths, rings that overlap each other or the virtqueues, doorbells for
// destroyed QPs. Every case: an error status or a broken ring for the
// hostile device only, the daemon alive, a bystander pair's traffic
// verified, nothing leaked (hygiene).

// ---- a driver that lays out its own rings ----

// openPeerCfg is openPeer over a front-end configured by cfg (unsealed
// memory, a memory size).
func openPeerCfg(t *testing.T, sock string, cfg frontend.Config) *peer {
	t.Helper()
	f := dial(t, sock, cfg)
	qs := make([]int, f.NumQueues)
	for i := range qs {
		qs[i] = i
	}
	if err := f.Start(qs...); err != nil {
		t.Fatal(err)
	}
	tr, err := frontend.NewTransport(f)
	if err != nil {
		t.Fatal(err)
	}
	c, err := verbs.Open(tr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	p := &peer{ctx: c, f: f}
	if p.gid, err = c.QueryGID(); err != nil {
		t.Fatal(err)
	}
	if p.pd, err = c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if p.cq, err = c.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if p.qp, err = p.pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 64}}); err != nil {
		t.Fatal(err)
	}
	if p.buf, err = c.AllocBuffer(peerBuf); err != nil {
		t.Fatal(err)
	}
	if p.mr, err = p.pd.RegMR(p.buf, 0, peerBuf, abi.AccessAll); err != nil {
		t.Fatal(err)
	}
	return p
}

// connectPair connects a.qp and b.qp to each other.
func connectPair(t *testing.T, a, b *peer) {
	t.Helper()
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
}

// verifiedWrite writes 4 KiB of fresh bytes from a's MR into b's MR over
// a.qp and checks that they arrived: the bystander's traffic.
func verifiedWrite(t *testing.T, a, b *peer, seed byte) {
	t.Helper()
	src, dst := a.mr.Bytes()[:4096], b.mr.Bytes()[8192:8192+4096]
	fill(src, seed)
	if err := a.qp.PostSend(verbs.SendWR{WRID: uint64(seed), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 4096)}, RemoteAddr: b.mr.Addr + 8192, RKey: b.mr.RKey}); err != nil {
		t.Fatalf("bystander post: %v", err)
	}
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess || wc.WRID != uint64(seed) {
		t.Fatalf("bystander write: got %+v, want success", wc)
	}
	if !bytes.Equal(src, dst) {
		t.Fatal("bystander write: the bytes that arrived differ from the bytes sent")
	}
}

// noRingErrors checks that the devices ids broke no ring.
func noRingErrors(t *testing.T, d *daemon.Daemon, ids ...string) {
	t.Helper()
	for _, id := range ids {
		dv, ok := d.Device(id)
		if !ok {
			t.Fatalf("device %s gone", id)
		}
		if n := dv.Info().RingErrors; n != 0 {
			t.Fatalf("device %s: %d ring errors, want none", id, n)
		}
	}
}

// rawCmd runs one control command through p's transport.
func rawCmd(t *testing.T, p *peer, op abi.Opcode, payload []byte, respLen int) (abi.Status, []byte) {
	t.Helper()
	req := append(abi.Marshal(&abi.CmdHeader{Opcode: uint16(op)}), payload...)
	resp, err := p.ctx.Transport().Command(req, abi.RespHeaderSize+respLen)
	if err != nil {
		t.Fatalf("%v: %v", op, err)
	}
	if len(resp) < abi.RespHeaderSize {
		t.Fatalf("%v: response of %d bytes", op, len(resp))
	}
	return abi.Status(binary.LittleEndian.Uint32(resp)), resp[abi.RespHeaderSize:]
}

// dma allocates n bytes (whole pages) of p's guest memory and returns the
// guest-physical address.
func (p *peer) dma(t *testing.T, n uint64) uint64 {
	t.Helper()
	b, err := p.ctx.Transport().AllocDMA((n+abi.PageSize-1)&^(abi.PageSize-1), abi.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	return uint64(b.Addr)
}

// host returns this process's view of p's guest memory [gpa, gpa+n) (the
// front-end's guest memory is one region at guest-physical 0).
func (p *peer) host(gpa, n uint64) []byte { return p.f.Memory()[gpa : gpa+n : gpa+n] }

// gpaOf returns the guest-physical address of b, a view into p's memory.
func (p *peer) gpaOf(b []byte) uint64 {
	return uint64(reflect.ValueOf(b).Pointer() - reflect.ValueOf(p.f.Memory()).Pointer())
}

// pagesAt returns the addresses of n contiguous pages from gpa.
func pagesAt(gpa uint64, n int) []uint64 {
	ps := make([]uint64, n)
	for i := range ps {
		ps[i] = gpa + uint64(i)*abi.PageSize
	}
	return ps
}

func appendPages(b []byte, pages []uint64) []byte {
	for _, pg := range pages {
		b = binary.LittleEndian.AppendUint64(b, pg)
	}
	return b
}

// rawCQ is a CQ whose ring and record the test placed.
type rawCQ struct {
	p      *peer
	num    uint32
	depth  uint32
	pages  []uint64
	record uint64
	ci     uint32
}

// createRawCQ issues CREATE_CQ for depth entries over pages (nil: fresh
// memory) with its record at record (0: fresh memory).
func createRawCQ(t *testing.T, p *peer, depth uint32, pages []uint64, record uint64) (*rawCQ, abi.Status) {
	t.Helper()
	np := int((uint64(depth)*abi.CQESize + abi.PageSize - 1) / abi.PageSize)
	if pages == nil {
		pages = pagesAt(p.dma(t, uint64(np)*abi.PageSize), np)
	}
	if record == 0 {
		record = p.dma(t, abi.PageSize)
	}
	req := appendPages(abi.Marshal(&abi.CreateCQ{CQE: depth, NPages: uint32(len(pages)), Record: record}), pages)
	st, resp := rawCmd(t, p, abi.CmdCreateCQ, req, 8)
	if st != abi.StatusOK {
		return nil, st
	}
	return &rawCQ{p: p, num: binary.LittleEndian.Uint32(resp), depth: depth, pages: pages, record: record}, st
}

// cqes consumes the CQ's entries, as a driver polls (bounded by the depth).
func (c *rawCQ) cqes(t *testing.T) []abi.CQE {
	t.Helper()
	rec := c.p.host(c.record, abi.CQRecordSize)
	pi := abi.LoadUint32(rec, abi.CQRecordPI)
	var out []abi.CQE
	for k := uint32(0); c.ci != pi && k < c.depth; k++ {
		off := uint64(c.ci%c.depth) * abi.CQESize
		slot := c.p.host(c.pages[off/abi.PageSize]+off%abi.PageSize, abi.CQESize)
		var e abi.CQE
		if err := abi.Unmarshal(slot, &e); err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
		c.ci++
	}
	abi.StoreUint32(rec, abi.CQRecordCI, c.ci)
	return out
}

// waitCQEs waits until the CQ holds n entries and returns them.
func (c *rawCQ) waitCQEs(t *testing.T, n int) []abi.CQE {
	t.Helper()
	var got []abi.CQE
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < n {
		got = append(got, c.cqes(t)...)
		if time.Now().After(deadline) {
			t.Fatalf("CQ %#x: got %d CQEs %+v, want %d", c.num, len(got), got, n)
		}
		time.Sleep(50 * time.Microsecond)
	}
	return got
}

// waitPI waits until the device has advanced the CQ's producer index to
// at least n (the record must not overlap anything).
func (c *rawCQ) waitPI(t *testing.T, n uint32) {
	t.Helper()
	rec := c.p.host(c.record, abi.CQRecordSize)
	deadline := time.Now().Add(5 * time.Second)
	for int32(abi.LoadUint32(rec, abi.CQRecordPI)-n) < 0 {
		if time.Now().After(deadline) {
			t.Fatalf("CQ %#x: pi %d, want at least %d", c.num, abi.LoadUint32(rec, abi.CQRecordPI), n)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// rawQPSpec lays out a QP; zero values take defaults (depth 16, 4 SGEs, 64
// bytes inline, fresh memory for rings and record, doorbell queue 0).
type rawQPSpec struct {
	cq               uint32 // send and receive CQ
	depth            uint32
	maxSGE, inline   uint32
	sqPages, rqPages []uint64
	record           uint64
}

// rawQP is a QP whose rings the test writes directly: WQEs a verbs library
// would refuse to post.
type rawQP struct {
	p        *peer
	num      uint32
	depth    uint32
	stride   uint32
	sqPages  []uint64
	record   uint64
	sqPI     uint32
	doorbell int
}

func createRawQP(t *testing.T, p *peer, s rawQPSpec) (*rawQP, abi.Status) {
	t.Helper()
	if s.depth == 0 {
		s.depth = 16
	}
	if s.maxSGE == 0 {
		s.maxSGE = 4
	}
	if s.inline == 0 {
		s.inline = 64
	}
	sqShift := uint32(abi.MinSQWQEShift)
	for 1<<sqShift < abi.SendWQEHdrSize+abi.SGESize*s.maxSGE || 1<<sqShift < abi.SendWQEHdrSize+s.inline {
		sqShift++
	}
	rqShift := uint32(abi.MinRQWQEShift)
	for 1<<rqShift < abi.RecvWQEHdrSize+abi.SGESize*s.maxSGE {
		rqShift++
	}
	sqN := int((uint64(s.depth)<<sqShift + abi.PageSize - 1) / abi.PageSize)
	rqN := int((uint64(s.depth)<<rqShift + abi.PageSize - 1) / abi.PageSize)
	if s.sqPages == nil {
		s.sqPages = pagesAt(p.dma(t, uint64(sqN)*abi.PageSize), sqN)
	}
	if s.rqPages == nil {
		s.rqPages = pagesAt(p.dma(t, uint64(rqN)*abi.PageSize), rqN)
	}
	if s.record == 0 {
		s.record = p.dma(t, abi.PageSize)
	}
	req := abi.Marshal(&abi.CreateQP{
		PDN: p.pd.Num(), SendCQN: s.cq, RecvCQN: s.cq, QPType: abi.QPTypeRC,
		MaxSendWR: s.depth, MaxRecvWR: s.depth, MaxSendSGE: s.maxSGE, MaxRecvSGE: s.maxSGE, MaxInlineData: s.inline,
		SQWQEShift: sqShift, RQWQEShift: rqShift, Record: s.record,
		SQNPages: uint32(len(s.sqPages)), RQNPages: uint32(len(s.rqPages)),
	})
	req = appendPages(appendPages(req, s.sqPages), s.rqPages)
	st, resp := rawCmd(t, p, abi.CmdCreateQP, req, 8)
	if st != abi.StatusOK {
		return nil, st
	}
	return &rawQP{p: p, num: binary.LittleEndian.Uint32(resp), depth: s.depth, stride: 1 << sqShift,
		sqPages: s.sqPages, record: s.record}, st
}

// modify runs MODIFY_QP on the raw QP.
func (q *rawQP) modify(t *testing.T, a abi.QPAttr) abi.Status {
	t.Helper()
	a.QPN = q.num
	st, _ := rawCmd(t, q.p, abi.CmdModifyQP, abi.Marshal(&a), 0)
	return st
}

// connect moves the raw QP to RTS towards (gid, dest), as ConnectRC does,
// with the given rnr_retry.
func (q *rawQP) connect(t *testing.T, gid [16]byte, dest uint32, rnrRetry uint32) {
	t.Helper()
	steps := []abi.QPAttr{
		{QPState: abi.QPSInit, PortNum: 1, QPAccessFlags: abi.AccessAll &^ abi.AccessLocalWrite,
			AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags},
		{QPState: abi.QPSRTR, PathMTU: abi.MTU4096, DestQPNum: dest, MinRNRTimer: 1, DGID: gid, HopLimit: 1,
			AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN | abi.QPAttrRQPSN |
				abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer},
		{QPState: abi.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: rnrRetry,
			AttrMask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry |
				abi.QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if st := q.modify(t, s); st != abi.StatusOK {
			t.Fatalf("raw qp %#x to state %d: %v", q.num, s.QPState, st)
		}
	}
}

// state returns the QP's state (QUERY_QP).
func (q *rawQP) state(t *testing.T) uint32 {
	t.Helper()
	st, resp := rawCmd(t, q.p, abi.CmdQueryQP, abi.Marshal(&abi.Handle{Handle: q.num}), 96)
	if st != abi.StatusOK {
		t.Fatalf("QUERY_QP %#x: %v", q.num, st)
	}
	var a abi.QPAttr
	if err := abi.Unmarshal(resp, &a); err != nil {
		t.Fatal(err)
	}
	return a.QPState
}

// post writes wqe (a header and what follows it, at most the stride) into
// the next send slot, publishes it and rings the doorbell, as a driver does.
func (q *rawQP) post(t *testing.T, wqe []byte) {
	t.Helper()
	if len(wqe) > int(q.stride) {
		t.Fatalf("WQE of %d bytes in a stride of %d", len(wqe), q.stride)
	}
	off := uint64(q.sqPI%q.depth) * uint64(q.stride)
	slot := q.p.host(q.sqPages[off/abi.PageSize]+off%abi.PageSize, uint64(q.stride))
	clear(slot)
	copy(slot, wqe)
	q.sqPI++
	q.ring(t)
}

// ring publishes sqPI in the record and notifies the doorbell queue unless
// the engine polls.
func (q *rawQP) ring(t *testing.T) {
	t.Helper()
	abi.StoreUint32(q.p.host(q.record, abi.QPRecordSize), abi.QPRecordSQPI, q.sqPI)
	abi.Fence()
	tr := q.p.ctx.Transport()
	if !tr.Polling(q.doorbell) {
		if err := tr.Notify(q.doorbell); err != nil {
			t.Fatal(err)
		}
	}
}

// wqe encodes a send WQE header followed by SGEs.
func wqe(w abi.SendWQE, sges ...abi.SGE) []byte {
	b := abi.Marshal(&w)
	for _, s := range sges {
		b = append(b, abi.Marshal(&s)...)
	}
	return b
}

// newPeerQP creates another QP on p (on p's CQ) for a raw QP to talk to.
func newPeerQP(t *testing.T, p *peer) *verbs.QP {
	t.Helper()
	q, err := p.pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 4, MaxRecvSGE: 4}})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// rig is the daemon of most cases: dev0 the hostile device v, dev1 (w) and
// dev2 (x) a bystander pair whose traffic is verified; w also serves the
// hostile device's peer QPs.
type rig struct {
	d       *daemon.Daemon
	socks   []string
	v, w, x *peer
}

func newRig(t *testing.T, vcfg frontend.Config) *rig {
	t.Helper()
	hygiene(t)
	d, socks := startDaemon(t, 3)
	r := &rig{d: d, socks: socks}
	r.w, r.x = openPeer(t, socks[1], 0), openPeer(t, socks[2], 0)
	connectPair(t, r.w, r.x)
	r.v = openPeerCfg(t, socks[0], vcfg)
	return r
}

// bystanders checks that the bystander pair still moves verified bytes and
// broke no ring, and that the daemon still serves a new front-end.
func (r *rig) bystanders(t *testing.T, seed byte) {
	t.Helper()
	verifiedWrite(t, r.w, r.x, seed)
	verifiedWrite(t, r.x, r.w, seed+1)
	noRingErrors(t, r.d, "dev1", "dev2")
}

// link connects the hostile device's verbs QP v.qp to a fresh QP of w, so
// that v's other traffic can be verified (verifiedWrite(v, w)).
func (r *rig) link(t *testing.T) *verbs.QP {
	t.Helper()
	wq := newPeerQP(t, r.w)
	if err := r.v.qp.ConnectRC(r.w.gid, wq.Num(), wq.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := wq.ConnectRC(r.v.gid, r.v.qp.Num(), r.v.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return wq
}

// waitIdle waits until the engine of p's doorbell queue db has gone to
// sleep at least once (it clears NO_NOTIFY only then): an engine caught in
// a loop never does.
func waitIdle(t *testing.T, p *peer, db int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.ctx.Transport().Polling(db) {
		if time.Now().After(deadline) {
			t.Fatal("the doorbell engine is still polling after 10 s")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// ---- 1. memory that vanishes under a remote operation ----

// TestPeerMemoryFault: a front-end shrinks the memfd behind its guest
// memory; a remote operation from another device then faults in that
// memory. The fault is the shrinking device's: the requester's WR
// completes with REM_OP_ERR, the requester's rings stay healthy and its
// other QP keeps working, the shrinking device's QP goes to ERR with
// QP_FATAL (and its own rings break where its own engine touches the
// vanished memory). Closing the requester afterwards (a device reset that
// reads the connected peer's record) does not take the daemon down.
func TestPeerMemoryFault(t *testing.T) {
	for _, tc := range []struct {
		name  string
		whole bool // all of the victim's memory, rings included; else only its MR
	}{
		{"peer MR gone", false},
		{"all peer memory gone", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const mem = 16 << 20
			r := newRig(t, frontend.Config{MemorySize: mem, QueueSize: 64, NoSeal: true})
			// The requester is w (its first QP talks to x), over a second
			// QP; v shrinks its memory.
			a, b := r.w, r.v
			aq := r.link(t)
			// b's target MR is the last thing it allocates, so that cutting
			// the file at its start leaves b's rings and records intact.
			tail, err := b.ctx.AllocBuffer(1 << 20)
			if err != nil {
				t.Fatal(err)
			}
			tmr, err := b.pd.RegMR(tail, 0, 1<<20, abi.AccessAll)
			if err != nil {
				t.Fatal(err)
			}
			cut := int64(tail.Addr)
			if tc.whole {
				cut = 0
			}
			// From here on this process must not touch b's memory beyond cut.
			if err := unix.Ftruncate(b.f.MemFd(), cut); err != nil {
				t.Fatal(err)
			}
			if err := aq.PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
				SGL: []abi.SGE{a.mr.SGE(0, 8192)}, RemoteAddr: tmr.Addr + 100, RKey: tmr.RKey}); err != nil {
				t.Fatal(err)
			}
			if wc := pollOne(t, a.cq); wc.WRID != 1 || wc.Status != abi.WCRemOpErr {
				t.Fatalf("write into vanished memory: got %+v, want REM_OP_ERR (11)", wc)
			}
			if at, err := aq.Query(); err != nil || at.QPState != abi.QPSErr {
				t.Fatalf("requester QP: state %d (%v), want ERR", at.QPState, err)
			}
			// The requester's device is healthy: the bystander traffic runs
			// over the requester's own engine and rings (w talks to x).
			r.bystanders(t, 0x10)
			if tc.whole {
				// b's own engine flushes its QP in ERR over its vanished
				// record: b's doorbell ring breaks, b's only.
				waitRingError(t, r.d, "dev0", b.f.Queue(abi.FirstDoorbellQueue+b.qp.DoorbellQueue()))
			} else {
				ev, err := b.ctx.GetAsyncEvent(5 * time.Second)
				if err != nil || ev.Type != abi.EventQPFatal || ev.Handle != b.qp.Num() {
					t.Fatalf("responder's event: got %+v (%v), want QP_FATAL for %#x", ev, err, b.qp.Num())
				}
				if at, err := b.qp.Query(); err != nil || at.QPState != abi.QPSErr {
					t.Fatalf("responder QP: state %d (%v), want ERR", at.QPState, err)
				}
				// The responder device itself still serves commands and its
				// rings are intact.
				if _, err := b.ctx.QueryDevice(); err != nil {
					t.Fatalf("responder's control queue: %v", err)
				}
				noRingErrors(t, r.d, "dev0")
			}
			// The requester's front-end leaves: its reset reads the record
			// of b's QP, connected to it (in vanished memory in the second
			// case: the daemon must not die of it).
			a.ctx.Close()
			a.f.Close()
			waitReleased(t, r.d, "dev1")
			bystanderOK(t, r.socks[1])
			verifiedWrite(t, r.x, openAndConnect(t, r.socks[1], r.x), 0x20)
		})
	}
}

// openAndConnect opens a new peer on sock with a fresh QP connected to a
// fresh QP of p (p.qp is replaced).
func openAndConnect(t *testing.T, sock string, p *peer) *peer {
	t.Helper()
	n := openPeer(t, sock, 0)
	p.qp = newPeerQP(t, p)
	connectPair(t, p, n)
	return n
}

// ---- 2. used rings the guest scribbles ----

// blindControl drives a control queue without ever reading its used ring:
// it reuses descriptors 0 and 1 for every command, publishes them in the
// available ring, kicks, and learns that the device answered from the
// interrupt (the call eventfd), which the device raises from its own
// indices and from the driver's used_event (in the available ring, not
// scribbled). Only the device's own reading of the rings decides the
// outcome.
type blindControl struct {
	q         *frontend.Queue
	eventIdx  bool
	idx       uint16 // next available index; the device's used index before the next command
	req, resp []byte
	reqGPA    uint64
	respGPA   uint64
}

// newBlindControl takes over p's control queue. Precondition: no command
// in flight (then the device's used index equals the available index).
func newBlindControl(t *testing.T, p *peer) *blindControl {
	t.Helper()
	q := p.f.Queue(abi.ControlQueue)
	gpa, buf, err := p.f.Alloc(2*abi.PageSize, abi.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	return &blindControl{q: q, eventIdx: p.f.Features&virtio.FeatureEventIdx != 0, idx: abi.LoadUint16(q.Rings().Avail, 2),
		req: buf[:abi.PageSize], resp: buf[abi.PageSize:], reqGPA: uint64(gpa), respGPA: uint64(gpa) + abi.PageSize}
}

// exec runs one command and returns the response bytes (header included).
func (b *blindControl) exec(t *testing.T, req []byte, respLen int) []byte {
	t.Helper()
	r := b.q.Rings()
	size := len(r.Desc) / 16
	copy(b.req, req)
	clear(b.resp[:respLen])
	putDesc(r.Desc, 0, desc{b.reqGPA, uint32(len(req)), virtio.DescFNext, 1})
	putDesc(r.Desc, 1, desc{b.respGPA, uint32(respLen), virtio.DescFWrite, 0})
	// Interrupt wanted for this chain: no NO_INTERRUPT flag, and with
	// EVENT_IDX used_event = the used index before it.
	abi.StoreUint16(r.Avail, 0, 0)
	if b.eventIdx {
		abi.StoreUint16(r.Avail, 4+2*size, b.idx)
	}
	if _, err := b.q.Call.TryWait(); err != nil {
		t.Fatal(err)
	}
	publish(r, size, b.idx, 0, b.idx+1)
	b.idx++
	if err := b.q.Kick.Signal(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.q.Call.WaitTimeout(5 * time.Second); err != nil {
		t.Fatalf("command %d: no interrupt: %v", b.idx-1, err)
	}
	return b.resp[:respLen]
}

// TestUsedRingScribbled: a front-end goroutine writes random bytes over the
// used rings (flags, index, elements, avail_event) of its control queue and
// of its doorbell queue while commands and RDMA traffic run. The device
// never reads them back: a driver that does not read them either (it
// learns of a command's end from the response, and kicks its doorbell
// regardless of NO_NOTIFY) gets every command answered and every write
// done, with the right bytes, and no ring breaks. The bystanders, the
// daemon and a later front-end are fine.
func TestUsedRingScribbled(t *testing.T) {
	r := newRig(t, frontend.Config{MemorySize: 16 << 20, QueueSize: 64})
	v, w := r.v, r.w
	r.link(t)
	attr, err := v.ctx.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	wantAttr := abi.Marshal(&attr)
	// From here on the verbs library issues no command on v (its control
	// queue's state is the blind driver's).
	ctl := newBlindControl(t, v)
	used := [][]byte{
		v.f.Queue(abi.ControlQueue).Rings().Used,
		v.f.Queue(abi.FirstDoorbellQueue + v.qp.DoorbellQueue()).Rings().Used,
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var scribbles atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(1, 2))
		for !stop.Load() {
			u := used[rng.IntN(len(used))]
			switch rng.IntN(4) {
			case 0: // flags
				abi.StoreUint16(u, 0, uint16(rng.Uint32()))
			case 1: // idx
				abi.StoreUint16(u, 2, uint16(rng.Uint32()))
			case 2: // an element, or avail_event at the end
				off := 4 + 8*rng.IntN((len(u)-4)/8)
				binary.LittleEndian.PutUint64(u[off:], rng.Uint64())
			default: // everything
				for i := 0; i+8 <= len(u); i += 8 {
					binary.LittleEndian.PutUint64(u[i:], rng.Uint64())
				}
			}
			if scribbles.Add(1)%64 == 0 {
				runtime.Gosched()
			}
		}
	}()
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	cmdHdr := func(op abi.Opcode) []byte { return abi.Marshal(&abi.CmdHeader{Opcode: uint16(op)}) }
	dst := w.mr.Bytes()
	tr := v.ctx.Transport()
	for i := range 200 {
		// Commands: every one answered, and right.
		resp := ctl.exec(t, cmdHdr(abi.CmdQueryDevice), abi.RespHeaderSize+abi.DeviceAttrSize)
		if st := abi.Status(binary.LittleEndian.Uint32(resp)); st != abi.StatusOK || !bytes.Equal(resp[abi.RespHeaderSize:], wantAttr) {
			t.Fatalf("command %d under scribbling: status %v, attributes equal %v", i, st, bytes.Equal(resp[abi.RespHeaderSize:], wantAttr))
		}
		// An object created and destroyed: state changes go on.
		resp = ctl.exec(t, cmdHdr(abi.CmdCreatePD), abi.RespHeaderSize+8)
		if st := abi.Status(binary.LittleEndian.Uint32(resp)); st != abi.StatusOK {
			t.Fatalf("CREATE_PD %d under scribbling: %v", i, st)
		}
		pd := binary.LittleEndian.Uint32(resp[abi.RespHeaderSize:])
		resp = ctl.exec(t, append(cmdHdr(abi.CmdDestroyPD), abi.Marshal(&abi.Handle{Handle: pd})...), abi.RespHeaderSize)
		if st := abi.Status(binary.LittleEndian.Uint32(resp)); st != abi.StatusOK {
			t.Fatalf("DESTROY_PD %d under scribbling: %v", i, st)
		}
		// Traffic: every write done, with the right bytes.
		seed := byte(i)
		fill(v.mr.Bytes()[:512], seed)
		off := uint64(512 * (i % 64))
		if err := v.qp.PostSend(verbs.SendWR{WRID: uint64(i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{v.mr.SGE(0, 512)}, RemoteAddr: w.mr.Addr + off, RKey: w.mr.RKey}); err != nil {
			t.Fatal(err)
		}
		// NO_NOTIFY is scribbled: kick regardless.
		if err := tr.Notify(v.qp.DoorbellQueue()); err != nil {
			t.Fatal(err)
		}
		if wc := pollOne(t, v.cq); wc.WRID != uint64(i) || wc.Status != abi.WCSuccess {
			t.Fatalf("write %d under scribbling: got %+v", i, wc)
		}
		if !bytes.Equal(dst[off:off+512], v.mr.Bytes()[:512]) {
			t.Fatalf("write %d completed but the bytes differ", i)
		}
		if i%50 == 0 {
			verifiedWrite(t, r.w, r.x, byte(i))
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d scribbles over 200 commands and 200 writes", scribbles.Load())
	noRingErrors(t, r.d, "dev0")
	r.bystanders(t, 0x30)
	// The device is intact: a new front-end on the same socket gets a
	// working device with nothing left of the old one.
	v.ctx.Close()
	v.f.Close()
	waitReleased(t, r.d, "dev0")
	verifiedWrite(t, openAndConnect(t, r.socks[0], r.w), r.w, 0x40)
}

// ---- 3. WQEs with huge SGE counts and lengths ----

// TestHugeWQEs posts, through the front-end and the doorbell queue, WQEs no
// verbs library would: num_sge far beyond max_send_sge, lengths summing to
// 2^31, 2^32 and beyond, addresses that wrap. Each completes in error and
// moves its QP to ERR (a later WR flushes); the device's other QP, the
// bystanders and the daemon go on.
func TestHugeWQEs(t *testing.T) {
	r := newRig(t, frontend.Config{MemorySize: 32 << 20, QueueSize: 64})
	v, w := r.v, r.w
	r.link(t)
	// A 256 MiB MR over one page, named 65536 times (an indirect page
	// list): lengths up to 2^28 per SGE pass the MR bounds check, so the
	// total-length check is what stops them.
	const bigLen = 1 << 28
	page := v.dma(t, abi.PageSize)
	list := v.dma(t, 8*(bigLen/abi.PageSize))
	pl := v.host(list, 8*(bigLen/abi.PageSize))
	for i := 0; i < bigLen/abi.PageSize; i++ {
		binary.LittleEndian.PutUint64(pl[8*i:], page)
	}
	st, resp := rawCmd(t, v, abi.CmdRegMR, abi.Marshal(&abi.RegMR{PDN: v.pd.Num(), Access: abi.AccessAll,
		IOVA: 1 << 40, Length: bigLen, PageShift: abi.PageShift, NPages: bigLen / abi.PageSize, PageList: list}), 8)
	if st != abi.StatusOK {
		t.Fatalf("REG_MR of a page named %d times: %v", bigLen/abi.PageSize, st)
	}
	bigKey := binary.LittleEndian.Uint32(resp)
	big := func(n int) []abi.SGE {
		s := make([]abi.SGE, n)
		for i := range s {
			s[i] = abi.SGE{Addr: 1 << 40, Length: bigLen, LKey: bigKey}
		}
		return s
	}
	lk := v.mr.LKey
	hdr := func(op uint8, nsge uint16) abi.SendWQE {
		return abi.SendWQE{WRID: 0xbad, Opcode: op, Flags: abi.WRFlagSignaled, NumSGE: nsge,
			RemoteAddr: w.mr.Addr, RKey: w.mr.RKey}
	}
	cases := []struct {
		name string
		wqe  []byte
		want abi.WCStatus
		peer bool // the responder QP goes to ERR too
	}{
		{"num_sge one above max_send_sge", wqe(hdr(abi.WROpRDMAWrite, 17), big(16)...), abi.WCLocQPOpErr, false},
		{"num_sge 65535", wqe(hdr(abi.WROpRDMAWrite, math.MaxUint16)), abi.WCLocQPOpErr, false},
		{"num_sge 65535 with INLINE", func() []byte {
			h := hdr(abi.WROpRDMAWrite, math.MaxUint16)
			h.Flags |= abi.WRFlagInline
			return wqe(h)
		}(), abi.WCLocQPOpErr, false},
		{"inline_len 2^32-1", func() []byte {
			h := hdr(abi.WROpSend, 0)
			h.Flags |= abi.WRFlagInline
			h.InlineLen = math.MaxUint32
			return wqe(h)
		}(), abi.WCLocQPOpErr, false},
		{"write of 2^32 bytes (a 32-bit sum wraps to 0)", wqe(hdr(abi.WROpRDMAWrite, 16), big(16)...), abi.WCLocLenErr, false},
		{"send of 9 x 2^28 bytes, above 2^31", wqe(hdr(abi.WROpSend, 9), big(9)...), abi.WCLocLenErr, false},
		{"read of 16 x 2^28 bytes", wqe(hdr(abi.WROpRDMARead, 16), big(16)...), abi.WCLocLenErr, false},
		{"16 SGEs of 2^32-1 bytes", wqe(hdr(abi.WROpRDMAWrite, 16), func() []abi.SGE {
			s := big(16)
			for i := range s {
				s[i].Length = math.MaxUint32
			}
			return s
		}()...), abi.WCLocProtErr, false},
		{"SGE address wraps past 2^64", wqe(hdr(abi.WROpRDMAWrite, 1),
			abi.SGE{Addr: math.MaxUint64 - 15, Length: 4096, LKey: lk}), abi.WCLocProtErr, false},
		{"SGE one byte past the MR", wqe(hdr(abi.WROpRDMAWrite, 1),
			abi.SGE{Addr: v.mr.Addr + peerBuf - 1, Length: 2, LKey: lk}), abi.WCLocProtErr, false},
		{"remote address wraps past 2^64", func() []byte {
			h := hdr(abi.WROpRDMAWrite, 1)
			h.RemoteAddr = math.MaxUint64 - 7
			return wqe(h, abi.SGE{Addr: v.mr.Addr, Length: 4096, LKey: lk})
		}(), abi.WCRemAccessErr, true},
		{"read of 2^28 bytes from a 64 KiB remote MR", wqe(hdr(abi.WROpRDMARead, 1), big(1)...), abi.WCRemAccessErr, true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wq := newPeerQP(t, w)
			q, st := createRawQP(t, v, rawQPSpec{cq: v.cq.Num(), maxSGE: 16})
			if st != abi.StatusOK {
				t.Fatalf("CREATE_QP: %v", st)
			}
			q.connect(t, w.gid, wq.Num(), 0)
			if err := wq.ConnectRC(v.gid, q.num, 0, abi.AccessAll&^abi.AccessLocalWrite); err != nil {
				t.Fatal(err)
			}
			q.post(t, tc.wqe)
			q.post(t, wqe(abi.SendWQE{WRID: 2, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
				RemoteAddr: w.mr.Addr, RKey: w.mr.RKey}, abi.SGE{Addr: v.mr.Addr, Length: 16, LKey: lk}))
			if wc := pollOne(t, v.cq); wc.WRID != 0xbad || wc.Status != tc.want || wc.QPNum != q.num {
				t.Fatalf("got %+v, want wr 0xbad status %d", wc, tc.want)
			}
			if wc := pollOne(t, v.cq); wc.WRID != 2 || wc.Status != abi.WCWRFlushErr {
				t.Fatalf("the WR after: got %+v, want WR_FLUSH_ERR (5)", wc)
			}
			if s := q.state(t); s != abi.QPSErr {
				t.Fatalf("QP state %d, want ERR", s)
			}
			at, err := wq.Query()
			if err != nil {
				t.Fatal(err)
			}
			if wantPeer := map[bool]uint32{false: abi.QPSRTS, true: abi.QPSErr}[tc.peer]; at.QPState != wantPeer {
				t.Fatalf("responder QP state %d, want %d", at.QPState, wantPeer)
			}
			if st, _ := rawCmd(t, v, abi.CmdDestroyQP, abi.Marshal(&abi.Handle{Handle: q.num}), 0); st != abi.StatusOK {
				t.Fatalf("DESTROY_QP: %v", st)
			}
			if err := wq.Destroy(); err != nil {
				t.Fatal(err)
			}
			// The device's other QP still moves verified bytes.
			verifiedWrite(t, v, w, byte(0x50+i))
		})
	}
	r.bystanders(t, 0x60)
	noRingErrors(t, r.d, "dev0")
}

// ---- 4. rings that overlap each other or the virtqueues ----

// TestOverlappingRings: the device accepts CQ and QP rings and records that
// overlap one another or the virtqueues (docs/spec.md, CREATE_CQ and
// CREATE_QP) and proves it harmless: what it reads back from such memory is
// validated like any guest input, so the hostile device gets error
// completions, QPs in ERR, an overrun CQ or broken queues of its own; its
// engine does not spin forever; the bystanders, the daemon and a later
// front-end on the same socket are fine.
func TestOverlappingRings(t *testing.T) {
	type layout struct {
		cqPages          []uint64
		cqRecord         uint64
		sqPages, rqPages []uint64
		qpRecord         uint64
		engineIdle       bool // the doorbell used ring is intact: the engine's sleep is observable
	}
	cases := []struct {
		name string
		lay  func(v *peer, fresh func(int) []uint64) layout
	}{
		{"CQ ring on the send queue", func(v *peer, fresh func(int) []uint64) layout {
			sq := fresh(1)
			return layout{cqPages: sq, sqPages: sq, engineIdle: true}
		}},
		{"CQ record on the QP record (pi is sq_pi, ci is rq_pi)", func(v *peer, fresh func(int) []uint64) layout {
			rec := fresh(1)[0]
			return layout{cqRecord: rec, qpRecord: rec, engineIdle: true}
		}},
		{"CQ record on the QP's consumer indices", func(v *peer, fresh func(int) []uint64) layout {
			rec := fresh(1)[0]
			return layout{cqRecord: rec + 8, qpRecord: rec, engineIdle: true}
		}},
		{"QP record inside the CQ ring", func(v *peer, fresh func(int) []uint64) layout {
			ring := fresh(1)
			return layout{cqPages: ring, qpRecord: ring[0] + 64, engineIdle: true}
		}},
		{"send and receive queues on one page", func(v *peer, fresh func(int) []uint64) layout {
			p := fresh(1)
			return layout{sqPages: p, rqPages: p, engineIdle: true}
		}},
		{"CQ ring naming one page twice", func(v *peer, fresh func(int) []uint64) layout {
			p := fresh(1)
			return layout{cqPages: []uint64{p[0], p[0]}, engineIdle: true}
		}},
		{"CQ ring on the control queue's descriptor table", func(v *peer, fresh func(int) []uint64) layout {
			d := v.gpaOf(v.f.Queue(abi.ControlQueue).Rings().Desc)
			return layout{cqPages: []uint64{d &^ (abi.PageSize - 1)}, engineIdle: true}
		}},
		{"CQ ring on the doorbell queue's used ring", func(v *peer, fresh func(int) []uint64) layout {
			u := v.gpaOf(v.f.Queue(abi.FirstDoorbellQueue).Rings().Used)
			return layout{cqPages: []uint64{u &^ (abi.PageSize - 1)}}
		}},
		{"QP record on the event queue's available ring", func(v *peer, fresh func(int) []uint64) layout {
			a := v.gpaOf(v.f.Queue(abi.EventQueue).Rings().Avail)
			return layout{qpRecord: a &^ 7, engineIdle: true}
		}},
		{"send queue on the control queue's available ring", func(v *peer, fresh func(int) []uint64) layout {
			a := v.gpaOf(v.f.Queue(abi.ControlQueue).Rings().Avail)
			return layout{sqPages: []uint64{a &^ (abi.PageSize - 1)}, engineIdle: true}
		}},
	}
	for ci, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, frontend.Config{MemorySize: 16 << 20, QueueSize: 64})
			v, w := r.v, r.w
			r.link(t)
			fresh := func(n int) []uint64 { return pagesAt(v.dma(t, uint64(n)*abi.PageSize), n) }
			lay := tc.lay(v, fresh)
			// A CQ of 128 entries a page (two pages if it names two) and a
			// QP of 16 WQEs of 128 bytes a queue (half a page each).
			depth := uint32(128)
			if len(lay.cqPages) == 2 {
				depth = 256
			}
			cq, st := createRawCQ(t, v, depth, lay.cqPages, lay.cqRecord)
			if st != abi.StatusOK {
				t.Fatalf("CREATE_CQ: got %v, want OK (overlap is accepted)", st)
			}
			q, st := createRawQP(t, v, rawQPSpec{cq: cq.num, sqPages: lay.sqPages, rqPages: lay.rqPages, record: lay.qpRecord})
			if st != abi.StatusOK {
				t.Fatalf("CREATE_QP: got %v, want OK (overlap is accepted)", st)
			}
			wq := newPeerQP(t, w)
			q.connect(t, w.gid, wq.Num(), 0)
			if err := wq.ConnectRC(v.gid, q.num, 0, abi.AccessAll&^abi.AccessLocalWrite); err != nil {
				t.Fatal(err)
			}
			// Traffic on the hostile layout, in rounds of fewer WQEs than
			// the depth; the CQ drained between rounds, as a driver does.
			for round := range 3 {
				for i := range 12 {
					q.post(t, wqe(abi.SendWQE{WRID: uint64(100*round + i), Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
						NumSGE: 1, RemoteAddr: w.mr.Addr + uint64(64*i), RKey: w.mr.RKey},
						abi.SGE{Addr: v.mr.Addr, Length: 64, LKey: v.mr.LKey}))
				}
				if !lay.engineIdle {
					// The driver cannot trust its NO_NOTIFY flag: it kicks
					// anyway and waits for the round's completions (pi is in
					// the intact record) before it posts the next round.
					if err := v.ctx.Transport().Notify(q.doorbell); err != nil {
						t.Fatal(err)
					}
					cq.waitPI(t, uint32(12*(round+1)))
					continue
				}
				// The live QP of the same doorbell queue completing a
				// verified write means the engine went over the hostile QP
				// after these posts; then it must go to sleep: an engine
				// caught in a loop on the hostile layout never does.
				verifiedWrite(t, v, w, byte(round))
				waitIdle(t, v, q.doorbell)
				cq.cqes(t)
			}
			if dv, ok := r.d.Device("dev0"); ok {
				in := dv.Info()
				t.Logf("hostile device after the traffic: %d bytes moved, %d errors (%d ring errors), %d events lost",
					in.BytesMoved, in.Errors, in.RingErrors, in.EventsLost)
			}
			r.bystanders(t, byte(0x70+ci))
			// Whatever the hostile device's rings look like now, it is
			// released completely when its front-end leaves, and a new
			// one gets a working device.
			v.ctx.Close()
			v.f.Close()
			waitReleased(t, r.d, "dev0")
			verifiedWrite(t, openAndConnect(t, r.socks[0], w), w, 0x7f)
			noRingErrors(t, r.d, "dev1", "dev2")
		})
	}
}

// ---- 5. doorbells for destroyed QPs ----

// TestDoorbellDestroyedQP: after DESTROY_QP the driver keeps writing WQEs
// into the old ring, bumps the old record's producer index and rings the
// doorbell; it also destroys a QP whose head WQE waits for an RNR retry.
// Nothing of the destroyed QPs runs again (no CQE, no byte moved), their
// pins are released, commands naming them answer NOT_FOUND, the peer's
// requests to them fail with RETRY_EXC_ERR, and the device's live QP on
// the same doorbell queue, the bystanders and the daemon go on.
func TestDoorbellDestroyedQP(t *testing.T) {
	r := newRig(t, frontend.Config{MemorySize: 16 << 20, QueueSize: 64})
	v, w := r.v, r.w
	r.link(t)
	cq, st := createRawCQ(t, v, 64, nil, 0)
	if st != abi.StatusOK {
		t.Fatal(st)
	}
	dv, _ := r.d.Device("dev0")
	pinnedBefore := dv.Info().PinnedBytes

	// q1 works, then is destroyed. q2's SEND waits for an RNR retry (w
	// posts no receive, rnr_retry 7 is forever) when it is destroyed.
	wq1, wq2 := newPeerQP(t, w), newPeerQP(t, w)
	q1, st := createRawQP(t, v, rawQPSpec{cq: cq.num})
	if st != abi.StatusOK {
		t.Fatal(st)
	}
	q2, st := createRawQP(t, v, rawQPSpec{cq: cq.num})
	if st != abi.StatusOK {
		t.Fatal(st)
	}
	for _, c := range []struct {
		q  *rawQP
		wq *verbs.QP
	}{{q1, wq1}, {q2, wq2}} {
		c.q.connect(t, w.gid, c.wq.Num(), 7)
		if err := c.wq.ConnectRC(v.gid, c.q.num, 0, abi.AccessAll&^abi.AccessLocalWrite); err != nil {
			t.Fatal(err)
		}
	}
	write := func(id uint64, off uint64) []byte {
		return wqe(abi.SendWQE{WRID: id, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, NumSGE: 1,
			RemoteAddr: w.mr.Addr + off, RKey: w.mr.RKey}, abi.SGE{Addr: v.mr.Addr, Length: 256, LKey: v.mr.LKey})
	}
	fill(v.mr.Bytes()[:256], 0x11)
	sent := append([]byte(nil), v.mr.Bytes()[:256]...)
	q1.post(t, write(1, 0))
	if got := cq.waitCQEs(t, 1); got[0].WRID != 1 || got[0].Status != abi.WCSuccess {
		t.Fatalf("q1 before destroy: got %+v", got)
	}
	q2.post(t, wqe(abi.SendWQE{WRID: 2, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, NumSGE: 1},
		abi.SGE{Addr: v.mr.Addr, Length: 16, LKey: v.mr.LKey}))
	// Once the live QP's write on the same doorbell queue completed, the
	// engine has been over q2: its SEND was tried and waits for a receive.
	verifiedWrite(t, v, w, 0x20)
	for _, q := range []*rawQP{q1, q2} {
		if st, _ := rawCmd(t, v, abi.CmdDestroyQP, abi.Marshal(&abi.Handle{Handle: q.num}), 0); st != abi.StatusOK {
			t.Fatalf("DESTROY_QP %#x: %v", q.num, st)
		}
	}
	dst := w.mr.Bytes()
	for i := range dst[4096:8192] {
		dst[4096+i] = 0xee
	}
	// The driver goes on using the dead QPs: WQEs into the old rings, the
	// old records' producer indices bumped (one far beyond the depth), and
	// doorbells rung again and again.
	for i := range 20 {
		q1.post(t, write(uint64(100+i), 4096))
	}
	q2.sqPI += 1000
	q2.ring(t)
	// A receive for q2's old SEND now: nobody may deliver it.
	if err := wq2.PostRecv(verbs.RecvWR{WRID: 9, SGL: []abi.SGE{w.mr.SGE(4096, 64)}}); err != nil {
		t.Fatal(err)
	}
	// The live QP on the same doorbell queue runs after the kicks: by the
	// time its write completes, the engine has been over the queue.
	verifiedWrite(t, v, w, 0x21)
	if got := cq.cqes(t); len(got) != 0 {
		t.Fatalf("destroyed QPs completed WRs: %+v", got)
	}
	for i, b := range dst[4096:8192] {
		if b != 0xee {
			t.Fatalf("byte %d written by a destroyed QP", 4096+i)
		}
	}
	if !bytes.Equal(dst[:256], sent) {
		t.Fatal("q1's write before the destroy did not land")
	}
	// Commands naming them.
	for _, q := range []*rawQP{q1, q2} {
		h := abi.Marshal(&abi.Handle{Handle: q.num})
		for _, c := range []struct {
			op      abi.Opcode
			payload []byte
			resp    int
		}{
			{abi.CmdDestroyQP, h, 0},
			{abi.CmdQueryQP, h, 96},
			{abi.CmdModifyQP, abi.Marshal(&abi.QPAttr{QPN: q.num, AttrMask: abi.QPAttrState, QPState: abi.QPSErr}), 0},
		} {
			if st, _ := rawCmd(t, v, c.op, c.payload, c.resp); st != abi.StatusNotFound {
				t.Fatalf("%v of destroyed QP %#x: got %v, want NOT_FOUND", c.op, q.num, st)
			}
		}
	}
	// The peer's requests to a destroyed QP: RETRY_EXC_ERR.
	if err := wq1.PostSend(verbs.SendWR{WRID: 5, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{w.mr.SGE(0, 64)}, RemoteAddr: v.mr.Addr, RKey: v.mr.RKey}); err != nil {
		t.Fatal(err)
	}
	if wc := pollOne(t, w.cq); wc.WRID != 5 || wc.Status != abi.WCRetryExcErr {
		t.Fatalf("peer's write to a destroyed QP: got %+v, want RETRY_EXC_ERR (12)", wc)
	}
	// The rings' pins went with the QPs.
	if st, _ := rawCmd(t, v, abi.CmdDestroyCQ, abi.Marshal(&abi.Handle{Handle: cq.num}), 0); st != abi.StatusOK {
		t.Fatalf("DESTROY_CQ: %v", st)
	}
	if p := dv.Info().PinnedBytes; p >= pinnedBefore {
		t.Fatalf("pinned bytes %d after destroying the QPs and the CQ, want below %d", p, pinnedBefore)
	}
	r.bystanders(t, 0x22)
	noRingErrors(t, r.d, "dev0")
	// Well after q2's RNR timer would have fired: its SEND never reached
	// the receive posted for it, and nothing completed on the old CQ.
	var wc [16]verbs.WC
	n, err := w.cq.Poll(wc[:])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range wc[:n] {
		if c.WRID == 9 {
			t.Fatalf("a destroyed QP's SEND was delivered: %+v", c)
		}
	}
}
