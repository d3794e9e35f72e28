package memmap

import (
	"fmt"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Owners: pins recorded under the object that holds them (see "Owners and
// memory-table changes" in pin.go), so that unpinning never goes through
// a table that may map other memory at the same guest-physical addresses.

// pinSet is what one owner pinned: the runs of each successful pin call,
// as that call pinned them (sorted and disjoint within a call; calls may
// overlap). Each run names its region, which stays tracked while the run
// is here (regionPins.holds). Protected by Pinner.mu.
type pinSet struct {
	calls [][]pinRun
	pages uint64 // pages pinned, counted once per call and multiplicity
}

// PinFor is Pin on behalf of owner, a comparable key the caller chooses
// (the object the pins are for). The pins are recorded under owner and
// dropped by UnpinOwner, in the regions of t they were taken in, whatever
// table is current then. Errors as Pin; on an error nothing was pinned
// and owner's earlier pins are unchanged. owner must not be nil.
//
// The caller holds a reference on t for the duration of the call.
func (p *Pinner) PinFor(owner any, t *Table, gpa abi.GPA, n uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkOwner(owner); err != nil {
		return err
	}
	runs, err := p.rangeRuns(t, gpa, n, p.scratch.runs[:0])
	return p.pinOwned(owner, runs, err)
}

// PinPagesFor is PinPages on behalf of owner, as PinFor.
func (p *Pinner) PinPagesFor(owner any, t *Table, pages []abi.GPA) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkOwner(owner); err != nil {
		return err
	}
	if len(pages) == 0 {
		return nil
	}
	runs, err := p.pageRuns(t, pages, true, p.scratch.runs[:0])
	return p.pinOwned(owner, runs, err)
}

// pinOwned pins runs (unless translating them failed with err) and
// records them under owner; the scratch keeps the runs' array.
// Precondition: p.mu held.
func (p *Pinner) pinOwned(owner any, runs []pinRun, err error) error {
	p.scratch.runs = runs[:0]
	if err != nil {
		return err
	}
	if err := p.pinRuns(runs); err != nil {
		return err
	}
	p.record(owner, runs)
	return nil
}

// UnpinOwner drops every pin recorded under owner, exactly as they were
// taken: the same pages of the same mappings, never pages another owner
// holds, whatever SetTable happened meanwhile. Orphaned regions left
// without pins are forgotten. An unknown owner, or a closed Pinner, does
// nothing.
func (p *Pinner) UnpinOwner(owner any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.owners[owner]
	if s == nil || p.closed {
		return
	}
	delete(p.owners, owner)
	for _, runs := range s.calls {
		p.unpinRuns(runs)
		for _, r := range runs {
			r.rp.holds--
		}
	}
	for _, runs := range s.calls {
		p.dropEmptyOrphans(runs)
	}
}

// OwnerPinned returns the bytes owner's pins name (each pin call counted
// as it pinned, multiplicities included), or 0 for an unknown owner.
func (p *Pinner) OwnerPinned(owner any) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.owners[owner]; s != nil {
		return s.pages * PageSize
	}
	return 0
}

// Owners returns the number of owners holding pins.
func (p *Pinner) Owners() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.owners)
}

// checkOwner refuses a nil owner and a closed Pinner. Precondition: p.mu.
func (p *Pinner) checkOwner(owner any) error {
	if p.closed {
		return ErrClosed
	}
	if owner == nil {
		return fmt.Errorf("nil pin owner: %w", ErrBadRegion)
	}
	return nil
}

// record adds the runs one successful pin call pinned to owner's set.
// Precondition: p.mu.
func (p *Pinner) record(owner any, runs []pinRun) {
	if len(runs) == 0 {
		return
	}
	s := p.owners[owner]
	if s == nil {
		s = &pinSet{}
		p.owners[owner] = s
	}
	kept := make([]pinRun, len(runs))
	copy(kept, runs)
	for _, r := range kept {
		r.rp.holds++
		s.pages += (r.last - r.first + 1) * uint64(r.mult)
	}
	s.calls = append(s.calls, kept)
}
