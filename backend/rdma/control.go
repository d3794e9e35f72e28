package rdma

import (
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The device's objects live in one registry, the engine's (engine.RNIC,
// registry.go); the control path validates commands, pins the guest
// memory they name, and adds and removes objects there. What it keeps of
// its own is the pin accounting below. Protected by Device.mu.
type resources struct {
	mrExtents int // extents of all MRs (Limits.MaxMRExtents)
}

// qpnBits is the width of a QP number: the InfiniBand BTH carries 24 bits,
// and applications (perftest, ibv_rc_pingpong) exchange QP numbers so.
const qpnBits = 24

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
	// So is the bound on the mappings a device's pins may keep alive
	// across memory-table changes (memmap: maxTracked).
	if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EPERM) ||
		errors.Is(err, memmap.ErrTooManyRegions) {
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
func pageList(t *memmap.Table, inline []byte, listGPA uint64, npages uint32, shift uint) ([]abi.GPA, error) {
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
		b, err := t.Slice(abi.GPA(listGPA), n)
		if err != nil {
			return nil, errStatus(abi.StatusFault)
		}
		src = b
	}
	pages := make([]abi.GPA, npages)
	for i := range pages {
		// A guest may change an indirect list while we read it: each
		// entry is read once, then only the copy is used.
		p := binary.LittleEndian.Uint64(src[8*i:])
		if p&(1<<shift-1) != 0 {
			return nil, errStatus(abi.StatusInvalid)
		}
		pages[i] = abi.GPA(p)
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
			State: abi.PortActive, MaxMTU: d.conf.ActiveMTU, ActiveMTU: d.conf.ActiveMTU, GIDTblLen: abi.GIDTableLen,
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
	case abi.CmdCreateSRQ:
		out, err = d.createSRQ(req, t)
	case abi.CmdModifySRQ:
		err = d.modifySRQ(req)
	case abi.CmdQuerySRQ:
		out, err = d.querySRQ(req)
	case abi.CmdDestroySRQ:
		err = d.withHandle(req, d.destroySRQ)
	case abi.CmdAllocMW:
		out, err = d.allocMW(req)
	case abi.CmdDeallocMW:
		err = d.withHandle(req, d.deallocMW)
	case abi.CmdAllocMR:
		out, err = d.allocMR(req)
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

// deviceAttr is QUERY_DEVICE's response.
func (d *Device) deviceAttr() *abi.DeviceAttr {
	c := &d.conf
	return &abi.DeviceAttr{
		FWVer:           abi.ABIVersion,
		NodeGUID:        c.NodeGUID,
		SysImageGUID:    c.NodeGUID,
		MaxMRSize:       c.MaxMRSize,
		PageSizeCap:     (1<<(abi.MaxPageShift+1) - 1) &^ (abi.PageSize - 1),
		VendorID:        0x1af4,
		VendorPartID:    0x1040 + abi.DeviceID,
		HWVer:           1,
		MaxQP:           c.MaxQP,
		MaxQPWR:         c.MaxQPWR,
		MaxSGE:          c.MaxSGE,
		MaxCQ:           c.MaxCQ,
		MaxCQE:          c.MaxCQE,
		MaxMR:           c.MaxMR,
		MaxPD:           c.MaxPD,
		MaxQPRdAtom:     c.MaxQPRdAtom,
		MaxQPInitRdAtom: c.MaxQPRdAtom,
		AtomicCap:       abi.AtomicHCA,
		MaxAH:           c.MaxAH,
		PhysPortCnt:     1,
		MaxInlineData:   c.MaxInlineData,
		MaxSRQ:          c.MaxSRQ,
		DeviceCapFlags:  d.deviceCapFlags(),
	}
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

// newHandle draws a new handle of kind k (want 0: RNIC.NewHandle) or,
// importing an object (state.go), takes the one it had: INVALID if want
// is not a handle the device could have drawn or an object holds it.
func (d *Device) newHandle(k engine.Kind, bits uint, want uint32) (uint32, error) {
	if want == 0 {
		h := d.eng.NewHandle(k, bits)
		if h == 0 { // a QP number: none free
			return 0, errStatus(abi.StatusNoResources)
		}
		return h, nil
	}
	if !d.eng.ClaimHandle(k, want, bits) {
		return 0, errStatus(abi.StatusInvalid)
	}
	return want, nil
}

func (d *Device) createPD() (any, error) {
	h, err := d.addPD(0)
	if err != nil {
		return nil, err
	}
	return &abi.Handle{Handle: h}, nil
}

// addPD makes a PD with handle want (0: a new one).
func (d *Device) addPD(want uint32) (uint32, error) {
	if uint32(d.eng.Count(engine.KindPD)) >= d.conf.MaxPD {
		return 0, errStatus(abi.StatusNoResources)
	}
	h, err := d.newHandle(engine.KindPD, 32, want)
	if err != nil {
		return 0, err
	}
	if d.eng.AddPD(h) == nil {
		return 0, errStatus(abi.StatusNoResources) // the host NIC refused
	}
	return h, nil
}

func (d *Device) destroyPD(h uint32) error {
	switch err := d.eng.RemovePD(h); {
	case errors.Is(err, engine.ErrNoPD):
		return errStatus(abi.StatusNotFound)
	case errors.Is(err, engine.ErrPDBusy):
		return errStatus(abi.StatusBusy)
	}
	return nil
}

func (d *Device) regMR(req []byte, t *memmap.Table) (any, error) {
	var m abi.RegMR
	inline, err := decode(req, &m, true)
	if err != nil {
		return nil, err
	}
	if m.Flags&^uint32(abi.RegMRFlagDMA) != 0 || m.Reserved != 0 {
		return nil, errStatus(abi.StatusInvalid)
	}
	if m.Flags&abi.RegMRFlagDMA != 0 {
		return d.regDMAMR(&m, inline, 0)
	}
	if err := d.checkRegMR(&m); err != nil {
		return nil, err
	}
	pages, err := pageList(t, inline, m.PageList, m.NPages, uint(m.PageShift))
	if err != nil {
		return nil, err
	}
	mr, err := d.addMR(t, &m, pages, 0)
	if err != nil {
		return nil, err
	}
	return &abi.MRKeys{LKey: mr.Key, RKey: mr.RKey}, nil
}

// checkRegMR validates a REG_MR request (not DMA) but its page list.
func (d *Device) checkRegMR(m *abi.RegMR) error {
	switch {
	case m.PageShift < abi.PageShift || m.PageShift > abi.MaxPageShift:
		return errStatus(abi.StatusInvalid)
	case !d.eng.HasPD(m.PDN):
		return errStatus(abi.StatusNotFound)
	case m.Access&^d.mrAccess() != 0:
		return errStatus(abi.StatusInvalid)
	case m.Access&(abi.AccessRemoteWrite|abi.AccessRemoteAtomic) != 0 && m.Access&abi.AccessLocalWrite == 0:
		return errStatus(abi.StatusInvalid)
	case m.Length == 0 || m.Length > d.conf.MaxMRSize || m.IOVA+m.Length < m.IOVA:
		return errStatus(abi.StatusInvalid)
	case uint64(m.NPages) != pagesOf(m.IOVA&(1<<m.PageShift-1)+m.Length, uint(m.PageShift)):
		return errStatus(abi.StatusInvalid)
	case uint32(d.eng.Count(engine.KindMR)) >= d.conf.MaxMR:
		return errStatus(abi.StatusNoResources)
	}
	return nil
}

// addMR builds the MR a checked REG_MR request and its page list name,
// pins its pages and adds it with key want (0: a new key).
func (d *Device) addMR(t *memmap.Table, m *abi.RegMR, pages []abi.GPA, want uint32) (*engine.MR, error) {
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
	if d.eng.NIC() != nil {
		// Registered with the host NIC at the guest's IOVA: its keys
		// are the NIC's.
		if err := d.eng.RegisterMRNIC(t, mr); err != nil {
			d.unpinMR(mr)
			d.log.WithError(err).Warn("REG_MR: host NIC")
			return nil, errStatus(abi.StatusNoResources)
		}
	} else {
		key, err := d.newHandle(engine.KindMR, 32, want)
		if err != nil {
			d.unpinMR(mr)
			return nil, err
		}
		mr.Key, mr.RKey = key, key
	}
	if err := d.eng.AddMR(mr); err != nil { // the PD was checked under d.mu
		mr.ReleaseNIC()
		d.unpinMR(mr)
		return nil, errStatus(abi.StatusNotFound)
	}
	r.mrExtents += mr.NumExtents()
	return mr, nil
}

// regDMAMR registers a DMA MR (docs/spec.md § Kernel verbs and the GSI
// QP): "iova, length, page_shift, npages and page_list are zero and access
// is 0 or LOCAL_WRITE (INVALID otherwise)"; it "pins nothing", "counts
// against max_mr" and names its PD as any MR. A host NIC's device has no
// device_caps GSI and answers UNSUPPORTED.
// want is the key of an imported MR (0: a new one).
func (d *Device) regDMAMR(m *abi.RegMR, inline []byte, want uint32) (any, error) {
	switch {
	case d.eng.NIC() != nil:
		return nil, errStatus(abi.StatusUnsupported)
	case m.IOVA != 0 || m.Length != 0 || m.PageShift != 0 || m.NPages != 0 || m.PageList != 0 || len(inline) != 0:
		return nil, errStatus(abi.StatusInvalid)
	case m.Access != 0 && m.Access != abi.AccessLocalWrite:
		return nil, errStatus(abi.StatusInvalid)
	case !d.eng.HasPD(m.PDN):
		return nil, errStatus(abi.StatusNotFound)
	case uint32(d.eng.Count(engine.KindMR)) >= d.conf.MaxMR:
		return nil, errStatus(abi.StatusNoResources)
	}
	key, err := d.newHandle(engine.KindMR, 32, want)
	if err != nil {
		return nil, err
	}
	mr := engine.NewDMAMR(key, m.PDN, m.Access)
	mr.RKey = mr.Key
	if err := d.eng.AddMR(mr); err != nil { // the PD was checked under d.mu
		return nil, errStatus(abi.StatusNotFound)
	}
	return &abi.MRKeys{LKey: mr.Key, RKey: mr.RKey}, nil
}

// deregMR deregisters an MR: "DEREG_MR of an MR that a window is bound in
// answers BUSY"; an ALLOC_MR MR, which pins nothing, goes "in either
// state".
func (d *Device) deregMR(key uint32) error {
	mr, err := d.eng.DeregMR(key)
	switch {
	case errors.Is(err, engine.ErrMRBusy):
		return errStatus(abi.StatusBusy)
	case err != nil:
		return errStatus(abi.StatusNotFound)
	case mr == nil:
		return nil
	}
	d.res.mrExtents -= mr.NumExtents()
	d.unpinMR(mr)
	return nil
}

func (d *Device) createCQ(req []byte, t *memmap.Table) (any, error) {
	var c abi.CreateCQ
	inline, err := decode(req, &c, true)
	if err != nil {
		return nil, err
	}
	if err := d.checkCreateCQ(&c); err != nil {
		return nil, err
	}
	pages, err := pageList(t, inline, c.PageList, c.NPages, abi.PageShift)
	if err != nil {
		return nil, err
	}
	cq, err := d.addCQ(t, &c, pages, 0, nil)
	if err != nil {
		return nil, err
	}
	return &abi.Handle{Handle: cq.Num}, nil
}

// checkCreateCQ validates a CREATE_CQ request but its page list.
func (d *Device) checkCreateCQ(c *abi.CreateCQ) error {
	switch {
	case c.Reserved != 0 || c.Flags&^abi.CQFlagArmRecord != 0 || !isPow2(c.CQE) || c.CQE > d.conf.MaxCQE:
		return errStatus(abi.StatusInvalid)
	case uint64(c.NPages) != pagesFor(uint64(c.CQE)*abi.CQESize):
		return errStatus(abi.StatusInvalid)
	case uint32(d.eng.Count(engine.KindCQ)) >= d.conf.MaxCQ:
		return errStatus(abi.StatusNoResources)
	}
	return nil
}

// addCQ builds the CQ a checked CREATE_CQ request and its page list name,
// pins its ring and record and adds it with handle want (0: a new one).
// st is an imported CQ's state (nil: a new CQ, which reads its record's
// arm word).
func (d *Device) addCQ(t *memmap.Table, c *abi.CreateCQ, pages []abi.GPA, want uint32, st *engine.CQState) (*engine.CQ, error) {
	armRecord := c.Flags&abi.CQFlagArmRecord != 0
	if err := d.pinRing(t, pages, c.Record, engine.CQRecordSize(armRecord)); err != nil {
		return nil, err
	}
	h, err := d.newHandle(engine.KindCQ, 32, want)
	if err != nil {
		d.unpinRing(pages)
		return nil, err
	}
	cq := &engine.CQ{
		Num:       h,
		Dev:       d.eng,
		Ring:      engine.Ring{Pages: pages, Depth: c.CQE, Stride: abi.CQESize},
		Record:    abi.GPA(c.Record),
		ArmRecord: armRecord,
	}
	if err := d.eng.CreateCQNIC(cq); err != nil {
		d.unpinCQ(cq)
		d.log.WithError(err).Warn("CREATE_CQ: host NIC")
		return nil, errStatus(abi.StatusNoResources)
	}
	if st == nil {
		cq.InitArm(t)
	} else if err := cq.ImportState(*st); err != nil { // no host NIC: ImportState refuses one
		d.unpinCQ(cq)
		return nil, err
	}
	d.eng.AddCQ(cq)
	return cq, nil
}

func (d *Device) destroyCQ(h uint32) error {
	cq := d.eng.LookupCQ(h)
	if cq == nil {
		return errStatus(abi.StatusNotFound)
	}
	if cq.Users.Load() > 0 {
		return errStatus(abi.StatusBusy)
	}
	d.eng.RemoveCQ(h)
	d.unpinCQ(cq)
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
	cq := d.eng.LookupCQ(n.CQN)
	if cq == nil {
		return errStatus(abi.StatusNotFound)
	}
	cq.Arm(n.SolicitedOnly == 1)
	return nil
}

// destroyAll destroys every object in dependency order and releases every
// pin. Precondition: d.mu held.
func (d *Device) destroyAll() {
	r := d.res
	if r == nil {
		return
	}
	rel := d.eng.Reset() // QPs (flushing peers), then SRQs, CQs, MRs, AHs and PDs
	d.eng.ResetGIDs()
	for _, qp := range rel.QPs {
		d.unpinQP(qp)
	}
	for _, s := range rel.SRQs {
		d.unpinSRQ(s)
	}
	for _, cq := range rel.CQs {
		d.unpinCQ(cq)
	}
	for _, mr := range rel.MRs {
		d.unpinMR(mr)
	}
	r.mrExtents = 0
}
