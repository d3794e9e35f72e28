package rdma

import (
	"encoding/binary"
	"testing"

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
