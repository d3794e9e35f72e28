package rdma

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Guest-physical layout of the SRQ and QP tests (attachedMem's guest
// starts at GPA 0): records, then ring pages.
const (
	srqRecord = 0x1000
	srqRing   = 0x2000
	qpRecord  = 0x1100
	qpSQ      = 0x4000
	qpRQ      = 0x5000
	cqRecord  = 0x1200
	cqRing    = 0x6000
)

func mustCmd(t *testing.T, d *Device, tbl *memmap.Table, op abi.Opcode, req []byte) []byte {
	t.Helper()
	out, st := d.command(op, req, tbl)
	if st != abi.StatusOK {
		t.Fatalf("%v: got %v, want OK", op, st)
	}
	return out
}

func handleOf(t *testing.T, out []byte) uint32 {
	t.Helper()
	var h abi.Handle
	if err := abi.Unmarshal(out, &h); err != nil {
		t.Fatal(err)
	}
	return h.Handle
}

func inlinePages(pages ...uint64) []byte {
	var b []byte
	for _, p := range pages {
		b = binary.LittleEndian.AppendUint64(b, p)
	}
	return b
}

// srqReq is a valid CREATE_SRQ request (4 WQEs of one SGE) with its
// inline page list, changed by mod.
func srqReq(pdn uint32, mod func(*abi.CreateSRQ)) []byte {
	c := abi.CreateSRQ{PDN: pdn, MaxWR: 4, MaxSGE: 1, WQEShift: 5, Record: srqRecord, NPages: 1}
	if mod != nil {
		mod(&c)
	}
	return append(abi.Marshal(&c), inlinePages(srqRing)...)
}

// qpReq is a valid 88-byte CREATE_QP request with its inline page list:
// RC with a receive queue, or (srqn ≠ 0) with the SRQ srqn and no
// receive queue; mod changes it.
func qpReq(pdn, cqn, srqn uint32, mod func(*abi.CreateQP)) []byte {
	c := abi.CreateQP{PDN: pdn, SendCQN: cqn, RecvCQN: cqn, QPType: abi.QPTypeRC, MaxSendWR: 4, MaxRecvWR: 4,
		MaxSendSGE: 1, MaxRecvSGE: 1, SQWQEShift: 7, RQWQEShift: 5, Record: qpRecord, SQNPages: 1, RQNPages: 1}
	if srqn != 0 {
		c.Flags, c.SRQN = abi.QPFlagSRQ, srqn
		c.MaxRecvWR, c.MaxRecvSGE, c.RQWQEShift, c.RQNPages = 0, 0, 0, 0
	}
	if mod != nil {
		mod(&c)
	}
	pages := []uint64{qpSQ}
	for range c.RQNPages {
		pages = append(pages, qpRQ)
	}
	return append(abi.Marshal(&c), inlinePages(pages[:min(len(pages), int(c.SQNPages+c.RQNPages))]...)...)
}

// pdCQ creates a PD and a CQ.
func pdCQ(t *testing.T, d *Device, tbl *memmap.Table) (pdn, cqn uint32) {
	pdn = handleOf(t, mustCmd(t, d, tbl, abi.CmdCreatePD, nil))
	cq := append(abi.Marshal(&abi.CreateCQ{CQE: 64, NPages: 1, Record: cqRecord}), inlinePages(cqRing)...)
	cqn = handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateCQ, cq))
	return pdn, cqn
}

// TestSRQCommands checks CREATE_SRQ, MODIFY_SRQ, QUERY_SRQ and
// DESTROY_SRQ against docs/spec.md: every validation, the pins, the
// quota, and DESTROY_SRQ's BUSY while a QP uses the SRQ.
func TestSRQCommands(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	pdn, cqn := pdCQ(t, d, tbl)
	pinned := d.Stats().Pin.PinnedBytes

	bad := []struct {
		name string
		req  []byte
		want abi.Status
	}{
		{"short", srqReq(pdn, nil)[:40], abi.StatusInvalid},
		{"reserved", srqReq(pdn, func(c *abi.CreateSRQ) { c.Reserved = 1 }), abi.StatusInvalid},
		{"no pd", srqReq(pdn+1, nil), abi.StatusNotFound},
		{"max_wr not a power of two", srqReq(pdn, func(c *abi.CreateSRQ) { c.MaxWR = 3 }), abi.StatusInvalid},
		{"max_wr zero", srqReq(pdn, func(c *abi.CreateSRQ) { c.MaxWR = 0 }), abi.StatusInvalid},
		{"max_wr above max_qp_wr", srqReq(pdn, func(c *abi.CreateSRQ) { c.MaxWR = 128 }), abi.StatusInvalid},
		{"max_sge zero", srqReq(pdn, func(c *abi.CreateSRQ) { c.MaxSGE = 0 }), abi.StatusInvalid},
		{"max_sge above the device's", srqReq(pdn, func(c *abi.CreateSRQ) { c.MaxSGE, c.WQEShift = 5, 7 }), abi.StatusInvalid},
		{"limit above max_wr", srqReq(pdn, func(c *abi.CreateSRQ) { c.SRQLimit = 5 }), abi.StatusInvalid},
		{"stride too small", srqReq(pdn, func(c *abi.CreateSRQ) { c.MaxSGE = 2 }), abi.StatusInvalid},
		{"wqe_shift 4", srqReq(pdn, func(c *abi.CreateSRQ) { c.WQEShift = 4 }), abi.StatusInvalid},
		{"wqe_shift 13", srqReq(pdn, func(c *abi.CreateSRQ) { c.WQEShift = 13 }), abi.StatusInvalid},
		{"doorbell queue", srqReq(pdn, func(c *abi.CreateSRQ) { c.DoorbellQueue = 99 }), abi.StatusInvalid},
		{"npages", srqReq(pdn, func(c *abi.CreateSRQ) { c.NPages = 2 }), abi.StatusInvalid},
		{"record zero", srqReq(pdn, func(c *abi.CreateSRQ) { c.Record = 0 }), abi.StatusInvalid},
		{"record misaligned", srqReq(pdn, func(c *abi.CreateSRQ) { c.Record = srqRecord + 4 }), abi.StatusInvalid},
		{"record outside memory", srqReq(pdn, func(c *abi.CreateSRQ) { c.Record = 1 << 30 }), abi.StatusFault},
		{"page misaligned", append(abi.Marshal(&abi.CreateSRQ{PDN: pdn, MaxWR: 4, MaxSGE: 1, WQEShift: 5, Record: srqRecord, NPages: 1}), inlinePages(srqRing+8)...), abi.StatusInvalid},
		{"page list length", append(srqReq(pdn, nil), 0, 0, 0, 0, 0, 0, 0, 0), abi.StatusInvalid},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			if _, st := d.command(abi.CmdCreateSRQ, c.req, tbl); st != c.want {
				t.Fatalf("CREATE_SRQ: got %v, want %v", st, c.want)
			}
			if s := d.Stats(); s.SRQs != 0 || s.Pin.PinnedBytes != pinned {
				t.Fatalf("a failed CREATE_SRQ left %d SRQs, %d pinned bytes (want 0, %d)", s.SRQs, s.Pin.PinnedBytes, pinned)
			}
		})
	}

	rec, err := tbl.Slice(srqRecord, abi.SRQRecordSize)
	if err != nil {
		t.Fatal(err)
	}
	abi.StoreUint32(rec, abi.SRQRecordNotify, 7)
	srqn := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateSRQ, srqReq(pdn, func(c *abi.CreateSRQ) { c.SRQLimit = 3 })))
	if got := abi.LoadUint32(rec, abi.SRQRecordNotify); got != 0 {
		t.Errorf("notify after CREATE_SRQ: got %d, want 0", got)
	}
	if s := d.Stats(); s.SRQs != 1 || s.Pin.PinnedBytes <= pinned {
		t.Fatalf("after CREATE_SRQ: %d SRQs, %d pinned bytes (was %d)", s.SRQs, s.Pin.PinnedBytes, pinned)
	}
	query := func() abi.SRQAttr {
		t.Helper()
		var a abi.SRQAttr
		if err := abi.Unmarshal(mustCmd(t, d, tbl, abi.CmdQuerySRQ, abi.Marshal(&abi.Handle{Handle: srqn})), &a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := query(); a != (abi.SRQAttr{SRQN: srqn, MaxWR: 4, SRQLimit: 3}) {
		t.Fatalf("QUERY_SRQ: got %+v", a)
	}
	if _, st := d.command(abi.CmdQuerySRQ, abi.Marshal(&abi.Handle{Handle: srqn + 1}), tbl); st != abi.StatusNotFound {
		t.Errorf("QUERY_SRQ of no SRQ: got %v, want NOT_FOUND", st)
	}
	if _, st := d.command(abi.CmdQuerySRQ, abi.Marshal(&abi.Handle{Handle: srqn, Reserved: 1}), tbl); st != abi.StatusInvalid {
		t.Errorf("QUERY_SRQ with reserved: got %v, want INVALID", st)
	}

	modify := []struct {
		name string
		a    abi.SRQAttr
		want abi.Status
	}{
		{"unknown mask bit", abi.SRQAttr{SRQN: srqn, AttrMask: 4}, abi.StatusInvalid},
		{"resize", abi.SRQAttr{SRQN: srqn, AttrMask: abi.SRQAttrMaxWR, MaxWR: 8}, abi.StatusUnsupported},
		{"limit above max_wr", abi.SRQAttr{SRQN: srqn, AttrMask: abi.SRQAttrLimit, SRQLimit: 5}, abi.StatusInvalid},
		{"no srq", abi.SRQAttr{SRQN: srqn + 1, AttrMask: abi.SRQAttrLimit, SRQLimit: 1}, abi.StatusNotFound},
		{"limit", abi.SRQAttr{SRQN: srqn, AttrMask: abi.SRQAttrLimit, SRQLimit: 2}, abi.StatusOK},
	}
	for _, c := range modify {
		if _, st := d.command(abi.CmdModifySRQ, abi.Marshal(&c.a), tbl); st != c.want {
			t.Errorf("MODIFY_SRQ %s: got %v, want %v", c.name, st, c.want)
		}
	}
	if a := query(); a.SRQLimit != 2 {
		t.Errorf("QUERY_SRQ after MODIFY_SRQ LIMIT 2: got limit %d", a.SRQLimit)
	}

	// The quota: max_srq.
	d.conf.MaxSRQ = 1
	if _, st := d.command(abi.CmdCreateSRQ, srqReq(pdn, nil), tbl); st != abi.StatusNoResources {
		t.Errorf("CREATE_SRQ beyond max_srq: got %v, want NO_RESOURCES", st)
	}

	// A QP with the SRQ holds it.
	qpn := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateQP, qpReq(pdn, cqn, srqn, nil)))
	destroy := abi.Marshal(&abi.Handle{Handle: srqn})
	if _, st := d.command(abi.CmdDestroySRQ, destroy, tbl); st != abi.StatusBusy {
		t.Fatalf("DESTROY_SRQ while a QP uses it: got %v, want BUSY", st)
	}
	if _, st := d.command(abi.CmdDestroyPD, abi.Marshal(&abi.Handle{Handle: pdn}), tbl); st != abi.StatusBusy {
		t.Fatalf("DESTROY_PD of the SRQ's PD: got %v, want BUSY", st)
	}
	mustCmd(t, d, tbl, abi.CmdDestroyQP, abi.Marshal(&abi.Handle{Handle: qpn}))
	mustCmd(t, d, tbl, abi.CmdDestroySRQ, destroy)
	if _, st := d.command(abi.CmdDestroySRQ, destroy, tbl); st != abi.StatusNotFound {
		t.Fatalf("DESTROY_SRQ twice: got %v, want NOT_FOUND", st)
	}
	if s := d.Stats(); s.SRQs != 0 || s.Pin.PinnedBytes != pinned {
		t.Fatalf("after DESTROY_SRQ: %d SRQs, %d pinned bytes (want 0, %d)", s.SRQs, s.Pin.PinnedBytes, pinned)
	}

	// A reset destroys SRQs after the QPs that use them.
	d.conf.MaxSRQ = 8
	srqn = handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateSRQ, srqReq(pdn, nil)))
	mustCmd(t, d, tbl, abi.CmdCreateQP, qpReq(pdn, cqn, srqn, nil))
	d.Reset()
	if s := d.Stats(); s.SRQs+s.QPs != 0 || s.Pin.PinnedBytes != 0 {
		t.Fatalf("after reset: %+v", s)
	}
}

// TestCreateQPSRQAndUD checks CREATE_QP's new fields: the 88-byte and
// 80-byte requests, SRQ with srqn (RQ fields zero), and qp_type UD.
func TestCreateQPSRQAndUD(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	pdn, cqn := pdCQ(t, d, tbl)
	srqn := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateSRQ, srqReq(pdn, nil)))
	v1 := func(req []byte) []byte { // the 80-byte layout: srqn and reserved cut out
		return append(append([]byte(nil), req[:abi.CreateQPV1Size]...), req[abi.CreateQPV1Size+8:]...)
	}
	cases := []struct {
		name string
		req  []byte
		want abi.Status
	}{
		{"rc", qpReq(pdn, cqn, 0, nil), abi.StatusOK},
		{"rc 80 bytes", v1(qpReq(pdn, cqn, 0, nil)), abi.StatusOK},
		{"rc 80 bytes indirect", v1(qpReq(pdn, cqn, 0, func(c *abi.CreateQP) { c.PageList = 0x7000 }))[:abi.CreateQPV1Size], abi.StatusOK},
		{"srq", qpReq(pdn, cqn, srqn, nil), abi.StatusOK},
		{"srq with rq_notify", qpReq(pdn, cqn, srqn, func(c *abi.CreateQP) { c.Flags |= abi.QPFlagRQNotify }), abi.StatusOK},
		{"ud", qpReq(pdn, cqn, 0, func(c *abi.CreateQP) { c.QPType = abi.QPTypeUD }), abi.StatusOK},
		{"ud with srq", qpReq(pdn, cqn, srqn, func(c *abi.CreateQP) { c.QPType = abi.QPTypeUD }), abi.StatusOK},
		{"srq 80 bytes", v1(qpReq(pdn, cqn, srqn, nil)), abi.StatusInvalid},
		{"srqn without srq", qpReq(pdn, cqn, 0, func(c *abi.CreateQP) { c.SRQN = srqn }), abi.StatusInvalid},
		{"reserved", qpReq(pdn, cqn, 0, func(c *abi.CreateQP) { c.Reserved = 1 }), abi.StatusInvalid},
		{"srq with max_recv_wr", qpReq(pdn, cqn, srqn, func(c *abi.CreateQP) { c.MaxRecvWR = 4 }), abi.StatusInvalid},
		{"srq with max_recv_sge", qpReq(pdn, cqn, srqn, func(c *abi.CreateQP) { c.MaxRecvSGE = 1 }), abi.StatusInvalid},
		{"srq with rq_wqe_shift", qpReq(pdn, cqn, srqn, func(c *abi.CreateQP) { c.RQWQEShift = 5 }), abi.StatusInvalid},
		{"srq with rq pages", qpReq(pdn, cqn, srqn, func(c *abi.CreateQP) { c.RQNPages = 1 }), abi.StatusInvalid},
		{"no srq", qpReq(pdn, cqn, srqn+1, nil), abi.StatusNotFound},
		{"unknown flag", qpReq(pdn, cqn, 0, func(c *abi.CreateQP) { c.Flags = 4 }), abi.StatusInvalid},
		{"uc", qpReq(pdn, cqn, 0, func(c *abi.CreateQP) { c.QPType = 3 }), abi.StatusUnsupported},
		{"length between", qpReq(pdn, cqn, 0, nil)[:84], abi.StatusInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := d.Stats()
			out, st := d.command(abi.CmdCreateQP, c.req, tbl)
			if st != c.want {
				t.Fatalf("CREATE_QP: got %v, want %v", st, c.want)
			}
			if st != abi.StatusOK {
				if s := d.Stats(); s.QPs != before.QPs || s.Pin.PinnedBytes != before.Pin.PinnedBytes {
					t.Fatalf("a failed CREATE_QP changed the device")
				}
				return
			}
			mustCmd(t, d, tbl, abi.CmdDestroyQP, out)
		})
	}
}

// TestModifyUD checks MODIFY_QP's UD table and QUERY_QP's qkey.
func TestModifyUD(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	pdn, cqn := pdCQ(t, d, tbl)
	ud := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateQP, qpReq(pdn, cqn, 0, func(c *abi.CreateQP) { c.QPType = abi.QPTypeUD })))
	modify := func(a abi.QPAttr) abi.Status {
		a.QPN = ud
		_, st := d.command(abi.CmdModifyQP, abi.Marshal(&a), tbl)
		return st
	}
	init := abi.QPAttr{QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey, PortNum: 1, QKey: 0x1111}
	steps := []struct {
		name string
		a    abi.QPAttr
		want abi.Status
	}{
		{"init without qkey", abi.QPAttr{QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort, PortNum: 1}, abi.StatusInvalid},
		{"init with access flags", abi.QPAttr{QPState: abi.QPSInit, AttrMask: init.AttrMask | abi.QPAttrAccessFlags, PortNum: 1}, abi.StatusInvalid},
		{"init", init, abi.StatusOK},
		{"rtr with av", abi.QPAttr{QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrAV}, abi.StatusInvalid},
		{"rtr with dest qpn", abi.QPAttr{QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrDestQPN, DestQPNum: 5}, abi.StatusInvalid},
		{"rtr", abi.QPAttr{QPState: abi.QPSRTR, AttrMask: abi.QPAttrState | abi.QPAttrQKey, QKey: 0x2222}, abi.StatusOK},
		{"rts without sq_psn", abi.QPAttr{QPState: abi.QPSRTS, AttrMask: abi.QPAttrState}, abi.StatusInvalid},
		{"rts with timeout", abi.QPAttr{QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrSQPSN | abi.QPAttrTimeout}, abi.StatusInvalid},
		{"rts", abi.QPAttr{QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrSQPSN, SQPSN: 7}, abi.StatusOK},
		{"rts to rts qkey", abi.QPAttr{QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrQKey, QKey: 0x3333}, abi.StatusOK},
	}
	for _, s := range steps {
		if st := modify(s.a); st != s.want {
			t.Fatalf("%s: got %v, want %v", s.name, st, s.want)
		}
	}
	var a abi.QPAttr
	if err := abi.Unmarshal(mustCmd(t, d, tbl, abi.CmdQueryQP, abi.Marshal(&abi.Handle{Handle: ud})), &a); err != nil {
		t.Fatal(err)
	}
	if a.QPState != abi.QPSRTS || a.QKey != 0x3333 || a.SQPSN != 7 {
		t.Fatalf("QUERY_QP: got state %d qkey %#x sq_psn %d, want RTS 0x3333 7", a.QPState, a.QKey, a.SQPSN)
	}

	// RC rejects QKEY.
	rc := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateQP, qpReq(pdn, cqn, 0, nil)))
	req := abi.QPAttr{QPN: rc, QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags | abi.QPAttrQKey, PortNum: 1, QKey: 1}
	if _, st := d.command(abi.CmdModifyQP, abi.Marshal(&req), tbl); st != abi.StatusInvalid {
		t.Fatalf("QKEY on an RC QP: got %v, want INVALID", st)
	}
}

// noNetwork is a fabric Network that connects nothing: it makes the
// fabric's network GIDs exist for CREATE_AH's checks.
type noNetwork struct{}

func (noNetwork) Connect(sgid, dgid [16]byte, locals [][16]byte, paths int, cfg rc.Config, host rc.Host) (rc.Conn, error) {
	return nil, errors.New("no network in this test")
}

// TestCreateAHRemote: an AH from a network GID to a dgid no device of the
// daemon owns is UNSUPPORTED (UD over RoCEv2 is not in this revision);
// from the port GID, or to a device of the daemon, it is made.
func TestCreateAHRemote(t *testing.T) {
	f := engine.NewFabric()
	netGID := [16]byte{10: 0xff, 11: 0xff, 192, 0, 2, 1}
	f.SetNetwork(noNetwork{}, [][16]byte{netGID})
	d, tbl, done := attachedOn(t, f, "a")
	defer done()
	other, _, done2 := attachedOn(t, f, "b")
	defer done2()
	pdn := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreatePD, nil))
	remote := [16]byte{10: 0xff, 11: 0xff, 192, 0, 2, 99}
	cases := []struct {
		name string
		sgid uint32
		dgid [16]byte
		want abi.Status
	}{
		{"network gid to another host", 1, remote, abi.StatusUnsupported},
		{"port gid to nobody", 0, remote, abi.StatusOK},
		{"network gid to a device of the daemon", 1, other.ConfigSpace().PortGID, abi.StatusOK},
		{"empty sgid entry", 5, remote, abi.StatusInvalid},
	}
	for _, c := range cases {
		_, st := d.command(abi.CmdCreateAH, abi.Marshal(&abi.CreateAH{PDN: pdn, PortNum: 1, SGIDIndex: c.sgid, DGID: c.dgid}), tbl)
		if st != c.want {
			t.Errorf("CREATE_AH %s: got %v, want %v", c.name, st, c.want)
		}
	}
}

// stubNIC is a host NIC that makes nothing: enough for the commands a
// device on a host NIC refuses before reaching the NIC.
type stubNIC struct{}

func (stubNIC) Name() string { return "verbs:stub0:1" }
func (stubNIC) AllocPD() (engine.NICPD, error) {
	return nil, errors.New("stub")
}
func (stubNIC) CreateCQ(uint32, func()) (engine.NICCQ, error) { return nil, errors.New("stub") }
func (stubNIC) HostGIDIndex([16]byte) (int, bool)             { return 0, true }
func (stubNIC) Watch(func(uint32)) func()                     { return func() {} }
func (stubNIC) Limits() Limits                                { return Limits{} }
func (stubNIC) ActiveMTU() uint32                             { return abi.MTU1024 }
func (stubNIC) GIDs() [][16]byte                              { return [][16]byte{{10: 0xff, 11: 0xff, 10, 0, 0, 1}} }

// TestHostNICRefusesSRQAndUD: on a device whose RNIC is a host NIC,
// max_srq is 0, and CREATE_SRQ, a UD CREATE_QP and a QP with an SRQ are
// UNSUPPORTED.
func TestHostNICRefusesSRQAndUD(t *testing.T) {
	d, err := New(Config{ID: "nic", NIC: stubNIC{}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if got := d.ConfigSpace().MaxSRQ; got != 0 {
		t.Errorf("max_srq on a host NIC: got %d, want 0", got)
	}
	if got := d.deviceAttr().MaxSRQ; got != 0 {
		t.Errorf("QUERY_DEVICE max_srq on a host NIC: got %d, want 0", got)
	}
	d.res = &resources{} // as attached
	for _, c := range []struct {
		name string
		op   abi.Opcode
		req  []byte
	}{
		{"CREATE_SRQ", abi.CmdCreateSRQ, srqReq(1, nil)},
		{"UD CREATE_QP", abi.CmdCreateQP, qpReq(1, 1, 0, func(c *abi.CreateQP) { c.QPType = abi.QPTypeUD })},
		{"CREATE_QP with SRQ", abi.CmdCreateQP, qpReq(1, 1, 5, nil)},
	} {
		if _, st := d.command(c.op, c.req, nil); st != abi.StatusUnsupported {
			t.Errorf("%s: got %v, want UNSUPPORTED", c.name, st)
		}
	}
}

// TestQueryDeviceMaxSRQ: max_srq in config space and QUERY_DEVICE.
func TestQueryDeviceMaxSRQ(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	var a abi.DeviceAttr
	if err := abi.Unmarshal(mustCmd(t, d, tbl, abi.CmdQueryDevice, nil), &a); err != nil {
		t.Fatal(err)
	}
	want := DefaultLimits().MaxSRQ
	if a.MaxSRQ != want || d.ConfigSpace().MaxSRQ != want {
		t.Fatalf("max_srq: QUERY_DEVICE %d, config %d, want %d", a.MaxSRQ, d.ConfigSpace().MaxSRQ, want)
	}
}
