package engine

import (
	"encoding/binary"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The memory operations of a send queue (docs/spec.md § Memory windows and
// fast registration): BIND_MW, REG_MR and LOCAL_INV run on the QP's own
// device, in send queue order, and move no data; the objects they change
// are in mw.go.

// memWQE is the validated copy of a vrdma_bind_mw_wqe or a
// vrdma_reg_mr_wqe (the fields of both, by meaning).
type memWQE struct {
	key       uint32 // bind: mw; reg: mr — by its current key
	newKey    uint32 // new_rkey, new_key
	lkey      uint32 // bind: the MR the window lies in
	access    uint32
	addr      uint64 // bind: addr; reg: iova
	length    uint64
	pageList  uint64 // reg
	npages    uint32 // reg
	pageShift uint32 // reg
}

// memFlags are the flags a BIND_MW or REG_MR WQE may carry: "SIGNALED,
// FENCE as in vrdma_send_wqe; others zero".
const memFlags = abi.WRFlagSignaled | abi.WRFlagFence

// windowAccess is what a window may grant: "REMOTE_WRITE 2, REMOTE_READ 4,
// REMOTE_ATOMIC 8; other bits MW_BIND_ERR".
const windowAccess = abi.AccessRemoteWrite | abi.AccessRemoteRead | abi.AccessRemoteAtomic

// isMemOp reports whether op is a memory operation of the send queue.
func isMemOp(op uint8) bool {
	return op == abi.WROpBindMW || op == abi.WROpRegMR || op == abi.WROpLocalInv
}

// decodeMem decodes a BIND_MW or REG_MR WQE (b[8] is the opcode, b holds
// at least the 64-byte header) into w: flags SIGNALED and FENCE only,
// reserved bytes zero, and an RC QP's (ud false). wr_id and opcode are
// filled even when it fails.
func decodeMem(b []byte, ud bool) (w sendWQE, ok bool) {
	le := binary.LittleEndian
	w.wrID, w.opcode, w.flags = le.Uint64(b[0:]), b[8], b[9]
	if ud || w.flags&^memFlags != 0 || le.Uint16(b[10:]) != 0 {
		return w, false
	}
	m := &w.mem
	m.key = le.Uint32(b[12:])
	if w.opcode == abi.WROpBindMW {
		m.addr, m.newKey, m.lkey = le.Uint64(b[16:]), le.Uint32(b[24:]), le.Uint32(b[28:])
		m.length, m.access = le.Uint64(b[32:]), le.Uint32(b[40:])
		for _, c := range b[44:64] {
			if c != 0 {
				return w, false
			}
		}
		return w, true
	}
	m.addr, m.newKey, m.access = le.Uint64(b[16:]), le.Uint32(b[24:]), le.Uint32(b[28:])
	m.length, m.pageList = le.Uint64(b[32:]), le.Uint64(b[40:])
	m.npages, m.pageShift = le.Uint32(b[48:]), le.Uint32(b[52:])
	return w, le.Uint64(b[56:]) == 0
}

// runMem executes a memory operation of RC QP q (in RTS, its sqMu held);
// t is q's device's table.
func (q *QP) runMem(t *memmap.Table, w *sendWQE, sc *scratch) outcome {
	switch w.opcode {
	case abi.WROpBindMW:
		if !q.bindMW(&w.mem) {
			return failed(abi.WCMWBindErr)
		}
	case abi.WROpRegMR:
		if !q.fastReg(t, &w.mem, sc) {
			return failed(abi.WCLocQPOpErr)
		}
	default: // LOCAL_INV: imm_data is the key, "a number, as every key"
		if !q.Dev.invalidate(w.imm, q, false, true) {
			return failed(abi.WCLocQPOpErr)
		}
	}
	return succeeded(0)
}

// bindMW binds a window as docs/spec.md § Memory windows and fast
// registration says: "the MW must be of the device and the QP's PD,
// new_rkey must keep its index; a type 2 MW must be free (a type 1 MW may
// be rebound); the MR (lkey) must be of the QP's PD, registered with
// MW_BIND access ..., and hold [addr, addr+length) whole; a window with
// REMOTE_WRITE or REMOTE_ATOMIC needs the MR's LOCAL_WRITE". A type 1
// bind of length 0 frees the window.
func (q *QP) bindMW(b *memWQE) bool {
	d := q.Dev
	w := d.LookupMW(b.key)
	if w == nil || w.PD != q.PD || b.newKey>>8 != b.key>>8 || b.access&^windowAccess != 0 {
		return false
	}
	var mr *MR
	if b.length == 0 {
		if w.Type != abi.MWType1 || b.lkey != 0 || b.addr != 0 || b.access != 0 {
			return false
		}
	} else {
		mr = d.LookupMR(b.lkey)
		if mr == nil || mr.PD != q.PD || mr.Access&abi.AccessMWBind == 0 || !mr.Contains(b.addr, b.length) ||
			(b.access&(abi.AccessRemoteWrite|abi.AccessRemoteAtomic) != 0 && mr.Access&abi.AccessLocalWrite == 0) {
			return false
		}
		if !mr.holdWindow() { // deregistered or invalidated meanwhile
			return false
		}
	}
	w.mu.Lock()
	st := w.state.Load()
	if st.dead || st.key != b.key || (w.Type == abi.MWType2 && st.mr != nil) {
		w.mu.Unlock()
		if mr != nil {
			mr.dropWindow()
		}
		return false
	}
	ns := &mwState{key: b.newKey}
	if mr != nil {
		ns.mr, ns.addr, ns.length, ns.access = mr, b.addr, b.length, b.access
		if w.Type == abi.MWType2 {
			ns.qp = q
		}
	}
	w.state.Store(ns)
	w.mu.Unlock()
	if st.mr != nil {
		st.mr.dropWindow() // a type 1 window rebound
	}
	return true
}

// fastReg registers memory in an ALLOC_MR MR (a REG_MR WQE): "the MR must
// be an ALLOC_MR MR of the QP's PD in the free state, new_key must keep
// its index, and the request must satisfy REG_MR's rules (page list in
// guest memory, each page of the region in guest memory, npages within
// the MR's max_pages, REMOTE_WRITE/ATOMIC with LOCAL_WRITE)". The page
// list is read once, here; t is q's device's table.
func (q *QP) fastReg(t *memmap.Table, b *memWQE, sc *scratch) bool {
	f := q.Dev.LookupFRMR(b.key)
	if f == nil || f.PD != q.PD || b.newKey>>8 != b.key>>8 {
		return false
	}
	shift := uint(b.pageShift)
	switch {
	case b.access&^uint32(abi.AccessAll|abi.AccessMWBind) != 0:
		return false
	case b.access&(abi.AccessRemoteWrite|abi.AccessRemoteAtomic) != 0 && b.access&abi.AccessLocalWrite == 0:
		return false
	case shift < abi.PageShift || shift > abi.MaxPageShift:
		return false
	case b.length == 0 || b.length > f.MaxLen || b.addr+b.length < b.addr:
		return false
	case b.npages == 0 || b.npages > f.MaxPages || b.npages > abi.MaxFastRegPages:
		return false
	case uint64(b.npages) != pagesOfShift(b.addr&(1<<shift-1)+b.length, shift):
		return false
	case b.pageList == 0 || b.pageList%8 != 0:
		return false
	}
	src, err := t.Slice(abi.GPA(b.pageList), uint64(b.npages)*8)
	if err != nil {
		return false
	}
	if sc.pages == nil {
		sc.pages = make([]abi.GPA, abi.MaxFastRegPages)
	}
	pages := sc.pages[:b.npages]
	for i := range pages {
		// The guest may change its list meanwhile: each entry is read
		// once, then only the copy is used.
		p := binary.LittleEndian.Uint64(src[8*i:])
		if p&(1<<shift-1) != 0 {
			return false
		}
		pages[i] = abi.GPA(p)
	}
	mr := NewMR(b.newKey, q.PD, b.access, b.addr, b.length, pages, shift)
	mr.Fast, mr.dev = true, q.Dev
	if mr.Extents(func(gpa abi.GPA, n uint64) error {
		return t.ForEach(gpa, n, func([]byte) error { return nil })
	}) != nil {
		return false // a page of the region outside guest memory
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.state.Load()
	if st.dead || st.mr != nil || st.key != b.key {
		return false
	}
	f.state.Store(&frState{key: b.newKey, mr: mr})
	return true
}

// pagesOfShift is ⌈bytes / 2^shift⌉ without overflow.
func pagesOfShift(bytes uint64, shift uint) uint64 {
	n := bytes >> shift
	if bytes&(1<<shift-1) != 0 {
		n++
	}
	return n
}

// remoteKey resolves the rkey of a remote access to responder QP pq whose
// qp_access_flags are qpAccess: "the rkey must name an MR of the peer
// device in the peer QP's PD, the range must lie within it, and the MR
// and the peer QP's qp_access_flags must both allow the operation", or a
// bound window: "an rkey that names a bound MW (index and key byte) is
// honoured as an MR's would be when the responder QP is in the MW's PD, a
// type 2 MW is bound to that very QP, the range lies in the window whole,
// and the window's access and the QP's qp_access_flags both allow the
// operation; the data is the MR's memory at those addresses". It returns
// the MR whose memory the access reaches, or nil (REM_ACCESS_ERR). c, if
// not nil, is the requester's key cache.
func remoteKey(c *keyCache, pq *QP, qpAccess, rkey uint32, addr, n uint64, need uint32) *MR {
	d := pq.Dev
	if qpAccess&need == 0 {
		return nil
	}
	var mr *MR
	if c != nil {
		mr = c.mr(d, rkey)
	} else {
		mr = d.LookupMR(rkey)
	}
	if mr != nil {
		if !mr.Remote() || mr.PD != pq.PD || !mr.Contains(addr, n) || mr.Access&need == 0 {
			return nil
		}
		return mr
	}
	var w *MW
	var st *mwState
	if c != nil {
		w, st = c.window(d, rkey)
	} else {
		w, st = d.lookupWindow(rkey)
	}
	if w == nil || w.PD != pq.PD || (w.Type == abi.MWType2 && st.qp != pq) || st.access&need == 0 {
		return nil
	}
	if addr < st.addr || addr-st.addr > st.length || n > st.length-(addr-st.addr) {
		return nil
	}
	return st.mr
}
