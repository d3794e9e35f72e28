package engine

// keyCache remembers the last MRs and the peer QP a requester QP resolved,
// so that a stream of WQEs naming the same keys does not take the
// registry's lock (a read lock's shared counter bounces between the cores
// of the engines that use a device) for each lookup. An entry is valid
// while its device's gen is what it was before the lookup that filled it:
// the registry bumps gen after it removes an MR or a QP, so an entry never
// outlives the removal of what it names by more than an operation that
// had resolved it already, which doc.go allows ("RemoveMR does not
// wait"). Owned by the QP's requester (sqMu held).
type keyCache struct {
	mrs  [4]mrEntry
	next int // the entry the next miss replaces
	qp   qpEntry
}

type mrEntry struct {
	dev *RNIC
	key uint32
	gen uint64
	mr  *MR
}

type qpEntry struct {
	dev *RNIC
	num uint32
	gen uint64
	qp  *QP
}

// mr is dev.LookupMR(key) through the cache.
func (c *keyCache) mr(dev *RNIC, key uint32) *MR {
	gen := dev.gen.Load()
	for i := range c.mrs {
		if e := &c.mrs[i]; e.dev == dev && e.key == key && e.gen == gen && e.mr != nil {
			return e.mr
		}
	}
	m := dev.LookupMR(key)
	if m != nil {
		c.mrs[c.next] = mrEntry{dev: dev, key: key, gen: gen, mr: m}
		c.next = (c.next + 1) % len(c.mrs)
	}
	return m
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
