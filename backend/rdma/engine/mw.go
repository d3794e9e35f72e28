package engine

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Memory windows and fast registration (docs/spec.md § Memory windows and
// fast registration): the objects whose key byte (bits 0–7) the consumer
// changes at each bind or registration, found by their index (bits 8–31,
// fixed for their life).
//
// Their state is an immutable value behind an atomic pointer, replaced
// whole under the object's mu by whoever changes it (a bind, fast
// registration or invalidation on a QP's send engine, a SEND_WITH_INV on
// a responder, DEALLOC_MW or DEREG_MR on the control path): the data path
// reads it with one load and no lock, and a key cache entry is valid
// while the pointer it was filled from is still the current one
// (keyCache), so no cache serves a key byte, a window or a registration
// that has changed.
//
// A window holds the MR it is bound in (MR.windows, under MR.bindMu):
// DEREG_MR answers BUSY and a fast registration cannot be invalidated
// while it does. Lock order: RNIC.mu, then MW.mu or FRMR.mu, then
// MR.bindMu (a leaf).

// Errors of memory windows and ALLOC_MR MRs.
var (
	ErrNoMR   = errors.New("no such memory region")
	ErrMRBusy = errors.New("a memory window is bound in the memory region")
	ErrNoMW   = errors.New("no such memory window")
)

// MW is a memory window (ALLOC_MW).
type MW struct {
	Index uint32 // bits 8–31 of its rkey (immutable)
	PD    uint32 // immutable
	Type  uint32 // abi.MWType1 or abi.MWType2 (immutable)

	mu    sync.Mutex              // serialises changes of state
	state atomic.Pointer[mwState] // never nil once added; replaced, never modified
}

// mwState is a window's state at one time.
type mwState struct {
	key    uint32 // the current rkey
	mr     *MR    // the MR the window is bound in; nil: free
	addr   uint64 // the window, in mr's IOVA space
	length uint64
	access uint32 // REMOTE_* bits the window grants
	qp     *QP    // a type 2 window: the QP it is bound to
	dead   bool   // deallocated (or the device reset)
}

// FRMR is an MR for fast registration (ALLOC_MR): free until a REG_MR
// WQE registers memory in it.
type FRMR struct {
	Index    uint32 // bits 8–31 of its keys (immutable)
	PD       uint32 // immutable
	MaxPages uint32 // pages one registration may list (immutable)
	MaxLen   uint64 // the device's max_mr_size (immutable)

	mu    sync.Mutex
	state atomic.Pointer[frState] // as MW.state
}

// frState is an ALLOC_MR MR's state at one time.
type frState struct {
	key  uint32 // its lkey and rkey
	mr   *MR    // the registration (MR.Fast); nil: free
	dead bool
}

// NewMW returns a free window with rkey key.
func NewMW(key, pd, typ uint32) *MW {
	w := &MW{Index: key >> 8, PD: pd, Type: typ}
	w.state.Store(&mwState{key: key})
	return w
}

// Key returns the window's current rkey.
func (w *MW) Key() uint32 { return w.state.Load().key }

// Bound reports whether the window is bound.
func (w *MW) Bound() bool { return w.state.Load().mr != nil }

// NewFRMR returns a free ALLOC_MR MR with keys key.
func NewFRMR(key, pd, maxPages uint32, maxLen uint64) *FRMR {
	f := &FRMR{Index: key >> 8, PD: pd, MaxPages: maxPages, MaxLen: maxLen}
	f.state.Store(&frState{key: key})
	return f
}

// Key returns the MR's current key.
func (f *FRMR) Key() uint32 { return f.state.Load().key }

// Registered returns the current registration, or nil while free.
func (f *FRMR) Registered() *MR { return f.state.Load().mr }

// holdWindow counts a window bound in m; false once m left its table.
func (m *MR) holdWindow() bool {
	m.bindMu.Lock()
	defer m.bindMu.Unlock()
	if m.retired {
		return false
	}
	m.windows++
	return true
}

// dropWindow counts a window unbound from m.
func (m *MR) dropWindow() {
	m.bindMu.Lock()
	defer m.bindMu.Unlock()
	if m.windows > 0 {
		m.windows--
	}
}

// retire marks m gone, so that nothing binds in it any more; false (and
// nothing changes) while a window is bound in it.
func (m *MR) retire() bool {
	m.bindMu.Lock()
	defer m.bindMu.Unlock()
	if m.windows > 0 {
		return false
	}
	m.retired = true
	return true
}

// AddMW makes w reachable by its index; it holds its PD (ErrNoPD).
func (d *RNIC) AddMW(w *MW) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.holdPDLocked(w.PD); err != nil {
		return err
	}
	d.mws[w.Index] = w
	return nil
}

// RemoveMW deallocates the window whose rkey has key's index, whatever
// its key byte ("DEALLOC_MW names the MW by its rkey, any key byte; it
// frees a bound window too"). ErrNoMW if there is none.
func (d *RNIC) RemoveMW(key uint32) error {
	d.mu.Lock()
	w := d.mws[key>>8]
	if w == nil {
		d.mu.Unlock()
		return ErrNoMW
	}
	delete(d.mws, w.Index)
	d.releasePDLocked(w.PD)
	d.mu.Unlock()
	w.kill()
	return nil
}

// kill moves w to the dead state and releases its MR.
func (w *MW) kill() {
	w.mu.Lock()
	st := w.state.Load()
	w.state.Store(&mwState{key: st.key, dead: true})
	w.mu.Unlock()
	if st.mr != nil {
		st.mr.dropWindow()
	}
}

// AddFRMR makes f reachable by its index; it holds its PD (ErrNoPD).
func (d *RNIC) AddFRMR(f *FRMR) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.holdPDLocked(f.PD); err != nil {
		return err
	}
	d.frmrs[f.Index] = f
	return nil
}

// LookupMW returns the window with key's index, or nil.
func (d *RNIC) LookupMW(key uint32) *MW {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.mws[key>>8]
}

// LookupFRMR returns the ALLOC_MR MR with key's index, or nil.
func (d *RNIC) LookupFRMR(key uint32) *FRMR {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.frmrs[key>>8]
}

// DeregMR removes the MR with key: an ordinary MR by its key, which it
// returns (its pages are the caller's to unpin), or an ALLOC_MR MR by its
// index, registered or free ("DEREG_MR frees it in either state"; any key
// byte, since the consumer's idea of the current one may be ahead of a
// registration that failed), for which it returns nil. ErrNoMR: no such
// MR; ErrMRBusy: a window is bound in it, and nothing changed.
func (d *RNIC) DeregMR(key uint32) (*MR, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := d.mrs[key]; m != nil {
		if !m.retire() {
			return nil, ErrMRBusy
		}
		delete(d.mrs, key)
		if d.mrIdx[key>>8]--; d.mrIdx[key>>8] <= 0 {
			delete(d.mrIdx, key>>8)
		}
		d.gen.Add(1) // after the delete: see keyCache
		d.releasePDLocked(m.PD)
		m.closeNIC()
		return m, nil
	}
	f := d.frmrs[key>>8]
	if f == nil {
		return nil, ErrNoMR
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.state.Load()
	if st.mr != nil && !st.mr.retire() {
		return nil, ErrMRBusy
	}
	f.state.Store(&frState{key: st.key, dead: true})
	delete(d.frmrs, f.Index)
	d.releasePDLocked(f.PD)
	return nil, nil
}

// lookupLKey resolves an lkey (or an MR's rkey): an ordinary MR, or the
// current registration of an ALLOC_MR MR with f and the state it was read
// from (for keyCache).
func (d *RNIC) lookupLKey(key uint32) (*MR, *FRMR, *frState) {
	d.mu.RLock()
	m, f := d.mrs[key], d.frmrs[key>>8]
	d.mu.RUnlock()
	if m != nil || f == nil {
		return m, nil, nil
	}
	// "A key is honoured only with its current key byte."
	if st := f.state.Load(); st.key == key && st.mr != nil {
		return st.mr, f, st
	}
	return nil, nil, nil
}

// lookupWindow resolves an rkey that names a bound window, with its
// current key byte: the window and the state read.
func (d *RNIC) lookupWindow(key uint32) (*MW, *mwState) {
	d.mu.RLock()
	w := d.mws[key>>8]
	d.mu.RUnlock()
	if w == nil {
		return nil, nil
	}
	if st := w.state.Load(); st.key == key && st.mr != nil {
		return w, st
	}
	return nil, nil
}

// takeKeyedLocked empties the window and ALLOC_MR tables (Reset) and
// returns what they held, for killKeyed. Precondition: mu held.
func (d *RNIC) takeKeyedLocked() ([]*MW, []*FRMR) {
	mws := make([]*MW, 0, len(d.mws))
	for _, w := range d.mws {
		mws = append(mws, w)
	}
	frs := make([]*FRMR, 0, len(d.frmrs))
	for _, f := range d.frmrs {
		frs = append(frs, f)
	}
	clear(d.mws)
	clear(d.frmrs)
	return mws, frs
}

// killKeyed moves the objects Reset removed to their dead states, so
// that no key cache of another device's QP serves them.
func killKeyed(mws []*MW, frs []*FRMR) {
	for _, w := range mws {
		w.kill()
	}
	for _, f := range frs {
		f.mu.Lock()
		f.state.Store(&frState{key: f.state.Load().key, dead: true})
		f.mu.Unlock()
	}
}

// Invalidate answers the IETH of a SEND with invalidate from the network
// (rc.Host): the same-host responder's rule (sendInv), with this QP as the
// responder.
func (n *netQP) Invalidate(rkey uint32, commit bool) bool {
	return n.q.Dev != nil && n.q.Dev.invalidate(rkey, n.q, true, commit)
}

// invalidate frees what key names for an invalidation from QP q: "the
// type 2 MW bound to a QP of the same PD, or the registered
// fast-registration MR of that PD, whose current key is" key (LOCAL_INV);
// remote (SEND_WITH_INV, q the responder): "the type 2 MW bound to the
// responder QP or the registered fast-registration MR of the responder
// QP's PD". A fast registration a window is bound in is not
// invalidated. commit false only checks. It reports whether key named
// such an object (and, with commit, freed it).
func (d *RNIC) invalidate(key uint32, q *QP, remote, commit bool) bool {
	d.mu.RLock()
	w, f := d.mws[key>>8], d.frmrs[key>>8]
	d.mu.RUnlock()
	switch {
	case w != nil:
		if w.Type != abi.MWType2 || w.PD != q.PD {
			return false
		}
		w.mu.Lock()
		st := w.state.Load()
		if st.dead || st.mr == nil || st.key != key || (remote && st.qp != q) {
			w.mu.Unlock()
			return false
		}
		if commit {
			w.state.Store(&mwState{key: key})
		}
		w.mu.Unlock()
		if commit {
			st.mr.dropWindow()
		}
		return true
	case f != nil:
		if f.PD != q.PD {
			return false
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		st := f.state.Load()
		if st.dead || st.mr == nil || st.key != key {
			return false
		}
		if !commit {
			st.mr.bindMu.Lock()
			free := st.mr.windows == 0
			st.mr.bindMu.Unlock()
			return free
		}
		if !st.mr.retire() {
			return false
		}
		f.state.Store(&frState{key: key})
		return true
	}
	return false
}
