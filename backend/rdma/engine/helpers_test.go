package engine

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Test guests: memfd memory in two GPA-adjacent regions (so ranges can
// cross a region boundary), a bump page allocator, and a driver that
// writes WQEs and records the way a guest's verbs library does.

const guestBase = 0x100000

type guest struct {
	mem  *memmap.Memory
	tbl  *memmap.Table // a reference held for the test's own accesses
	next abi.GPA
	end  abi.GPA
}

func newGuest(tb testing.TB, name string, size uint64) *guest {
	tb.Helper()
	return newGuestFds(tb, name, size, nil)
}

// newGuestFds is newGuest calling keep, if not nil, with each region's
// memfd before it is mapped (the mapping takes ownership of fd).
func newGuestFds(tb testing.TB, name string, size uint64, keep func(i, fd int)) *guest {
	tb.Helper()
	half := size / 2
	var regions []*memmap.Region
	for i := range 2 {
		fd, err := memmap.NewMemfd(name, half)
		if err != nil {
			tb.Fatalf("NewMemfd: %v", err)
		}
		if keep != nil {
			keep(i, fd)
		}
		r, err := memmap.MapRegion(fd, memmap.RegionSpec{
			GuestAddr: abi.GPA(guestBase + uint64(i)*half), Size: half,
			UserAddr: memmap.UVA(0x7f0000000000 + uint64(i)*half),
		})
		if err != nil {
			tb.Fatalf("MapRegion: %v", err)
		}
		regions = append(regions, r)
	}
	t, err := memmap.NewTable(regions)
	if err != nil {
		tb.Fatalf("NewTable: %v", err)
	}
	for _, r := range regions {
		r.Release()
	}
	m := memmap.NewMemory()
	m.Swap(t)
	g := &guest{mem: m, tbl: m.Acquire(), next: guestBase, end: abi.GPA(guestBase + size)}
	tb.Cleanup(func() {
		g.tbl.Release()
		m.Close()
	})
	return g
}

// pages allocates n contiguous pages.
func (g *guest) pages(tb testing.TB, n int) []abi.GPA {
	tb.Helper()
	ps := make([]abi.GPA, n)
	for i := range ps {
		if g.next >= g.end {
			tb.Fatalf("guest memory exhausted")
		}
		ps[i] = g.next
		g.next += abi.PageSize
	}
	return ps
}

// scattered allocates n pages that are not guest-physically contiguous, in
// descending address order.
func (g *guest) scattered(tb testing.TB, n int) []abi.GPA {
	all := g.pages(tb, 2*n)
	ps := make([]abi.GPA, n)
	for i := range ps {
		ps[i] = all[2*(n-1-i)]
	}
	return ps
}

// write copies b to guest-physical gpa (may cross regions).
func (g *guest) write(tb testing.TB, gpa abi.GPA, b []byte) {
	tb.Helper()
	if err := g.tbl.ForEach(gpa, uint64(len(b)), func(v []byte) error {
		b = b[copy(v, b):]
		return nil
	}); err != nil {
		tb.Fatalf("write %#x: %v", gpa, err)
	}
}

func (g *guest) slice(tb testing.TB, gpa abi.GPA, n uint64) []byte {
	tb.Helper()
	s, err := g.tbl.Slice(gpa, n)
	if err != nil {
		tb.Fatalf("slice %#x+%d: %v", gpa, n, err)
	}
	return s
}

// mrWrite and mrRead access an MR's bytes by IOVA.
func (g *guest) mrWrite(tb testing.TB, m *MR, addr uint64, b []byte) {
	tb.Helper()
	if err := m.Range(g.tbl, addr, uint64(len(b)), func(v []byte) error {
		b = b[copy(v, b):]
		return nil
	}); err != nil {
		tb.Fatalf("mr write: %v", err)
	}
}

func (g *guest) mrRead(tb testing.TB, m *MR, addr, n uint64) []byte {
	tb.Helper()
	out := make([]byte, 0, n)
	if err := m.Range(g.tbl, addr, n, func(v []byte) error {
		out = append(out, v...)
		return nil
	}); err != nil {
		tb.Fatalf("mr read: %v", err)
	}
	return out
}

// newMR registers an MR over fresh pages (scattered if asked).
func (g *guest) newMR(tb testing.TB, key, pd, access uint32, iova, length uint64, scattered bool) *MR {
	n := int((iova%abi.PageSize + length + abi.PageSize - 1) / abi.PageSize)
	var ps []abi.GPA
	if scattered {
		ps = g.scattered(tb, n)
	} else {
		ps = g.pages(tb, n)
	}
	return NewMR(key, pd, access, iova, length, ps, abi.PageShift)
}

// node is one device with one QP, its CQs and an MR, seen from its guest.
type node struct {
	g   *guest
	d   *RNIC
	scq *CQ
	rcq *CQ
	qp  *QP
	mr  *MR // key mrKey, PD 1, every access, iova mrIOVA, mrLen bytes, scattered pages

	evMu   sync.Mutex
	events []abi.Event
	wakes  atomic.Int64
}

const (
	mrKey   = 0x1234_5601
	mrIOVA  = 0x7000_0000_0ff0 // not page aligned
	mrLen   = 64 << 10
	testPD  = 1
	cqDepth = 64
	qpDepth = 16
	qpSGE   = 4
	qpInl   = 64
)

func (n *node) takeEvents() []abi.Event {
	n.evMu.Lock()
	defer n.evMu.Unlock()
	ev := n.events
	n.events = nil
	return ev
}

// newDevice is a device alone on its fabric, attached to a 1 MiB guest
// without an event sink: for tests of one CQ or QP at a time.
func newDevice(tb testing.TB) (*guest, *RNIC) {
	g := newGuest(tb, "guest", 1<<20)
	d := NewRNIC(NewFabric(), [16]byte{0xfe, 0x80, 15: 1}, nil)
	d.Attach(g.mem, nil, nil)
	return g, d
}

func newCQ(tb testing.TB, g *guest, d *RNIC, num, depth uint32) *CQ {
	rec := g.pages(tb, 1)[0]
	np := (int(depth)*abi.CQESize + abi.PageSize - 1) / abi.PageSize
	c := &CQ{Num: num, Dev: d, Ring: Ring{Pages: g.scattered(tb, np), Depth: depth, Stride: abi.CQESize}, Record: rec}
	d.AddCQ(c)
	return c
}

type qpOpts struct {
	sqDepth, rqDepth uint32
	maxSGE, inl      uint32
	sigAll           bool
	guestSize        uint64 // 0: 8 MiB
	sharedCQ         bool   // newNodeIn: one CQ for both queues (node.rcq == node.scq)
	ud               bool   // a UD QP
	gsi              bool   // the device's GSI QP (UD too)
	srq              *SRQ   // the QP's SRQ (then it has no receive queue)
}

func newQP(tb testing.TB, g *guest, d *RNIC, num uint32, scq, rcq *CQ, o qpOpts) *QP {
	if o.sqDepth == 0 {
		o.sqDepth, o.rqDepth, o.maxSGE, o.inl = qpDepth, qpDepth, qpSGE, qpInl
	}
	sqStride := uint32(128)
	for 64+16*o.maxSGE > sqStride || 64+o.inl > sqStride {
		sqStride *= 2
	}
	rqStride := uint32(32)
	for 16+16*o.maxSGE > rqStride {
		rqStride *= 2
	}
	pages := func(depth, stride uint32) int {
		return int((depth*stride + abi.PageSize - 1) / abi.PageSize)
	}
	q := &QP{
		Num: num, PD: testPD, Dev: d, SendCQ: scq, RecvCQ: rcq,
		SQ:         Ring{Pages: g.scattered(tb, pages(o.sqDepth, sqStride)), Depth: o.sqDepth, Stride: sqStride},
		Record:     g.pages(tb, 1)[0] + 16,
		MaxSendSGE: o.maxSGE, MaxInline: o.inl, SigAll: o.sigAll,
		UD: o.ud || o.gsi, GSI: o.gsi, SRQ: o.srq,
	}
	if o.srq == nil {
		q.RQ = Ring{Pages: g.scattered(tb, pages(o.rqDepth, rqStride)), Depth: o.rqDepth, Stride: rqStride}
		q.MaxRecvSGE = o.maxSGE
	}
	addQP(d, q)
	return q
}

func newNode(tb testing.TB, f *Fabric, gid byte, qpn uint32, o qpOpts) *node {
	tb.Helper()
	size := o.guestSize
	if size == 0 {
		size = 8 << 20
	}
	return newNodeIn(tb, f, newGuest(tb, "guest", size), gid, qpn, o, 0)
}

// newNodeIn builds a node on guest g: a device registered with f, its send
// and receive CQs and QP qpn in g's memory, and the test MR, allocated from
// mrAt when that is not zero (from g's next free page otherwise).
func newNodeIn(tb testing.TB, f *Fabric, g *guest, gid byte, qpn uint32, o qpOpts, mrAt abi.GPA) *node {
	tb.Helper()
	n := &node{g: g}
	n.d = NewRNIC(f, [16]byte{0xfe, 0x80, 15: gid}, nil)
	if err := f.Register(n.d); err != nil {
		tb.Fatalf("Register: %v", err)
	}
	n.d.Attach(n.g.mem, func(ev abi.Event) {
		n.evMu.Lock()
		n.events = append(n.events, ev)
		n.evMu.Unlock()
	}, func(int) { n.wakes.Add(1) })
	n.scq = newCQ(tb, n.g, n.d, 0x11, cqDepth)
	n.rcq = n.scq
	if !o.sharedCQ {
		n.rcq = newCQ(tb, n.g, n.d, 0x12, cqDepth)
	}
	n.qp = newQP(tb, n.g, n.d, qpn, n.scq, n.rcq, o)
	if mrAt != 0 {
		n.g.next = mrAt
	}
	n.mr = n.g.newMR(tb, mrKey, testPD, abi.AccessAll, mrIOVA, mrLen, true)
	addMR(n.d, n.mr)
	return n
}

// connect moves q through INIT and RTR to RTS towards (peer, dest).
func connect(tb testing.TB, q *QP, peer *RNIC, dest, access, minRNR, rnrRetry uint32) {
	tb.Helper()
	connectFrom(tb, q, 0, peer, dest, access, minRNR, rnrRetry)
}

// connectFrom is connect from the GID at sgidIndex of q's device.
func connectFrom(tb testing.TB, q *QP, sgidIndex uint32, peer *RNIC, dest, access, minRNR, rnrRetry uint32) {
	tb.Helper()
	steps := []abi.QPAttr{
		{QPN: q.Num, QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags,
			PortNum: 1, QPAccessFlags: access},
		{QPN: q.Num, QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrAV | abi.QPAttrPathMTU | abi.QPAttrDestQPN |
			abi.QPAttrRQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrMinRNRTimer,
			DGID: peer.GID(), SGIDIndex: sgidIndex, PathMTU: abi.MTU4096, DestQPNum: dest, MinRNRTimer: minRNR, MaxDestRdAtomic: 16},
		{QPN: q.Num, QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout | abi.QPAttrRetryCnt |
			abi.QPAttrRNRRetry | abi.QPAttrMaxQPRdAtomic, RNRRetry: rnrRetry, Timeout: 14, RetryCnt: 7, MaxRdAtomic: 16},
	}
	for _, s := range steps {
		if st := q.Modify(s); st != abi.StatusOK {
			tb.Fatalf("modify %v to %d: got %v, want OK", q, s.QPState, st)
		}
	}
}

// pair is two connected nodes: a (QP 0x100) and b (QP 0x200).
type pair struct {
	f    *Fabric
	a, b *node
}

type pairOpts struct {
	qp       qpOpts
	accessB  uint32 // b's qp_access_flags (0: all remote rights)
	minRNR   uint32 // b's min_rnr_timer (0 → 1: 10 µs)
	rnrRetry uint32
}

func newPair(tb testing.TB, o pairOpts) *pair {
	tb.Helper()
	f := NewFabric()
	p := &pair{f: f, a: newNode(tb, f, 1, 0x100, o.qp), b: newNode(tb, f, 2, 0x200, o.qp)}
	access := o.accessB
	if access == 0 {
		access = abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic
	}
	minRNR := o.minRNR
	if minRNR == 0 {
		minRNR = 1
	}
	connect(tb, p.a.qp, p.b.d, p.b.qp.Num, abi.AccessRemoteWrite|abi.AccessRemoteRead|abi.AccessRemoteAtomic, minRNR, o.rnrRetry)
	connect(tb, p.b.qp, p.a.d, p.a.qp.Num, access, minRNR, o.rnrRetry)
	return p
}

// poll runs both engines until neither has work (bounded).
func (p *pair) poll(tb testing.TB) {
	tb.Helper()
	for range 1000 {
		wa, _ := p.a.d.Poll(0, p.a.g.tbl)
		wb, _ := p.b.d.Poll(0, p.b.g.tbl)
		if !wa && !wb {
			return
		}
	}
	tb.Fatalf("engines still busy after 1000 rounds")
}

func encodeSend(b []byte, w *abi.SendWQE) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], w.WRID)
	b[8], b[9] = w.Opcode, w.Flags
	le.PutUint16(b[10:], w.NumSGE)
	le.PutUint32(b[12:], w.ImmData)
	le.PutUint64(b[16:], w.RemoteAddr)
	le.PutUint32(b[24:], w.RKey)
	le.PutUint32(b[28:], w.InlineLen)
	le.PutUint64(b[32:], w.CompareAdd)
	le.PutUint64(b[40:], w.Swap)
	le.PutUint32(b[48:], w.AH)
	le.PutUint32(b[52:], w.RemoteQPN)
	le.PutUint32(b[56:], w.RemoteQKey)
	le.PutUint32(b[60:], w.Reserved)
}

func encodeSGE(b []byte, s abi.SGE) {
	binary.LittleEndian.PutUint64(b[0:], s.Addr)
	binary.LittleEndian.PutUint32(b[8:], s.Length)
	binary.LittleEndian.PutUint32(b[12:], s.LKey)
}

func (n *node) record(tb testing.TB) []byte { return n.g.slice(tb, n.qp.Record, abi.QPRecordSize) }

// postSend writes a send WQE at sq_pi and advances sq_pi, as a driver does.
func (n *node) postSend(tb testing.TB, w abi.SendWQE, sges []abi.SGE, inline []byte) {
	postSendOn(tb, n.g, n.qp, w, sges, inline)
}

// postSendOn is postSend on QP q of guest g.
func postSendOn(tb testing.TB, g *guest, q *QP, w abi.SendWQE, sges []abi.SGE, inline []byte) {
	tb.Helper()
	rec := g.slice(tb, q.Record, abi.QPRecordSize)
	pi := abi.LoadUint32(rec, abi.QPRecordSQPI)
	slot, err := q.SQ.Slot(g.tbl, pi)
	if err != nil {
		tb.Fatalf("sq slot: %v", err)
	}
	clear(slot)
	if w.NumSGE == 0 && len(sges) > 0 {
		w.NumSGE = uint16(len(sges))
	}
	if inline != nil {
		w.Flags |= abi.WRFlagInline
		w.InlineLen = uint32(len(inline))
	}
	encodeSend(slot, &w)
	for i, s := range sges {
		encodeSGE(slot[64+16*i:], s)
	}
	copy(slot[64:], inline)
	abi.StoreUint32(rec, abi.QPRecordSQPI, pi+1)
}

// postRecv writes a receive WQE at rq_pi and advances rq_pi.
func (n *node) postRecv(tb testing.TB, wrID uint64, sges []abi.SGE) {
	rec := n.record(tb)
	pi := abi.LoadUint32(rec, abi.QPRecordRQPI)
	slot, err := n.qp.RQ.Slot(n.g.tbl, pi)
	if err != nil {
		tb.Fatalf("rq slot: %v", err)
	}
	clear(slot)
	binary.LittleEndian.PutUint64(slot[0:], wrID)
	binary.LittleEndian.PutUint16(slot[8:], uint16(len(sges)))
	for i, s := range sges {
		encodeSGE(slot[16+16*i:], s)
	}
	abi.StoreUint32(rec, abi.QPRecordRQPI, pi+1)
}

// cqes consumes every CQE of c, as a driver does.
func (n *node) cqes(tb testing.TB, c *CQ) []abi.CQE {
	tb.Helper()
	rec := n.g.slice(tb, c.Record, abi.CQRecordSize)
	pi := abi.LoadUint32(rec, abi.CQRecordPI)
	ci := abi.LoadUint32(rec, abi.CQRecordCI)
	var out []abi.CQE
	for k := 0; ci != pi && k < int(c.Ring.Depth); k++ {
		slot, err := c.Ring.Slot(n.g.tbl, ci)
		if err != nil {
			tb.Fatalf("cq slot: %v", err)
		}
		var e abi.CQE
		if err := abi.Unmarshal(slot, &e); err != nil {
			tb.Fatalf("unmarshal cqe: %v", err)
		}
		out = append(out, e)
		ci++
	}
	abi.StoreUint32(rec, abi.CQRecordCI, ci)
	return out
}

// sge names bytes [off, off+n) of the node's MR.
func (n *node) sge(off uint64, length uint32) abi.SGE {
	return abi.SGE{Addr: mrIOVA + off, Length: length, LKey: mrKey}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
	return b
}

// want1 checks that cqes holds exactly one CQE matching want.
func want1(tb testing.TB, what string, cqes []abi.CQE, want abi.CQE) {
	tb.Helper()
	if len(cqes) != 1 {
		tb.Fatalf("%s: got %d CQEs %+v, want 1", what, len(cqes), cqes)
	}
	if cqes[0] != want {
		tb.Fatalf("%s: got CQE %+v, want %+v", what, cqes[0], want)
	}
}

var (
	errorsIs = errors.Is
	errorsAs = func(err error, target any) bool { return errors.As(err, target) }
)

// addMR registers m on d, and its PD first if d has none of that number
// (engine tests build objects without the control path).
func addMR(d *RNIC, m *MR) {
	if !d.HasPD(m.PD) {
		d.AddPD(m.PD)
	}
	if err := d.AddMR(m); err != nil {
		panic(err)
	}
}

// addQP is addMR for a QP.
func addQP(d *RNIC, q *QP) {
	if !d.HasPD(q.PD) {
		d.AddPD(q.PD)
	}
	if err := d.AddQP(q); err != nil {
		panic(err)
	}
}
