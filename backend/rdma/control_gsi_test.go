package rdma

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The control side of docs/spec.md § Kernel verbs and the GSI QP.

// TestDeviceCapsGSI: a software-RNIC device offers GSI; a host NIC's
// device does not, and answers UNSUPPORTED to DMA REG_MR and GSI
// CREATE_QP.
func TestDeviceCapsGSI(t *testing.T) {
	d, _, done := attached(t)
	defer done()
	if got := d.ConfigSpace().DeviceCaps; got != abi.DeviceCapGSI {
		t.Errorf("device_caps: got %#x, want GSI", got)
	}
	n, err := New(Config{ID: "nic", NIC: stubNIC{}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if got := n.ConfigSpace().DeviceCaps; got != 0 {
		t.Errorf("device_caps on a host NIC: got %#x, want 0", got)
	}
	n.res = &resources{} // as attached
	for _, c := range []struct {
		name string
		op   abi.Opcode
		req  []byte
	}{
		{"DMA REG_MR", abi.CmdRegMR, abi.Marshal(&abi.RegMR{PDN: 1, Flags: abi.RegMRFlagDMA})},
		{"GSI CREATE_QP", abi.CmdCreateQP, qpReq(1, 1, 0, func(c *abi.CreateQP) { c.QPType = abi.QPTypeGSI })},
	} {
		if _, st := n.command(c.op, c.req, nil); st != abi.StatusUnsupported {
			t.Errorf("%s on a host NIC: got %v, want UNSUPPORTED", c.name, st)
		}
	}
}

// TestRegMRDMA checks REG_MR with flags DMA: what it accepts, what is
// INVALID, NOT_FOUND and NO_RESOURCES, that it pins nothing and counts
// against max_mr, and that the MR translates guest-physical addresses.
func TestRegMRDMA(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	pdn := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreatePD, nil))
	dma := func(mod func(*abi.RegMR)) []byte {
		m := abi.RegMR{PDN: pdn, Access: abi.AccessLocalWrite, Flags: abi.RegMRFlagDMA}
		if mod != nil {
			mod(&m)
		}
		return abi.Marshal(&m)
	}
	cases := []struct {
		name string
		req  []byte
		want abi.Status
	}{
		{"local write", dma(nil), abi.StatusOK},
		{"no access", dma(func(m *abi.RegMR) { m.Access = 0 }), abi.StatusOK},
		{"remote read", dma(func(m *abi.RegMR) { m.Access = abi.AccessRemoteRead }), abi.StatusInvalid},
		{"remote write", dma(func(m *abi.RegMR) { m.Access |= abi.AccessRemoteWrite }), abi.StatusInvalid},
		{"iova", dma(func(m *abi.RegMR) { m.IOVA = 0x1000 }), abi.StatusInvalid},
		{"length", dma(func(m *abi.RegMR) { m.Length = 0x1000 }), abi.StatusInvalid},
		{"page_shift", dma(func(m *abi.RegMR) { m.PageShift = 12 }), abi.StatusInvalid},
		{"npages", dma(func(m *abi.RegMR) { m.NPages = 1 }), abi.StatusInvalid},
		{"page_list", dma(func(m *abi.RegMR) { m.PageList = 0x2000 }), abi.StatusInvalid},
		{"inline page", append(dma(nil), make([]byte, 8)...), abi.StatusInvalid},
		{"unknown flag", dma(func(m *abi.RegMR) { m.Flags |= 2 }), abi.StatusInvalid},
		{"unknown flag without DMA", dma(func(m *abi.RegMR) { m.Flags = 1 << 31 }), abi.StatusInvalid},
		{"reserved", dma(func(m *abi.RegMR) { m.Reserved = 1 }), abi.StatusInvalid},
		{"no pd", dma(func(m *abi.RegMR) { m.PDN = pdn + 1 }), abi.StatusNotFound},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := d.Stats()
			out, st := d.command(abi.CmdRegMR, c.req, tbl)
			if st != c.want {
				t.Fatalf("REG_MR: got %v, want %v", st, c.want)
			}
			if s := d.Stats(); s.Pin.PinnedBytes != before.Pin.PinnedBytes {
				t.Fatalf("pinned %d bytes, want %d", s.Pin.PinnedBytes, before.Pin.PinnedBytes)
			}
			if st != abi.StatusOK {
				if d.Stats().MRs != before.MRs {
					t.Fatal("a failed REG_MR added an MR")
				}
				return
			}
			var k abi.MRKeys
			if err := abi.Unmarshal(out, &k); err != nil {
				t.Fatal(err)
			}
			mr := d.eng.LookupMR(k.LKey)
			if mr == nil || !mr.DMA || mr.PD != pdn || k.RKey != k.LKey || mr.Remote() {
				t.Fatalf("MR %+v, keys %+v: want a local DMA MR of the PD", mr, k)
			}
			// Guest-physical addresses, the whole range checked.
			if !mr.Local(tbl, 0x3000, 0x100) || mr.Local(tbl, guestSize-8, 16) || mr.Local(tbl, ^uint64(0)-4, 16) {
				t.Fatal("Local: wrong view of guest memory")
			}
			base, _ := tbl.Slice(0, guestSize)
			if err := mr.Range(tbl, 0x3000, 0x100, func(b []byte) error {
				if &b[0] != &base[0x3000] || len(b) != 0x100 {
					t.Error("Range: a view at the wrong place")
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			mustCmd(t, d, tbl, abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: k.LKey}))
		})
	}

	// max_mr counts DMA MRs; DESTROY_PD is BUSY while one names the PD.
	d.conf.MaxMR = 1
	var k abi.MRKeys
	if err := abi.Unmarshal(mustCmd(t, d, tbl, abi.CmdRegMR, dma(nil)), &k); err != nil {
		t.Fatal(err)
	}
	if _, st := d.command(abi.CmdRegMR, dma(nil), tbl); st != abi.StatusNoResources {
		t.Errorf("REG_MR beyond max_mr: got %v, want NO_RESOURCES", st)
	}
	if _, st := d.command(abi.CmdDestroyPD, abi.Marshal(&abi.Handle{Handle: pdn}), tbl); st != abi.StatusBusy {
		t.Errorf("DESTROY_PD under a DMA MR: got %v, want BUSY", st)
	}
	mustCmd(t, d, tbl, abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: k.LKey}))
	mustCmd(t, d, tbl, abi.CmdDestroyPD, abi.Marshal(&abi.Handle{Handle: pdn}))
}

// TestCreateQPGSI: one GSI QP per device (BUSY while it exists, changing
// nothing), free again once destroyed; it follows UD's transition table.
func TestCreateQPGSI(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	pdn, cqn := pdCQ(t, d, tbl)
	gsi := qpReq(pdn, cqn, 0, func(c *abi.CreateQP) { c.QPType = abi.QPTypeGSI })
	h := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateQP, gsi))
	if h == abi.GSIQPN {
		t.Fatal("the GSI QP's handle is QP 1")
	}
	before := d.Stats()
	if _, st := d.command(abi.CmdCreateQP, gsi, tbl); st != abi.StatusBusy {
		t.Fatalf("second GSI QP: got %v, want BUSY", st)
	}
	if s := d.Stats(); s.QPs != before.QPs || s.Pin.PinnedBytes != before.Pin.PinnedBytes {
		t.Fatal("a refused GSI QP changed the device")
	}
	// UD's table: RESET→INIT with the GSI Q_Key, then RTR and RTS; RC's
	// attributes are INVALID.
	for _, c := range []struct {
		a    abi.QPAttr
		want abi.Status
	}{
		{abi.QPAttr{QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAccessFlags, PortNum: 1}, abi.StatusInvalid},
		{abi.QPAttr{QPState: abi.QPSInit, AttrMask: abi.QPAttrState | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrQKey, PortNum: 1, QKey: abi.GSIQKey}, abi.StatusOK},
		{abi.QPAttr{QPState: abi.QPSRTR, AttrMask: abi.QPAttrState}, abi.StatusOK},
		{abi.QPAttr{QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrSQPSN}, abi.StatusOK},
	} {
		c.a.QPN = h
		if _, st := d.command(abi.CmdModifyQP, abi.Marshal(&c.a), tbl); st != c.want {
			t.Fatalf("MODIFY_QP to %d: got %v, want %v", c.a.QPState, st, c.want)
		}
	}
	mustCmd(t, d, tbl, abi.CmdDestroyQP, abi.Marshal(&abi.Handle{Handle: h}))
	h2 := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreateQP, gsi))
	mustCmd(t, d, tbl, abi.CmdDestroyQP, abi.Marshal(&abi.Handle{Handle: h2}))
}
