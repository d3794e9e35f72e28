package engine

// keyCache remembers the last MRs, windows and the peer QP a requester QP
// resolved, so that a stream of WQEs naming the same keys does not take
// the registry's lock (a read lock's shared counter bounces between the
// cores of the engines that use a device) for each lookup.
//
// An ordinary MR's or a QP's entry is valid while its device's gen is
// what it was before the lookup that filled it: the registry bumps gen
// after it removes an MR or a QP, so an entry never outlives the removal
// of what it names by more than an operation that had resolved it
// already, which doc.go allows ("RemoveMR does not wait"). An entry for
// a fast registration or a window (mw.go) is valid while the object's
// state is still the one it was resolved from: every bind, registration,
// invalidation or deallocation replaces the state, so no entry serves a
// key byte, a registration or a window after it changed. Owned by the
// QP's requester (sqMu held).
type keyCache struct {
	mrs  [4]mrEntry
	next int // the entry the next miss replaces
	mws  [2]mwEntry
	mwNx int
	qp   qpEntry
}

type mrEntry struct {
	dev *RNIC
	key uint32
	gen uint64
	mr  *MR
	fr  *FRMR    // a fast registration: valid while fr's state is st
	st  *frState // see fr
}

type mwEntry struct {
	dev *RNIC
	key uint32
	mw  *MW
	st  *mwState // valid while mw's state is st
}

type qpEntry struct {
	dev *RNIC
	num uint32
	gen uint64
	qp  *QP
}

// valid reports whether the entry still names what it was filled with.
func (e *mrEntry) valid(gen uint64) bool {
	if e.fr != nil {
		return e.fr.state.Load() == e.st
	}
	return e.gen == gen
}

// mr is dev.LookupMR(key) through the cache.
func (c *keyCache) mr(dev *RNIC, key uint32) *MR {
	gen := dev.gen.Load()
	for i := range c.mrs {
		if e := &c.mrs[i]; e.dev == dev && e.key == key && e.mr != nil && e.valid(gen) {
			return e.mr
		}
	}
	m, f, st := dev.lookupLKey(key)
	if m != nil {
		c.mrs[c.next] = mrEntry{dev: dev, key: key, gen: gen, mr: m, fr: f, st: st}
		c.next = (c.next + 1) % len(c.mrs)
	}
	return m
}

// window is dev.lookupWindow(key) through the cache.
func (c *keyCache) window(dev *RNIC, key uint32) (*MW, *mwState) {
	for i := range c.mws {
		if e := &c.mws[i]; e.dev == dev && e.key == key && e.mw != nil && e.mw.state.Load() == e.st {
			return e.mw, e.st
		}
	}
	w, st := dev.lookupWindow(key)
	if w != nil {
		c.mws[c.mwNx] = mwEntry{dev: dev, key: key, mw: w, st: st}
		c.mwNx = (c.mwNx + 1) % len(c.mws)
	}
	return w, st
}

// lookupQP is dev.LookupQP(num) through the cache.
func (c *keyCache) lookupQP(dev *RNIC, num uint32) *QP {
	gen := dev.gen.Load()
	if e := &c.qp; e.dev == dev && e.num == num && e.gen == gen && e.qp != nil {
		return e.qp
	}
	q := dev.LookupQP(num)
	if q != nil {
		c.qp = qpEntry{dev: dev, num: num, gen: gen, qp: q}
	}
	return q
}
