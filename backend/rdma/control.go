package rdma

import (
	"crypto/rand"
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/memmap"
	abi "github.com/vrdma/vrdma/virtio/rdma"
)

// Control-path objects. Every table is protected by Device.mu; the engine
// objects they point to synchronise themselves.

type pdEntry struct {
	users int // MRs, QPs and AHs naming the PD
}

type mrEntry struct {
	mr *engine.MR // its extents are what is pinned (pinMR)
}

type cqEntry struct {
	cq    *engine.CQ
	pages []memmap.GPA // ring pages, pinned
}

type qpEntry struct {
	qp    *engine.QP
	pages []memmap.GPA // SQ then RQ pages, pinned
}

type ahEntry struct {
	pd   uint32
	dgid [16]byte
}

// resources are one attachment's objects.
type resources struct {
	pds map[uint32]*pdEntry
	mrs map[uint32]*mrEntry
	cqs map[uint32]*cqEntry
	qps map[uint32]*qpEntry
	ahs map[uint32]*ahEntry
	seq uint32 // handle sequence (the upper 24 bits of new handles)

	mrExtents int // extents of all MRs (Limits.MaxMRExtents)
}

func newResources() *resources {
	return &resources{
		pds: map[uint32]*pdEntry{},
		mrs: map[uint32]*mrEntry{},
		cqs: map[uint32]*cqEntry{},
		qps: map[uint32]*qpEntry{},
		ahs: map[uint32]*ahEntry{},
	}
}

// newHandle returns a handle not in use by taken: a sequence number in the
// upper 24 bits and a random low byte, so handles and keys cannot be
// guessed from one another. Zero is never a handle.
func (r *resources) newHandle(taken func(uint32) bool) uint32 {
	return r.newHandleBits(32, taken)
}

// qpnBits is the width of a QP number: the InfiniBand BTH carries 24 bits,
// and applications (perftest, ibv_rc_pingpong) exchange QP numbers so.
const qpnBits = 24

// newHandleBits is newHandle for handles of bits bits (9 … 32): the
// sequence takes bits 8 … bits−1. The loop ends: the device's objects of
// one kind are far fewer than the 2^(bits−8) sequence numbers.
func (r *resources) newHandleBits(bits uint, taken func(uint32) bool) uint32 {
	var b [1]byte
	mask := uint32(1)<<(bits-8) - 1
	for {
		r.seq = (r.seq + 1) & 0xffffff
		seq := r.seq & mask
		if seq == 0 {
			continue
		}
		rand.Read(b[:])
		h := seq<<8 | uint32(b[0])
		if h != 0 && !taken(h) {
			return h
		}
	}
}

// errStatus carries a command status through helper returns.
type errStatus abi.Status

func (e errStatus) Error() string { return abi.Status(e).String() }

func status(err error) abi.Status {
	var s errStatus
	if errors.As(err, &s) {
		return abi.Status(s)
	}
	if errors.Is(err, memmap.ErrQuota) {
		return abi.StatusQuota
	}
	// mlock itself failing is the host running out of lockable memory
	// (RLIMIT_MEMLOCK without CAP_IPC_LOCK, vm.max_map_count): a resource
	// of the device's host, not a malformed command.
	if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EPERM) {
		return abi.StatusNoResources
	}
	if errors.Is(err, memmap.ErrNotMapped) || errors.Is(err, memmap.ErrCrossesRegion) ||
		errors.Is(err, memmap.ErrOverflow) || errors.Is(err, engine.ErrNoMemory) {
		return abi.StatusFault
	}
	return abi.StatusInvalid
}

// decode unmarshals the fixed part of a request into v and returns what
// follows it (the inline page list, for the commands that have one).
func decode(req []byte, v any, trailing bool) ([]byte, error) {
	n := binary.Size(v)
	if len(req) < n || (!trailing && len(req) != n) {
		return nil, errStatus(abi.StatusInvalid)
	}
	if err := abi.Unmarshal(req[:n], v); err != nil {
		return nil, errStatus(abi.StatusInvalid)
	}
	return req[n:], nil
}

// pageList copies a page list out of the request (inline) or out of guest
// memory (indirect), once, and validates it: npages entries, each
// page-aligned. Guest memory it names is checked when pinned.
func pageList(t *memmap.Table, inline []byte, listGPA uint64, npages uint32, shift uint) ([]memmap.GPA, error) {
	var src []byte
	n := uint64(npages) * 8
	if listGPA == 0 {
		if uint64(len(inline)) != n {
			return nil, errStatus(abi.StatusInvalid)
		}
		src = inline
	} else {
		if len(inline) != 0 || listGPA%8 != 0 {
			return nil, errStatus(abi.StatusInvalid)
		}
		b, err := t.Slice(memmap.GPA(listGPA), n)
		if err != nil {
			return nil, errStatus(abi.StatusFault)
		}
		src = b
	}
	pages := make([]memmap.GPA, npages)
	for i := range pages {
		// A guest may change an indirect list while we read it: each
		// entry is read once, then only the copy is used.
		p := binary.LittleEndian.Uint64(src[8*i:])
		if p&(1<<shift-1) != 0 {
			return nil, errStatus(abi.StatusInvalid)
		}
		pages[i] = memmap.GPA(p)
	}
	return pages, nil
}

func pagesFor(bytes uint64) uint64 { return (bytes + abi.PageSize - 1) / abi.PageSize }

// pagesOf is pagesFor for pages of 1<<shift bytes, without overflow.
func pagesOf(bytes uint64, shift uint) uint64 {
	n := bytes >> shift
	if bytes&(1<<shift-1) != 0 {
		n++
	}
	return n
}

func isPow2(v uint32) bool { return v != 0 && v&(v-1) == 0 }

func log2(v uint32) uint32 {
	n := uint32(0)
	for v > 1 {
		v >>= 1
		n++
	}
	return n
}

// command dispatches one command on a validated header. Called with the
// control queue locked; t is the guest memory table held for it.
func (d *Device) command(op abi.Opcode, req []byte, t *memmap.Table) ([]byte, abi.Status) {
	switch op {
	case abi.CmdQueryDevice:
		if len(req) != 0 {
			return nil, abi.StatusInvalid
		}
		return abi.Marshal(d.deviceAttr()), abi.StatusOK
	case abi.CmdQueryPort:
		var r abi.PortReq
		if _, err := decode(req, &r, false); err != nil || r.PortNum != 1 || r.Reserved != 0 {
			return nil, abi.StatusInvalid
		}
		return abi.Marshal(&abi.PortAttr{
			State: abi.PortActive, MaxMTU: abi.MTU4096, ActiveMTU: abi.MTU4096, GIDTblLen: abi.GIDTableLen,
			MaxMsgSz: abi.MaxMsgSize, LinkLayer: abi.LinkLayerEthernet, ActiveSpeed: 32, ActiveWidth: 1,
		}), abi.StatusOK
	case abi.CmdQueryGID:
		var r abi.GIDReq
		if _, err := decode(req, &r, false); err != nil || r.PortNum != 1 || r.Index >= abi.GIDTableLen {
			return nil, abi.StatusInvalid
		}
		g, _ := d.eng.GIDAt(int(r.Index)) // zero for an empty entry
		return abi.Marshal(&abi.GID{Raw: g}), abi.StatusOK
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.res == nil {
		return nil, abi.StatusInvalid
	}
	var out any
	var err error
	switch op {
	case abi.CmdCreatePD:
		if len(req) != 0 {
			return nil, abi.StatusInvalid
		}
		out, err = d.createPD()
	case abi.CmdDestroyPD:
		err = d.withHandle(req, d.destroyPD)
	case abi.CmdRegMR:
		out, err = d.regMR(req, t)
	case abi.CmdDeregMR:
		err = d.withHandle(req, d.deregMR)
	case abi.CmdCreateCQ:
		out, err = d.createCQ(req, t)
	case abi.CmdDestroyCQ:
		err = d.withHandle(req, d.destroyCQ)
	case abi.CmdCreateQP:
		out, err = d.createQP(req, t)
	case abi.CmdModifyQP:
		err = d.modifyQP(req)
	case abi.CmdQueryQP:
		out, err = d.queryQP(req)
	case abi.CmdDestroyQP:
		err = d.withHandle(req, d.destroyQP)
	case abi.CmdCreateAH:
		out, err = d.createAH(req)
	case abi.CmdDestroyAH:
		err = d.withHandle(req, d.destroyAH)
	case abi.CmdReqNotifyCQ:
		err = d.reqNotifyCQ(req)
	case abi.CmdAddGID:
		err = d.addGID(req)
	case abi.CmdDelGID:
		err = d.delGID(req)
	default:
		return nil, abi.StatusUnsupported
	}
	if err != nil {
		return nil, status(err)
	}
	if out == nil {
		return nil, abi.StatusOK
	}
	return abi.Marshal(out), abi.StatusOK
}

func (d *Device) withHandle(req []byte, fn func(h uint32) error) error {
	var h abi.Handle
	if _, err := decode(req, &h, false); err != nil {
		return err
	}
	if h.Reserved != 0 {
		return errStatus(abi.StatusInvalid)
	}
	return fn(h.Handle)
}

func (d *Device) createPD() (any, error) {
	r := d.res
	if uint32(len(r.pds)) >= d.conf.MaxPD {
		return nil, errStatus(abi.StatusNoResources)
	}
	h := r.newHandle(func(h uint32) bool { return r.pds[h] != nil })
	r.pds[h] = &pdEntry{}
	return &abi.Handle{Handle: h}, nil
}

func (d *Device) destroyPD(h uint32) error {
	pd := d.res.pds[h]
	if pd == nil {
		return errStatus(abi.StatusNotFound)
	}
	if pd.users > 0 {
		return errStatus(abi.StatusBusy)
	}
	delete(d.res.pds, h)
	return nil
}

func (d *Device) regMR(req []byte, t *memmap.Table) (any, error) {
	var m abi.RegMR
	inline, err := decode(req, &m, true)
	if err != nil {
		return nil, err
	}
	pd := d.res.pds[m.PDN]
	switch {
	case m.Reserved != 0 || m.PageShift < abi.PageShift || m.PageShift > abi.MaxPageShift:
		return nil, errStatus(abi.StatusInvalid)
	case pd == nil:
		return nil, errStatus(abi.StatusNotFound)
	case m.Access&^uint32(abi.AccessAll) != 0:
		return nil, errStatus(abi.StatusInvalid)
	case m.Access&(abi.AccessRemoteWrite|abi.AccessRemoteAtomic) != 0 && m.Access&abi.AccessLocalWrite == 0:
		return nil, errStatus(abi.StatusInvalid)
	case m.Length == 0 || m.Length > d.conf.MaxMRSize || m.IOVA+m.Length < m.IOVA:
		return nil, errStatus(abi.StatusInvalid)
	case uint64(m.NPages) != pagesOf(m.IOVA&(1<<m.PageShift-1)+m.Length, uint(m.PageShift)):
		return nil, errStatus(abi.StatusInvalid)
	case uint32(len(d.res.mrs)) >= d.conf.MaxMR:
		return nil, errStatus(abi.StatusNoResources)
	}
	pages, err := pageList(t, inline, m.PageList, m.NPages, uint(m.PageShift))
	if err != nil {
		return nil, err
	}
	// The MR's bytes as contiguous runs (one for contiguous memory, however
	// large its pages); the device pins the 4 KiB pages holding them.
	mr := engine.NewMR(0, m.PDN, m.Access, m.IOVA, m.Length, pages, uint(m.PageShift))
	r := d.res
	if r.mrExtents+mr.NumExtents() > int(d.cfg.Limits.MaxMRExtents) {
		return nil, errStatus(abi.StatusNoResources)
	}
	if err := d.pinMR(t, mr); err != nil {
		return nil, err
	}
	r.mrExtents += mr.NumExtents()
	key := r.newHandle(func(h uint32) bool { return r.mrs[h] != nil })
	mr.Key = key
	r.mrs[key] = &mrEntry{mr: mr}
	pd.users++
	d.eng.AddMR(mr)
	return &abi.MRKeys{LKey: key, RKey: key}, nil
}

func (d *Device) deregMR(key uint32) error {
	e := d.res.mrs[key]
	if e == nil {
		return errStatus(abi.StatusNotFound)
	}
	d.eng.RemoveMR(key)
	delete(d.res.mrs, key)
	d.res.pds[e.mr.PD].users--
	d.res.mrExtents -= e.mr.NumExtents()
	d.unpinMR(e.mr)
	return nil
}

// pinMR pins the 4 KiB pages holding the MR's bytes, run by run, all or
// nothing.
func (d *Device) pinMR(t *memmap.Table, mr *engine.MR) error {
	var done []pinSpan
	err := mr.Extents(func(gpa memmap.GPA, n uint64) error {
		s := pageSpan(gpa, n)
		if err := d.pinner.Pin(t, s.gpa, s.n); err != nil {
			return err
		}
		done = append(done, s)
		return nil
	})
	if err != nil {
		for _, s := range done {
			d.pinner.Unpin(t, s.gpa, s.n)
		}
	}
	return err
}

// unpinMR releases what pinMR pinned, with the current table.
func (d *Device) unpinMR(mr *engine.MR) {
	t := d.mem().Acquire()
	defer t.Release()
	mr.Extents(func(gpa memmap.GPA, n uint64) error {
		s := pageSpan(gpa, n)
		d.pinner.Unpin(t, s.gpa, s.n)
		return nil
	})
}

// pinSpan is a page-aligned guest-physical range.
type pinSpan struct {
	gpa memmap.GPA
	n   uint64
}

// pageSpan widens [gpa, gpa+n) to whole 4 KiB pages. n > 0; the range was
// checked not to wrap (the MR's pages lie below 2^64 and its length is
// bounded), so rounding the end up stays below 2^64 or is refused by the
// pinner as out of memory.
func pageSpan(gpa memmap.GPA, n uint64) pinSpan {
	lo := uint64(gpa) &^ (abi.PageSize - 1)
	hi := uint64(gpa) + n
	if r := hi & (abi.PageSize - 1); r != 0 {
		hi += abi.PageSize - r
	}
	return pinSpan{gpa: memmap.GPA(lo), n: hi - lo}
}

// pinRing validates and pins a ring's page list and its doorbell record.
func (d *Device) pinRing(t *memmap.Table, pages []memmap.GPA, record uint64, recordSize uint64) error {
	if record == 0 || record%8 != 0 {
		return errStatus(abi.StatusInvalid)
	}
	if _, err := t.Slice(memmap.GPA(record), recordSize); err != nil {
		return errStatus(abi.StatusFault)
	}
	if err := d.pinner.PinPages(t, pages); err != nil {
		return err
	}
	if err := d.pinner.Pin(t, memmap.GPA(record), recordSize); err != nil {
		d.pinner.UnpinPages(t, pages)
		return err
	}
	return nil
}

func (d *Device) unpinRing(pages []memmap.GPA, record memmap.GPA, recordSize uint64) {
	t := d.mem().Acquire()
	d.pinner.UnpinPages(t, pages)
	d.pinner.Unpin(t, record, recordSize)
	t.Release()
}

func (d *Device) createCQ(req []byte, t *memmap.Table) (any, error) {
	var c abi.CreateCQ
	inline, err := decode(req, &c, true)
	if err != nil {
		return nil, err
	}
	switch {
	case c.Reserved != 0 || c.Flags&^abi.CQFlagArmRecord != 0 || !isPow2(c.CQE) || c.CQE > d.conf.MaxCQE:
		return nil, errStatus(abi.StatusInvalid)
	case uint64(c.NPages) != pagesFor(uint64(c.CQE)*abi.CQESize):
		return nil, errStatus(abi.StatusInvalid)
	case uint32(len(d.res.cqs)) >= d.conf.MaxCQ:
		return nil, errStatus(abi.StatusNoResources)
	}
	pages, err := pageList(t, inline, c.PageList, c.NPages, abi.PageShift)
	if err != nil {
		return nil, err
	}
	armRecord := c.Flags&abi.CQFlagArmRecord != 0
	if err := d.pinRing(t, pages, c.Record, engine.CQRecordSize(armRecord)); err != nil {
		return nil, err
	}
	r := d.res
	h := r.newHandle(func(h uint32) bool { return r.cqs[h] != nil })
	cq := &engine.CQ{
		Num:       h,
		Dev:       d.eng,
		Ring:      engine.Ring{Pages: pages, Depth: c.CQE, Stride: abi.CQESize},
		Record:    memmap.GPA(c.Record),
		ArmRecord: armRecord,
	}
	cq.InitArm(t)
	r.cqs[h] = &cqEntry{cq: cq, pages: pages}
	d.eng.AddCQ(cq)
	return &abi.Handle{Handle: h}, nil
}

func (d *Device) destroyCQ(h uint32) error {
	e := d.res.cqs[h]
	if e == nil {
		return errStatus(abi.StatusNotFound)
	}
	if e.cq.Users.Load() > 0 {
		return errStatus(abi.StatusBusy)
	}
	d.eng.RemoveCQ(h)
	delete(d.res.cqs, h)
	d.unpinRing(e.pages, e.cq.Record, engine.CQRecordSize(e.cq.ArmRecord))
	return nil
}

func (d *Device) createQP(req []byte, t *memmap.Table) (any, error) {
	var c abi.CreateQP
	inline, err := decode(req, &c, true)
	if err != nil {
		return nil, err
	}
	r := d.res
	pd := r.pds[c.PDN]
	scq, rcq := r.cqs[c.SendCQN], r.cqs[c.RecvCQN]
	l := &d.conf
	sqStride, rqStride := uint64(1)<<(c.SQWQEShift&31), uint64(1)<<(c.RQWQEShift&31)
	switch {
	case c.Flags&^abi.QPFlagRQNotify != 0 || c.SQSigAll > 1:
		return nil, errStatus(abi.StatusInvalid)
	case c.QPType != abi.QPTypeRC:
		return nil, errStatus(abi.StatusUnsupported)
	case pd == nil || scq == nil || rcq == nil:
		return nil, errStatus(abi.StatusNotFound)
	case !isPow2(c.MaxSendWR) || c.MaxSendWR > l.MaxQPWR || !isPow2(c.MaxRecvWR) || c.MaxRecvWR > l.MaxQPWR:
		return nil, errStatus(abi.StatusInvalid)
	case c.MaxSendSGE == 0 || c.MaxSendSGE > l.MaxSGE || c.MaxRecvSGE == 0 || c.MaxRecvSGE > l.MaxSGE:
		return nil, errStatus(abi.StatusInvalid)
	case c.MaxInlineData > l.MaxInlineData:
		return nil, errStatus(abi.StatusInvalid)
	case c.SQWQEShift < abi.MinSQWQEShift || c.SQWQEShift > abi.MaxWQEShift ||
		c.RQWQEShift < abi.MinRQWQEShift || c.RQWQEShift > abi.MaxWQEShift:
		return nil, errStatus(abi.StatusInvalid)
	case sqStride < abi.SendWQEHdrSize+abi.SGESize*uint64(c.MaxSendSGE) ||
		sqStride < abi.SendWQEHdrSize+uint64(c.MaxInlineData) ||
		rqStride < abi.RecvWQEHdrSize+abi.SGESize*uint64(c.MaxRecvSGE):
		return nil, errStatus(abi.StatusInvalid)
	case c.DoorbellQueue >= l.NumDoorbellQueues:
		return nil, errStatus(abi.StatusInvalid)
	case uint64(c.SQNPages) != pagesFor(uint64(c.MaxSendWR)*sqStride) ||
		uint64(c.RQNPages) != pagesFor(uint64(c.MaxRecvWR)*rqStride):
		return nil, errStatus(abi.StatusInvalid)
	case uint32(len(r.qps)) >= l.MaxQP:
		return nil, errStatus(abi.StatusNoResources)
	}
	pages, err := pageList(t, inline, c.PageList, c.SQNPages+c.RQNPages, abi.PageShift)
	if err != nil {
		return nil, err
	}
	rqNotify := c.Flags&abi.QPFlagRQNotify != 0
	if err := d.pinRing(t, pages, c.Record, engine.QPRecordSize(rqNotify)); err != nil {
		return nil, err
	}
	h := r.newHandleBits(qpnBits, func(h uint32) bool { return r.qps[h] != nil })
	qp := &engine.QP{
		Num:           h,
		PD:            c.PDN,
		Dev:           d.eng,
		SendCQ:        scq.cq,
		RecvCQ:        rcq.cq,
		SQ:            engine.Ring{Pages: pages[:c.SQNPages], Depth: c.MaxSendWR, Stride: uint32(sqStride)},
		RQ:            engine.Ring{Pages: pages[c.SQNPages:], Depth: c.MaxRecvWR, Stride: uint32(rqStride)},
		Record:        memmap.GPA(c.Record),
		MaxSendSGE:    c.MaxSendSGE,
		MaxRecvSGE:    c.MaxRecvSGE,
		MaxInline:     c.MaxInlineData,
		SigAll:        c.SQSigAll == 1,
		DoorbellQueue: int(c.DoorbellQueue),
		RQNotify:      rqNotify,
	}
	qp.InitRecord(t)
	r.qps[h] = &qpEntry{qp: qp, pages: pages}
	pd.users++
	d.eng.AddQP(qp)
	return &abi.Handle{Handle: h}, nil
}

func (d *Device) destroyQP(h uint32) error {
	e := d.res.qps[h]
	if e == nil {
		return errStatus(abi.StatusNotFound)
	}
	d.eng.RemoveQP(h)
	delete(d.res.qps, h)
	d.res.pds[e.qp.PD].users--
	d.unpinRing(e.pages, e.qp.Record, engine.QPRecordSize(e.qp.RQNotify))
	return nil
}

func (d *Device) modifyQP(req []byte) error {
	var a abi.QPAttr
	if _, err := decode(req, &a, false); err != nil {
		return err
	}
	e := d.res.qps[a.QPN]
	if e == nil {
		return errStatus(abi.StatusNotFound)
	}
	// The device's limits; the engine checks everything else.
	if (a.AttrMask&abi.QPAttrMaxQPRdAtomic != 0 && a.MaxRdAtomic > d.conf.MaxQPRdAtom) ||
		(a.AttrMask&abi.QPAttrMaxDestRdAtomic != 0 && a.MaxDestRdAtomic > d.conf.MaxQPRdAtom) {
		return errStatus(abi.StatusInvalid)
	}
	if st := e.qp.Modify(a); st != abi.StatusOK {
		return errStatus(st)
	}
	return nil
}

func (d *Device) queryQP(req []byte) (any, error) {
	var h abi.Handle
	if _, err := decode(req, &h, false); err != nil || h.Reserved != 0 {
		return nil, errStatus(abi.StatusInvalid)
	}
	e := d.res.qps[h.Handle]
	if e == nil {
		return nil, errStatus(abi.StatusNotFound)
	}
	a := e.qp.Attr()
	a.QPN, a.AttrMask = h.Handle, 0
	return &a, nil
}

func (d *Device) createAH(req []byte) (any, error) {
	var c abi.CreateAH
	if _, err := decode(req, &c, false); err != nil {
		return nil, err
	}
	pd := d.res.pds[c.PDN]
	switch {
	case c.Reserved != 0 || c.PortNum != 1 || c.SGIDIndex >= abi.GIDTableLen:
		return nil, errStatus(abi.StatusInvalid)
	case !d.hasGID(c.SGIDIndex):
		return nil, errStatus(abi.StatusInvalid)
	case pd == nil:
		return nil, errStatus(abi.StatusNotFound)
	case uint32(len(d.res.ahs)) >= d.conf.MaxAH:
		return nil, errStatus(abi.StatusNoResources)
	}
	r := d.res
	h := r.newHandle(func(h uint32) bool { return r.ahs[h] != nil })
	r.ahs[h] = &ahEntry{pd: c.PDN, dgid: c.DGID}
	pd.users++
	return &abi.Handle{Handle: h}, nil
}

func (d *Device) destroyAH(h uint32) error {
	e := d.res.ahs[h]
	if e == nil {
		return errStatus(abi.StatusNotFound)
	}
	delete(d.res.ahs, h)
	d.res.pds[e.pd].users--
	return nil
}

func (d *Device) hasGID(index uint32) bool {
	_, ok := d.eng.GIDAt(int(index))
	return ok
}

// addGID writes an entry of the port's GID table (docs/spec.md, "The GID
// table"): "ADD_GID of a GID that another device's table holds answers BUSY
// and changes nothing."
func (d *Device) addGID(req []byte) error {
	var g abi.GIDEntry
	if _, err := decode(req, &g, false); err != nil {
		return err
	}
	if g.PortNum != 1 || g.Index >= abi.GIDTableLen || g.GIDType > abi.GIDTypeRoCEv2 ||
		g.Reserved != 0 || g.GID == ([16]byte{}) {
		return errStatus(abi.StatusInvalid)
	}
	if err := d.eng.SetGID(int(g.Index), g.GID); err != nil {
		if errors.Is(err, engine.ErrGIDTaken) {
			return errStatus(abi.StatusBusy)
		}
		return errStatus(abi.StatusInvalid)
	}
	return nil
}

// delGID empties an entry of the port's GID table.
func (d *Device) delGID(req []byte) error {
	var g abi.GIDReq
	if _, err := decode(req, &g, false); err != nil {
		return err
	}
	if g.PortNum != 1 || g.Index >= abi.GIDTableLen {
		return errStatus(abi.StatusInvalid)
	}
	if err := d.eng.ClearGID(int(g.Index)); err != nil {
		return errStatus(abi.StatusNotFound)
	}
	return nil
}

func (d *Device) reqNotifyCQ(req []byte) error {
	var n abi.NotifyCQ
	if _, err := decode(req, &n, false); err != nil {
		return err
	}
	if n.SolicitedOnly > 1 {
		return errStatus(abi.StatusInvalid)
	}
	e := d.res.cqs[n.CQN]
	if e == nil {
		return errStatus(abi.StatusNotFound)
	}
	e.cq.Arm(n.SolicitedOnly == 1)
	return nil
}

// destroyAll destroys every object in dependency order and releases every
// pin. Precondition: d.mu held.
func (d *Device) destroyAll() {
	r := d.res
	if r == nil {
		return
	}
	d.eng.Reset() // QPs (flushing peers), then CQs and MRs, inside the engine
	d.eng.ResetGIDs()
	for h := range r.qps {
		d.destroyQPEntry(h)
	}
	for h, e := range r.cqs {
		delete(r.cqs, h)
		d.unpinRing(e.pages, e.cq.Record, engine.CQRecordSize(e.cq.ArmRecord))
	}
	for h, e := range r.mrs {
		delete(r.mrs, h)
		d.unpinMR(e.mr)
	}
	clear(r.ahs)
	clear(r.pds)
}

func (d *Device) destroyQPEntry(h uint32) {
	e := d.res.qps[h]
	delete(d.res.qps, h)
	d.unpinRing(e.pages, e.qp.Record, engine.QPRecordSize(e.qp.RQNotify))
}
