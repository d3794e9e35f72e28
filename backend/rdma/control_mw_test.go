package rdma

import (
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The control side of docs/spec.md § Memory windows and fast registration.

func keysOf(t *testing.T, out []byte) abi.MRKeys {
	t.Helper()
	var k abi.MRKeys
	if err := abi.Unmarshal(out, &k); err != nil {
		t.Fatal(err)
	}
	return k
}

// TestDeviceCapFlagsMW: a software RNIC offers windows and fast
// registration in device_cap_flags; a host NIC's device offers neither
// and answers UNSUPPORTED to ALLOC_MW, DEALLOC_MW and ALLOC_MR.
func TestDeviceCapFlagsMW(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	var attr abi.DeviceAttr
	if err := abi.Unmarshal(mustCmd(t, d, tbl, abi.CmdQueryDevice, nil), &attr); err != nil {
		t.Fatal(err)
	}
	want := uint32(abi.DevCapMemWindow | abi.DevCapMemMgtExt | abi.DevCapMemWindowType2B)
	if attr.DeviceCapFlags != want {
		t.Errorf("device_cap_flags: got %#x, want %#x", attr.DeviceCapFlags, want)
	}
	n, err := New(Config{ID: "nic", NIC: stubNIC{}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if got := n.deviceAttr().DeviceCapFlags; got != 0 {
		t.Errorf("device_cap_flags on a host NIC: got %#x, want 0", got)
	}
	if n.mrAccess()&abi.AccessMWBind != 0 {
		t.Error("a host NIC's REG_MR accepts MW_BIND")
	}
	n.res = &resources{} // as attached
	for _, c := range []struct {
		name string
		op   abi.Opcode
		req  []byte
	}{
		{"ALLOC_MW", abi.CmdAllocMW, abi.Marshal(&abi.AllocMW{PDN: 1, Type: abi.MWType2})},
		{"DEALLOC_MW", abi.CmdDeallocMW, abi.Marshal(&abi.Handle{Handle: 0x100})},
		{"ALLOC_MR", abi.CmdAllocMR, abi.Marshal(&abi.AllocMR{PDN: 1, MaxPages: 1})},
	} {
		if _, st := n.command(c.op, c.req, nil); st != abi.StatusUnsupported {
			t.Errorf("%s on a host NIC: got %v, want UNSUPPORTED", c.name, st)
		}
	}
}

// TestAllocMW checks ALLOC_MW and DEALLOC_MW: what is INVALID and
// NOT_FOUND, that rkeys never share an index with an MR key, that
// DEALLOC_MW takes any key byte, that MWs hold their PD and count
// against max_mr.
func TestAllocMW(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	pdn := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreatePD, nil))
	for _, c := range []struct {
		name string
		req  []byte
		want abi.Status
	}{
		{"type 1", abi.Marshal(&abi.AllocMW{PDN: pdn, Type: abi.MWType1}), abi.StatusOK},
		{"type 2", abi.Marshal(&abi.AllocMW{PDN: pdn, Type: abi.MWType2}), abi.StatusOK},
		{"type 0", abi.Marshal(&abi.AllocMW{PDN: pdn}), abi.StatusInvalid},
		{"type 3", abi.Marshal(&abi.AllocMW{PDN: pdn, Type: 3}), abi.StatusInvalid},
		{"no PD", abi.Marshal(&abi.AllocMW{PDN: pdn + 1, Type: 1}), abi.StatusNotFound},
		{"short", abi.Marshal(&abi.Handle{Handle: pdn})[:4], abi.StatusInvalid},
		{"long", append(abi.Marshal(&abi.AllocMW{PDN: pdn, Type: 1}), 0), abi.StatusInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, st := d.command(abi.CmdAllocMW, c.req, tbl)
			if st != c.want {
				t.Fatalf("ALLOC_MW: got %v, want %v", st, c.want)
			}
			if st != abi.StatusOK {
				return
			}
			key := handleOf(t, out)
			w := d.eng.LookupMW(key)
			if w == nil || w.Key() != key || w.PD != pdn || w.Bound() {
				t.Fatalf("MW %#x: %+v, want a free window of the PD", key, w)
			}
			if _, st := d.command(abi.CmdDestroyPD, abi.Marshal(&abi.Handle{Handle: pdn}), tbl); st != abi.StatusBusy {
				t.Fatalf("DESTROY_PD with an MW: got %v, want BUSY", st)
			}
			other := key&^0xff | (key+7)&0xff
			mustCmd(t, d, tbl, abi.CmdDeallocMW, abi.Marshal(&abi.Handle{Handle: other}))
			if _, st := d.command(abi.CmdDeallocMW, abi.Marshal(&abi.Handle{Handle: key}), tbl); st != abi.StatusNotFound {
				t.Fatalf("DEALLOC_MW twice: got %v, want NOT_FOUND", st)
			}
		})
	}

	// Indices are unique among MR and MW keys (max_mr is 8 here); MWs
	// count against max_mr.
	idx := map[uint32]bool{}
	for i := range 8 {
		req := abi.Marshal(&abi.AllocMW{PDN: pdn, Type: 1})
		op := abi.CmdAllocMW
		if i%2 == 1 {
			req, op = abi.Marshal(&abi.AllocMR{PDN: pdn, MaxPages: 1}), abi.CmdAllocMR
		}
		key := handleOf(t, mustCmd(t, d, tbl, op, req))
		if idx[key>>8] {
			t.Fatalf("index %#x given twice", key>>8)
		}
		idx[key>>8] = true
	}
	d.conf.MaxMR = uint32(d.eng.Count(engine.KindMR)) // the 8 objects
	if _, st := d.command(abi.CmdAllocMW, abi.Marshal(&abi.AllocMW{PDN: pdn, Type: 2}), tbl); st != abi.StatusNoResources {
		t.Fatalf("ALLOC_MW past max_mr: got %v, want NO_RESOURCES", st)
	}
	if _, st := d.command(abi.CmdAllocMR, abi.Marshal(&abi.AllocMR{PDN: pdn, MaxPages: 1}), tbl); st != abi.StatusNoResources {
		t.Fatalf("ALLOC_MR past max_mr: got %v, want NO_RESOURCES", st)
	}
}

// TestAllocMR checks ALLOC_MR (max_pages bounds, equal keys, a free MR
// that pins nothing), DEREG_MR of it by any key byte, and REG_MR's
// MW_BIND access.
func TestAllocMR(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	pdn := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreatePD, nil))
	for _, c := range []struct {
		max  uint32
		want abi.Status
	}{{0, abi.StatusInvalid}, {1, abi.StatusOK}, {abi.MaxFastRegPages, abi.StatusOK}, {abi.MaxFastRegPages + 1, abi.StatusInvalid}} {
		before := d.Stats()
		out, st := d.command(abi.CmdAllocMR, abi.Marshal(&abi.AllocMR{PDN: pdn, MaxPages: c.max}), tbl)
		if st != c.want {
			t.Fatalf("ALLOC_MR max_pages %d: got %v, want %v", c.max, st, c.want)
		}
		if st != abi.StatusOK {
			continue
		}
		k := keysOf(t, out)
		f := d.eng.LookupFRMR(k.LKey)
		if k.LKey != k.RKey || f == nil || f.MaxPages != c.max || f.Registered() != nil || d.eng.LookupMR(k.LKey) != nil {
			t.Fatalf("ALLOC_MR: keys %+v, MR %+v: want a free MR with equal keys", k, f)
		}
		if s := d.Stats(); s.Pin.PinnedBytes != before.Pin.PinnedBytes || s.MRs != before.MRs+1 {
			t.Fatalf("ALLOC_MR pinned %d bytes, %d MRs", s.Pin.PinnedBytes-before.Pin.PinnedBytes, s.MRs-before.MRs)
		}
		mustCmd(t, d, tbl, abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: k.LKey ^ 0x5a}))
		if _, st := d.command(abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: k.LKey}), tbl); st != abi.StatusNotFound {
			t.Fatalf("DEREG_MR twice: got %v, want NOT_FOUND", st)
		}
	}
	if _, st := d.command(abi.CmdAllocMR, abi.Marshal(&abi.AllocMR{PDN: pdn + 1, MaxPages: 1}), tbl); st != abi.StatusNotFound {
		t.Fatalf("ALLOC_MR without a PD: got %v, want NOT_FOUND", st)
	}

	reg := func(access uint32) []byte {
		req := abi.Marshal(&abi.RegMR{PDN: pdn, Access: access, IOVA: 0x1000, Length: 0x1000, PageShift: 12, NPages: 1})
		return append(req, inlinePages(0x3000)...)
	}
	k := keysOf(t, mustCmd(t, d, tbl, abi.CmdRegMR, reg(abi.AccessLocalWrite|abi.AccessMWBind)))
	if m := d.eng.LookupMR(k.LKey); m == nil || m.Access&abi.AccessMWBind == 0 {
		t.Fatal("REG_MR dropped MW_BIND")
	}
	if _, st := d.command(abi.CmdRegMR, reg(abi.AccessLocalWrite|0x20), tbl); st != abi.StatusInvalid {
		t.Fatalf("REG_MR with access 0x20: got %v, want INVALID", st)
	}
}
