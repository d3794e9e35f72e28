package rdma

import (
	"errors"
	"fmt"
	"math"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// ErrInvalidState: ImportState refused a state (a field out of range, a
// reference that does not resolve, a command its device would refuse);
// wrapped with what is wrong. It is engine.ErrState.
var ErrInvalidState = engine.ErrState

// imported is what ImportState leaves for FinishImport. Protected by
// Device.mu.
type imported struct {
	peers map[uint32]bool // RC QPs whose peer is resolved again
	udNet []uint32        // UD QPs attached to the network again
}

// ImportState rebuilds the device's objects from st, in the new process:
// on a Device created with the same Config whose Attach has just been
// called (by backend.Adopt: the guest memory table and the queues exist,
// nothing runs yet), with no object. It validates st as hostile input:
// every object goes through the checks and the build of the command that
// created it (with the handle it had), and the engine's state of it
// through the engine's checks; it pins every MR's, CQ's, SRQ's and QP's
// pages again in this process, registers the QP numbers and the GID table
// on the fabric, and leaves every record in guest memory as it is. On any
// error it releases everything it made (the device is as after a reset)
// and returns an error wrapping ErrInvalidState or ErrNotTransferable.
// FinishImport completes it.
func (d *Device) ImportState(st *DeviceState) (err error) {
	if st == nil {
		return fmt.Errorf("rdma: import: %w: no state", ErrInvalidState)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.res == nil || d.memory == nil {
		return errors.New("rdma: import: no driver attached")
	}
	if d.cfg.NIC != nil {
		return fmt.Errorf("rdma: import: %w: the device runs on a host NIC", ErrNotTransferable)
	}
	for _, k := range []engine.Kind{engine.KindPD, engine.KindMR, engine.KindCQ, engine.KindQP, engine.KindAH, engine.KindSRQ} {
		if d.eng.Count(k) != 0 {
			return errors.New("rdma: import: the device has objects already")
		}
	}
	if st.NodeGUID != d.conf.NodeGUID {
		return fmt.Errorf("rdma: import: %w: node GUID %#x is not the device's %#x", ErrInvalidState, st.NodeGUID, d.conf.NodeGUID)
	}
	if err := d.checkCounts(st); err != nil {
		return fmt.Errorf("rdma: import: %w: %v", ErrInvalidState, err)
	}
	t := d.memory.Acquire()
	if t == nil {
		return errors.New("rdma: import: no guest memory table")
	}
	defer t.Release()
	defer func() {
		if err != nil {
			// Everything made so far goes: QPs first, pins released,
			// QP numbers and GIDs unregistered.
			d.destroyAll()
			d.res = &resources{}
			d.imported = nil
			err = fmt.Errorf("rdma: import: %w", err)
		}
	}()
	if err := d.importGIDs(st.GIDs); err != nil {
		return err
	}
	for _, h := range st.PDs {
		if _, err := d.addPD(h); err != nil {
			return stateErr("PD %#x: %v", h, err)
		}
	}
	for i := range st.MRs {
		if err := d.importMR(t, &st.MRs[i]); err != nil {
			return err
		}
	}
	for _, a := range st.AHs {
		if err := d.importAH(&a); err != nil {
			return err
		}
	}
	for i := range st.CQs {
		c := &st.CQs[i]
		req := abi.CreateCQ{CQE: c.Depth, NPages: uint32(min(uint64(len(c.Pages)), math.MaxUint32)), Record: c.Record}
		if c.ArmRecord {
			req.Flags = abi.CQFlagArmRecord
		}
		if err := d.checkCreateCQ(&req); err != nil {
			return stateErr("CQ %#x: %v", c.Handle, err)
		}
		pages, err := pageGPAs(c.Pages, abi.PageShift)
		if err != nil {
			return stateErr("CQ %#x: page list: %v", c.Handle, err)
		}
		if _, err := d.addCQ(t, &req, pages, c.Handle, &c.State); err != nil {
			return stateErr("CQ %#x: %v", c.Handle, err)
		}
	}
	for i := range st.SRQs {
		s := &st.SRQs[i]
		req := abi.CreateSRQ{PDN: s.PD, MaxWR: s.MaxWR, MaxSGE: s.MaxSGE, SRQLimit: s.State.Limit, WQEShift: s.WQEShift,
			DoorbellQueue: s.DoorbellQueue, Record: s.Record, NPages: uint32(min(uint64(len(s.Pages)), math.MaxUint32))}
		if err := d.checkCreateSRQ(&req); err != nil {
			return stateErr("SRQ %#x: %v", s.Handle, err)
		}
		pages, err := pageGPAs(s.Pages, abi.PageShift)
		if err != nil {
			return stateErr("SRQ %#x: page list: %v", s.Handle, err)
		}
		if _, err := d.addSRQ(t, &req, pages, s.Handle, &s.State); err != nil {
			return stateErr("SRQ %#x: %v", s.Handle, err)
		}
	}
	imp := &imported{peers: map[uint32]bool{}}
	for i := range st.QPs {
		if err := d.importQP(t, &st.QPs[i], imp); err != nil {
			return err
		}
	}
	if err := d.eng.SetCounters(st.Counters.Engine); err != nil {
		return err
	}
	d.commands.Store(st.Counters.Commands)
	d.errors.Store(st.Counters.Errors)
	d.eventsLost.Store(st.Counters.EventsLost)
	d.eng.SetHandleSeq(st.HandleSeq)
	d.imported = imp
	// The driver's objects live on: a resumed session is not a lost
	// device (HandleQueue's DEVICE_FATAL).
	d.lostReported.Store(true)
	return nil
}

func stateErr(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidState}, a...)...)
}

// importGIDs makes the GID table st's: entries st does not fill are
// cleared first, then the others written as ADD_GID writes them (the
// device must be allowed to hold each, and no other device may).
func (d *Device) importGIDs(gids []GIDState) error {
	want := make(map[int][16]byte, len(gids))
	for _, g := range gids {
		if g.Index < 0 || g.Index >= abi.GIDTableLen || g.GID == ([16]byte{}) {
			return stateErr("GID entry %d", g.Index)
		}
		if _, dup := want[g.Index]; dup {
			return stateErr("GID entry %d given twice", g.Index)
		}
		want[g.Index] = g.GID
	}
	for i := range abi.GIDTableLen {
		if _, keep := want[i]; !keep {
			if _, ok := d.eng.GIDAt(i); ok {
				if err := d.eng.ClearGID(i); err != nil {
					return stateErr("GID entry %d: %v", i, err)
				}
			}
		}
	}
	for i := range abi.GIDTableLen {
		g, set := want[i]
		if cur, ok := d.eng.GIDAt(i); !set || (ok && cur == g) {
			continue
		}
		if err := d.eng.SetGID(i, g); err != nil {
			return stateErr("GID entry %d: %v", i, err)
		}
	}
	return nil
}

// importMR registers m again as REG_MR did, with its key, pinning its
// pages in this process.
func (d *Device) importMR(t *memmap.Table, m *MRState) error {
	if m.DMA {
		if m.IOVA != 0 || m.Length != 0 || m.PageShift != 0 || len(m.Extents) != 0 {
			return stateErr("DMA MR %#x with a range", m.Key)
		}
		req := abi.RegMR{PDN: m.PD, Access: m.Access, Flags: abi.RegMRFlagDMA}
		if _, err := d.regDMAMR(&req, nil, m.Key); err != nil {
			return stateErr("MR %#x: %v", m.Key, err)
		}
		return nil
	}
	req := abi.RegMR{PDN: m.PD, Access: m.Access, IOVA: m.IOVA, Length: m.Length, PageShift: m.PageShift}
	if m.PageShift < abi.PageShift || m.PageShift > abi.MaxPageShift {
		return stateErr("MR %#x: page shift %d", m.Key, m.PageShift)
	}
	shift := uint(m.PageShift)
	n := pagesOf(m.IOVA&(1<<shift-1)+m.Length, shift)
	if n > math.MaxUint32 {
		return stateErr("MR %#x: %d pages", m.Key, n)
	}
	req.NPages = uint32(n)
	if err := d.checkRegMR(&req); err != nil {
		return stateErr("MR %#x: %v", m.Key, err)
	}
	pages, err := mrPages(m)
	if err != nil {
		return stateErr("MR %#x: %v", m.Key, err)
	}
	mr, err := d.addMR(t, &req, pages, m.Key)
	if err != nil {
		return stateErr("MR %#x: %v", m.Key, err)
	}
	// The MR built from the page list must be the one described: its
	// extents are the state's, run for run.
	i, same := 0, true
	_ = mr.Extents(func(gpa abi.GPA, n uint64) error {
		if i >= len(m.Extents) || m.Extents[i] != (ExtentState{GPA: uint64(gpa), Len: n}) {
			same = false
			return errStatus(abi.StatusInvalid)
		}
		i++
		return nil
	})
	if !same || i != len(m.Extents) {
		_ = d.deregMR(mr.Key)
		return stateErr("MR %#x: extents are not those of its pages", m.Key)
	}
	return nil
}

// mrPages rebuilds the page list of an MR from its extents: page i holds
// the MR's bytes from offset i·size − iova mod size (the first page from
// offset 0, iova mod size into it). Precondition: m's page shift, length
// and page count were checked (checkRegMR).
func mrPages(m *MRState) ([]abi.GPA, error) {
	shift := uint(m.PageShift)
	size := uint64(1) << shift
	first := m.IOVA & (size - 1)
	n := pagesOf(first+m.Length, shift)
	var total uint64
	for _, e := range m.Extents {
		if e.Len == 0 || e.Len > m.Length || e.GPA+e.Len < e.GPA {
			return nil, errors.New("an extent out of range")
		}
		total += e.Len
	}
	if total != m.Length {
		return nil, fmt.Errorf("extents of %d bytes for %d", total, m.Length)
	}
	pages := make([]abi.GPA, 0, n)
	j, eoff := 0, uint64(0) // the extent holding offset off, and where it starts
	for i := range n {
		off := uint64(0)
		if i > 0 {
			off = i*size - first
		}
		for j < len(m.Extents) && off >= eoff+m.Extents[j].Len {
			eoff += m.Extents[j].Len
			j++
		}
		if j == len(m.Extents) {
			return nil, errors.New("extents end before the MR")
		}
		gpa := m.Extents[j].GPA + (off - eoff)
		if i == 0 {
			if gpa < first {
				return nil, errors.New("first page below address 0")
			}
			gpa -= first
		}
		if gpa&(size-1) != 0 {
			return nil, fmt.Errorf("page %d at %#x is not aligned", i, gpa)
		}
		pages = append(pages, abi.GPA(gpa))
	}
	return pages, nil
}

// importAH creates a again as CREATE_AH did, at the index of the GID
// table that holds its source GID now.
func (d *Device) importAH(a *AHState) error {
	idx := -1
	for i := range abi.GIDTableLen {
		if g, ok := d.eng.GIDAt(i); ok && g == a.SGID {
			idx = i
			break
		}
	}
	if idx < 0 {
		return stateErr("AH %#x: its source GID is not in the GID table", a.Handle)
	}
	req := abi.CreateAH{PDN: a.PD, PortNum: 1, DGID: a.DGID, SGIDIndex: uint32(idx)}
	if _, err := d.addAH(&req, a.Handle); err != nil {
		return stateErr("AH %#x: %v", a.Handle, err)
	}
	return nil
}

// importQP creates q again as CREATE_QP did, with its number, and gives it
// its state; imp collects what FinishImport resolves.
func (d *Device) importQP(t *memmap.Table, q *QPState, imp *imported) error {
	if uint64(q.SQNPages) > uint64(len(q.Pages)) || len(q.Pages) > math.MaxUint32 {
		return stateErr("QP %#x: %d send queue pages of %d", q.Num, q.SQNPages, len(q.Pages))
	}
	req := abi.CreateQP{PDN: q.PD, SendCQN: q.SendCQ, RecvCQN: q.RecvCQ, QPType: q.Type, MaxSendWR: q.MaxSendWR,
		MaxRecvWR: q.MaxRecvWR, MaxSendSGE: q.MaxSendSGE, MaxRecvSGE: q.MaxRecvSGE, MaxInlineData: q.MaxInlineData,
		SQWQEShift: q.SQWQEShift, RQWQEShift: q.RQWQEShift, DoorbellQueue: q.DoorbellQueue, Record: q.Record,
		SQNPages: q.SQNPages, RQNPages: uint32(len(q.Pages)) - q.SQNPages, SRQN: q.SRQ}
	if q.SigAll {
		req.SQSigAll = 1
	}
	if q.RQNotify {
		req.Flags |= abi.QPFlagRQNotify
	}
	if q.SRQ != 0 {
		req.Flags |= abi.QPFlagSRQ
	}
	if err := d.checkCreateQP(&req); err != nil {
		return stateErr("QP %#x: %v", q.Num, err)
	}
	a := &q.State.Attr
	if a.MaxRdAtomic > d.conf.MaxQPRdAtom || a.MaxDestRdAtomic > d.conf.MaxQPRdAtom {
		return stateErr("QP %#x: rd_atomic above the device's", q.Num)
	}
	if q.State.Peer || q.State.Net != nil {
		if sgid, ok := d.eng.GIDAt(int(a.SGIDIndex)); !ok || sgid != q.State.SGID {
			// The GID it sends from must be the device's (it may
			// have moved in the table since: any entry will do).
			if !d.holdsGID(q.State.SGID) {
				return stateErr("QP %#x: it sends from a GID not in the table", q.Num)
			}
		}
	} else if q.State.SGID != ([16]byte{}) {
		return stateErr("QP %#x: a source GID without a peer", q.Num)
	}
	pages, err := pageGPAs(q.Pages, abi.PageShift)
	if err != nil {
		return stateErr("QP %#x: page list: %v", q.Num, err)
	}
	qp, err := d.addQP(t, &req, pages, q.Num)
	if err != nil {
		return stateErr("QP %#x: %v", q.Num, err)
	}
	if err := qp.ImportState(&q.State); err != nil {
		_ = d.destroyQP(qp.Num)
		return err
	}
	if q.State.Net != nil {
		// Its local memory resolves through the MRs imported above;
		// the connection is restored on the network the process
		// adopted, frozen until the handover commits.
		if err := qp.RestoreNet(t, q.State.Net); err != nil {
			_ = d.destroyQP(qp.Num)
			return err
		}
	}
	if q.State.Peer {
		imp.peers[qp.Num] = true
	}
	if q.State.UDNet {
		imp.udNet = append(imp.udNet, qp.Num)
	}
	return nil
}

// holdsGID reports whether the GID table holds g.
func (d *Device) holdsGID(g [16]byte) bool {
	for i := range abi.GIDTableLen {
		if x, ok := d.eng.GIDAt(i); ok && x == g {
			return true
		}
	}
	return false
}

// FinishImport runs after ImportState of every device of the daemon: it
// resolves the same-host peers of RC QPs (the peer device found by the
// QP's dgid on the fabric, which needs every device's GID table
// registered) and attaches the UD QPs that were attached to the network
// again. The doorbell queues are polled when their workers start
// (backend: a KickReceiver queue is kicked once), which runs the WQEs
// posted before and during the handover and the RNR retries.
func FinishImport(devs []*Device) error {
	for _, d := range devs {
		d.mu.Lock()
		imp := d.imported
		d.imported = nil
		d.mu.Unlock()
		if imp == nil {
			continue
		}
		d.eng.ResolvePeers(imp.peers)
		for _, n := range imp.udNet {
			if err := d.eng.ReattachUD(n); err != nil {
				return fmt.Errorf("rdma: device %s: %w", d.cfg.ID, err)
			}
		}
	}
	return nil
}
