package rdma

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// regMRReq builds a REG_MR request with an inline page list.
func regMRReq(pdn uint32, iova, length uint64, shift uint32, pages ...uint64) []byte {
	req := abi.Marshal(&abi.RegMR{PDN: pdn, Access: abi.AccessLocalWrite, IOVA: iova, Length: length,
		PageShift: shift, NPages: uint32(len(pages))})
	for _, p := range pages {
		req = binary.LittleEndian.AppendUint64(req, p)
	}
	return req
}

// TestRegMRLargePages registers MRs with page lists of large pages: the
// device pins exactly the 4 KiB pages holding the region's bytes, keeps
// the MR as contiguous runs, and refuses what the spec refuses.
func TestRegMRLargePages(t *testing.T) {
	d, tbl, done := attached(t)
	defer done()
	out, st := d.command(abi.CmdCreatePD, nil, tbl)
	if st != abi.StatusOK {
		t.Fatalf("CREATE_PD: %v", st)
	}
	pdn := binary.LittleEndian.Uint32(out)

	// 128 KiB from 0x3100 in 64 KiB pages: three entries, 0x21 small pages pinned.
	out, st = d.command(abi.CmdRegMR, regMRReq(pdn, 0x3100, 0x20000, 16, 0, 0x10000, 0x20000), tbl)
	if st != abi.StatusOK {
		t.Fatalf("REG_MR 64 KiB pages: %v", st)
	}
	key := binary.LittleEndian.Uint32(out)
	if got := d.Stats().Pin.PinnedBytes; got != 0x21000 {
		t.Errorf("pinned %#x bytes, want %#x", got, 0x21000)
	}
	base, _ := tbl.Slice(0, guestSize)
	var views int
	err := d.eng.LookupMR(key).Range(tbl, 0x3100, 0x20000, func(b []byte) error {
		views++
		if &b[0] != &base[0x3100] || len(b) != 0x20000 {
			t.Errorf("view of %d bytes at the wrong place", len(b))
		}
		return nil
	})
	if err != nil || views != 1 {
		t.Errorf("Range: %v, %d views, want one", err, views)
	}
	if _, st := d.command(abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: key}), tbl); st != abi.StatusOK {
		t.Fatalf("DEREG_MR: %v", st)
	}
	if got := d.Stats().Pin.PinnedBytes; got != 0 {
		t.Errorf("pinned %#x bytes after DEREG_MR", got)
	}

	// A 1 GiB page reaching far beyond the 1 MiB of guest memory: only
	// the region's bytes must be in memory.
	out, st = d.command(abi.CmdRegMR, regMRReq(pdn, 0x1000, 0x1000, 30, 0), tbl)
	if st != abi.StatusOK {
		t.Fatalf("REG_MR 1 GiB page: %v", st)
	}
	if got := d.Stats().Pin.PinnedBytes; got != 0x1000 {
		t.Errorf("pinned %#x bytes, want one page", got)
	}
	if _, st := d.command(abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: binary.LittleEndian.Uint32(out)}), tbl); st != abi.StatusOK {
		t.Fatalf("DEREG_MR: %v", st)
	}

	// The translation budget: one page listed eight times is eight runs.
	d.cfg.Limits.MaxMRExtents = 10
	same := []uint64{0x5000, 0x5000, 0x5000, 0x5000, 0x5000, 0x5000, 0x5000, 0x5000}
	out, st = d.command(abi.CmdRegMR, regMRReq(pdn, 0x5000, 8*4096, 12, same...), tbl)
	if st != abi.StatusOK {
		t.Fatalf("REG_MR of a repeated page: %v", st)
	}
	if _, st := d.command(abi.CmdRegMR, regMRReq(pdn, 0x5000, 8*4096, 12, same...), tbl); st != abi.StatusNoResources {
		t.Errorf("REG_MR beyond the extent budget: %v, want NO_RESOURCES", st)
	}
	if got := d.Stats(); got.MRs != 1 || got.Pin.PinnedBytes != 0x1000 {
		t.Errorf("after the refused REG_MR: %d MRs, %#x bytes pinned", got.MRs, got.Pin.PinnedBytes)
	}
	if _, st := d.command(abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: binary.LittleEndian.Uint32(out)}), tbl); st != abi.StatusOK {
		t.Fatalf("DEREG_MR: %v", st)
	}
	if _, st := d.command(abi.CmdRegMR, regMRReq(pdn, 0x5000, 8*4096, 12, same...), tbl); st != abi.StatusOK {
		t.Errorf("REG_MR after DEREG_MR gave the budget back: %v", st)
	}
	d.Reset()
	out, _ = d.command(abi.CmdCreatePD, nil, tbl)
	pdn = binary.LittleEndian.Uint32(out)

	for _, tt := range []struct {
		name string
		req  []byte
		want abi.Status
	}{
		{"page_shift 31", regMRReq(pdn, 0, 0x1000, 31, 0), abi.StatusInvalid},
		{"page_shift 11", regMRReq(pdn, 0, 0x800, 11, 0), abi.StatusInvalid},
		{"page_shift 64", regMRReq(pdn, 0, 0x1000, 64, 0), abi.StatusInvalid},
		{"entry not aligned to the page size", regMRReq(pdn, 0x1000, 0x1000, 16, 0x1000), abi.StatusInvalid},
		{"npages one short", regMRReq(pdn, 0xf000, 0x2000, 16, 0), abi.StatusInvalid},
		{"npages one too many", regMRReq(pdn, 0, 0x10000, 16, 0, 0x10000), abi.StatusInvalid},
		{"bytes beyond memory", regMRReq(pdn, 0xf0000, 0x20000, 16, 0xf0000&^0xffff, 0x100000), abi.StatusFault},
		{"large page at the top of the address space", regMRReq(pdn, 1<<63|0x3000, 0x1000, 30, 1<<63), abi.StatusFault},
	} {
		if _, st := d.command(abi.CmdRegMR, tt.req, tbl); st != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, st, tt.want)
		}
		if got := d.Stats(); got.Pin.PinnedBytes != 0 || got.MRs != 0 {
			t.Errorf("%s: left %d MRs and %d pinned bytes", tt.name, got.MRs, got.Pin.PinnedBytes)
		}
	}
}

// attachedFile is attached with the guest memory's file kept open, so that
// a test can map the same memory anew as a front-end's SET_MEM_TABLE does.
func attachedFile(t *testing.T) (d *Device, mem *memmap.Memory, file int, done func()) {
	t.Helper()
	d, mem, file, done = attachedMem(t, nil, "pins", true)
	d.MemoryChanged()
	return d, mem, file, done
}

// TestRegMRPinsAcrossMemTable is security issue 25, item 4, through the
// control path: MR1, a CQ and a QP created on table T1 keep their pins when
// the front-end switches to T2 (SET_MEM_TABLE with the same memory mapped
// anew, or other memory at the same addresses, or REM_MEM_REG of the
// region); MR2 registered on T2 over MR1's pages gets its own; DEREG_MR of
// MR1 unpins MR1's pages and never MR2's; when every object is gone nothing
// is pinned. Before pins had owners, the table change dropped MR1's and the
// rings' pins (pinned bytes fell to 0) and DEREG_MR of MR1 unpinned MR2.
func TestRegMRPinsAcrossMemTable(t *testing.T) {
	const (
		mrPages   = 4 * abi.PageSize // MR1 and MR2: [0x10000, 0x14000)
		ringPages = 5 * abi.PageSize // CQ ring + record, SQ + RQ + QP record
	)
	tests := []struct {
		name string
		// next maps T2: nil for REM_MEM_REG of the only region.
		next func(t *testing.T, file int) *memmap.Region
		// both is what is pinned with MR2 registered too (0: no MR2).
		both uint64
	}{
		{"same memory mapped anew", func(t *testing.T, file int) *memmap.Region {
			fd, err := unix.FcntlInt(uintptr(file), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			r, err := memmap.MapRegion(fd, memmap.RegionSpec{Size: guestSize, UserAddr: 2 << 40})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}, mrPages + ringPages + mrPages},
		{"other memory at the same addresses", func(t *testing.T, file int) *memmap.Region {
			fd, err := memmap.NewMemfd("other", guestSize)
			if err != nil {
				t.Fatal(err)
			}
			r, err := memmap.MapRegion(fd, memmap.RegionSpec{Size: guestSize, UserAddr: 1 << 40})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}, mrPages + ringPages + mrPages},
		{"region removed", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, mem, file, done := attachedFile(t)
			defer done()
			t1 := mem.Acquire()
			cmd := func(tbl *memmap.Table, op abi.Opcode, req []byte) []byte {
				t.Helper()
				out, st := d.command(op, req, tbl)
				if st != abi.StatusOK {
					t.Fatalf("%v: %v", op, st)
				}
				return out
			}
			pinned := func(what string, want uint64) {
				t.Helper()
				if got := d.Stats().Pin.PinnedBytes; got != want {
					t.Errorf("%s: got %#x bytes pinned, want %#x", what, got, want)
				}
			}
			pdn := binary.LittleEndian.Uint32(cmd(t1, abi.CmdCreatePD, nil))
			mr1 := binary.LittleEndian.Uint32(cmd(t1, abi.CmdRegMR, regMRReq(pdn, 0x10000, mrPages, 12,
				0x10000, 0x11000, 0x12000, 0x13000)))
			cqn := binary.LittleEndian.Uint32(cmd(t1, abi.CmdCreateCQ, binary.LittleEndian.AppendUint64(
				abi.Marshal(&abi.CreateCQ{CQE: 64, NPages: 1, Record: 0x2000}), 0x3000)))
			qpReq := abi.Marshal(&abi.CreateQP{PDN: pdn, SendCQN: cqn, RecvCQN: cqn, QPType: abi.QPTypeRC,
				MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, SQWQEShift: 7, RQWQEShift: 5,
				SQNPages: 1, RQNPages: 1, Record: 0x4000})
			qpReq = binary.LittleEndian.AppendUint64(qpReq, 0x6000)
			qpReq = binary.LittleEndian.AppendUint64(qpReq, 0x7000)
			qpn := binary.LittleEndian.Uint32(cmd(t1, abi.CmdCreateQP, qpReq))
			pinned("on T1", mrPages+ringPages)

			// The front-end switches tables: the session swaps, then
			// tells the device.
			t2 := memmap.EmptyTable()
			if tc.next != nil {
				r := tc.next(t, file)
				var err error
				t2, err = memmap.NewTable([]*memmap.Region{r})
				r.Release()
				if err != nil {
					t.Fatal(err)
				}
			}
			mem.Swap(t2)
			d.MemoryChanged()
			t1.Release()
			pinned("after the table change", mrPages+ringPages)

			cur := mem.Acquire()
			defer cur.Release()
			var mr2 uint32
			if tc.both != 0 {
				mr2 = binary.LittleEndian.Uint32(cmd(cur, abi.CmdRegMR, regMRReq(pdn, 0x10000, mrPages, 12,
					0x10000, 0x11000, 0x12000, 0x13000)))
				pinned("MR2 registered on T2", tc.both)
			}
			cmd(cur, abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: mr1}))
			want := uint64(ringPages)
			if tc.both != 0 {
				want += mrPages
			}
			pinned("after DEREG_MR MR1", want)
			if tc.both != 0 {
				if got := d.pinner.OwnerPinned(d.eng.LookupMR(mr2)); got != mrPages {
					t.Errorf("MR2 holds %#x bytes, want %#x", got, mrPages)
				}
			}
			cmd(cur, abi.CmdDestroyQP, abi.Marshal(&abi.Handle{Handle: qpn}))
			cmd(cur, abi.CmdDestroyCQ, abi.Marshal(&abi.Handle{Handle: cqn}))
			if tc.both != 0 {
				pinned("MR2 alone", mrPages)
				cmd(cur, abi.CmdDeregMR, abi.Marshal(&abi.Handle{Handle: mr2}))
			}
			pinned("every object gone", 0)
			if got := d.pinner.Owners(); got != 0 {
				t.Errorf("every object gone: %d pin owners left, want 0", got)
			}
		})
	}
}
