package engine

import (
	"sync"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestMWKeyCacheNeverStale binds and invalidates a type 2 window and
// re-registers a fast MR, over and over, while other goroutines resolve
// their keys through their own caches: after each change a cache that
// served the old key must refuse it, and a lookup of a new key byte must
// find it (run with -race: the data path reads the state without locks).
func TestMWKeyCacheNeverStale(t *testing.T) {
	p := newPair(t, pairOpts{})
	b := p.b
	bm := b.bindMR(t, bindAccess)
	w := newMWOn(t, b.d, abi.MWType2)
	f, list, _ := frSetup(t, b, 4)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c keyCache
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// Whatever key byte: a hit must be the current state.
				k := w.Index<<8 | uint32(i&0xff)
				if m := remoteKey(&c, b.qp, remoteAll, k, bindIOVA, 8, abi.AccessRemoteWrite); m != nil && m != bm {
					t.Error("a window resolved to another MR")
					return
				}
				fk := f.Index<<8 | uint32(i&0xff)
				if m := c.mr(b.d, fk); m != nil && m.Key != fk {
					t.Errorf("fast MR key %#x resolved to a registration with key %#x", fk, m.Key)
					return
				}
			}
		}()
	}
	var c keyCache
	sc := newScratch()
	key, fkey := w.Key(), f.Key()
	for i := range 2000 {
		next := nextKey(key)
		if !b.qp.bindMW(&memWQE{key: key, newKey: next, lkey: bm.Key, addr: bindIOVA, length: 64, access: remoteAll}) {
			t.Fatalf("bind %d failed", i)
		}
		key = next
		if remoteKey(&c, b.qp, remoteAll, key, bindIOVA, 8, abi.AccessRemoteWrite) != bm {
			t.Fatalf("round %d: the bound window does not resolve", i)
		}
		if !b.d.invalidate(key, b.qp, false, true) {
			t.Fatalf("round %d: LOCAL_INV failed", i)
		}
		if remoteKey(&c, b.qp, remoteAll, key, bindIOVA, 8, abi.AccessRemoteWrite) != nil {
			t.Fatalf("round %d: the cache served an invalidated window", i)
		}

		fnext := nextKey(fkey)
		reg := memWQE{key: fkey, newKey: fnext, access: abi.AccessAll, addr: frIOVA, length: frLen, pageList: uint64(list), npages: 3, pageShift: abi.PageShift}
		if !b.qp.fastReg(b.g.tbl, &reg, sc) {
			t.Fatalf("round %d: REG_MR failed", i)
		}
		if m := c.mr(b.d, fkey); m != nil {
			t.Fatalf("round %d: the old key byte resolves", i)
		}
		fkey = fnext
		if m := c.mr(b.d, fkey); m == nil || m.Key != fkey {
			t.Fatalf("round %d: the registration does not resolve", i)
		}
		if !b.d.invalidate(fkey, b.qp, false, true) {
			t.Fatalf("round %d: LOCAL_INV of the fast MR failed", i)
		}
		if c.mr(b.d, fkey) != nil {
			t.Fatalf("round %d: the cache served an invalidated registration", i)
		}
	}
	close(stop)
	wg.Wait()
}
