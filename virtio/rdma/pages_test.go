package rdma

import (
	"testing"

	"github.com/vrdma/vrdma/memmap"
)

// TestPageTable checks GPA and PageAddrs of a buffer that is contiguous only
// within pages (a guest transport's hugepage-backed buffer).
func TestPageTable(t *testing.T) {
	// Three pages, the buffer starting 0x100 into the first one.
	b := DMABuf{Addr: 0x50100, Buf: make([]byte, 3*PageSize-0x100),
		Pages: []uint64{0x50000, 0x90000, 0x20000}}
	gpas := []struct {
		off  uint64
		want memmap.GPA
		ok   bool
	}{
		{0, 0x50100, true},
		{PageSize - 0x101, 0x50fff, true},
		{PageSize - 0x100, 0x90000, true},
		{2*PageSize - 0x100, 0x20000, true},
		{3*PageSize - 0x101, 0x20fff, true},
		{3*PageSize - 0x100, 0x21000, true}, // one past the end
		{3*PageSize - 0xff, 0, false},
	}
	for _, tt := range gpas {
		got, err := b.GPA(tt.off)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("GPA(%#x): got %#x, %v, want %#x, ok %v", tt.off, got, err, tt.want, tt.ok)
		}
	}
	pages := []struct {
		off, n uint64
		want   []uint64
		ok     bool
	}{
		{0, 1, []uint64{0x50000}, true},
		{0, PageSize - 0x100, []uint64{0x50000}, true},
		{0, PageSize - 0xff, []uint64{0x50000, 0x90000}, true},
		{PageSize, 2*PageSize - 0x100, []uint64{0x90000, 0x20000}, true},
		{0, 3*PageSize - 0x100, []uint64{0x50000, 0x90000, 0x20000}, true},
		{0, 3 * PageSize, nil, false},
		{0, 0, nil, false},
	}
	for _, tt := range pages {
		got, err := b.PageAddrs(tt.off, tt.n)
		if (err == nil) != tt.ok || !equalU64(got, tt.want) {
			t.Errorf("PageAddrs(%#x, %#x): got %x, %v, want %x, ok %v", tt.off, tt.n, got, err, tt.want, tt.ok)
		}
	}
	if b.Contiguous() {
		t.Error("Contiguous: got true for scattered pages, want false")
	}
	c := DMABuf{Addr: 0x1000, Buf: make([]byte, 2*PageSize), Pages: []uint64{0x1000, 0x2000}}
	if !c.Contiguous() {
		t.Error("Contiguous: got false for adjacent pages, want true")
	}
	short := DMABuf{Addr: 0x1000, Buf: make([]byte, 2*PageSize), Pages: []uint64{0x1000}}
	if got, err := short.PageAddrs(0, 2*PageSize); err == nil || got != nil {
		t.Errorf("short table: got %x, %v, want an error", got, err)
	}
}
