package verbs

import (
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestPageTable checks GPA and PageAddrs of a buffer that is contiguous only
// within pages (a guest transport's hugepage-backed buffer).
func TestPageTable(t *testing.T) {
	// Three pages, the buffer starting 0x100 into the first one.
	b := DMABuf{Addr: 0x50100, Buf: make([]byte, 3*abi.PageSize-0x100),
		Pages: []uint64{0x50000, 0x90000, 0x20000}}
	gpas := []struct {
		off  uint64
		want abi.GPA
		ok   bool
	}{
		{0, 0x50100, true},
		{abi.PageSize - 0x101, 0x50fff, true},
		{abi.PageSize - 0x100, 0x90000, true},
		{2*abi.PageSize - 0x100, 0x20000, true},
		{3*abi.PageSize - 0x101, 0x20fff, true},
		{3*abi.PageSize - 0x100, 0x21000, true}, // one past the end
		{3*abi.PageSize - 0xff, 0, false},
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
		{0, abi.PageSize - 0x100, []uint64{0x50000}, true},
		{0, abi.PageSize - 0xff, []uint64{0x50000, 0x90000}, true},
		{abi.PageSize, 2*abi.PageSize - 0x100, []uint64{0x90000, 0x20000}, true},
		{0, 3*abi.PageSize - 0x100, []uint64{0x50000, 0x90000, 0x20000}, true},
		{0, 3 * abi.PageSize, nil, false},
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
	c := DMABuf{Addr: 0x1000, Buf: make([]byte, 2*abi.PageSize), Pages: []uint64{0x1000, 0x2000}}
	if !c.Contiguous() {
		t.Error("Contiguous: got false for adjacent pages, want true")
	}
	short := DMABuf{Addr: 0x1000, Buf: make([]byte, 2*abi.PageSize), Pages: []uint64{0x1000}}
	if got, err := short.PageAddrs(0, 2*abi.PageSize); err == nil || got != nil {
		t.Errorf("short table: got %x, %v, want an error", got, err)
	}
}

// TestMRPages checks that MRPages' list describes the same guest-physical
// bytes as the buffer, in the largest pages the layout allows.
func TestMRPages(t *testing.T) {
	const huge = 2 << 20
	// A buffer starting 4 KiB into a 2 MiB page, made of three "huge
	// pages" that are not adjacent guest-physically.
	hugeBases := []uint64{0x40000000, 0x10000000, 0x7fe00000}
	var table []uint64
	for _, hb := range hugeBases {
		for i := uint64(0); i < huge/abi.PageSize; i++ {
			table = append(table, hb+i*abi.PageSize)
		}
	}
	hb := DMABuf{Addr: abi.GPA(hugeBases[0] + abi.PageSize + 100), Pages: table[1:], Buf: make([]byte, 3*huge-abi.PageSize-100)}
	scattered := DMABuf{Addr: 0x5000, Pages: []uint64{0x5000, 0x9000, 0x6000, 0x7000}, Buf: make([]byte, 4*abi.PageSize)}
	contig := DMABuf{Addr: 0x12345678, Buf: make([]byte, 1<<30)}
	for _, tt := range []struct {
		name      string
		b         DMABuf
		off, n    uint64
		wantShift uint
		wantPages int
	}{
		{"contiguous 1 GiB", contig, 0, 1 << 30, 30, 2},
		{"contiguous 4 KiB", contig, 8, 4096, 12, 2},
		{"contiguous 1 byte", contig, 5, 1, 12, 1},
		{"huge pages, whole", hb, 0, uint64(len(hb.Buf)), 21, 3},
		{"huge pages, inside one", hb, 1000, 100000, 17, 1},
		{"huge pages, across a break", hb, huge - 2*abi.PageSize, 4 * abi.PageSize, 14, 2},
		{"scattered 4 KiB", scattered, 0, 4 * abi.PageSize, 12, 4},
		{"scattered, contiguous part", scattered, 2 * abi.PageSize, 2 * abi.PageSize, 13, 1},
	} {
		pages, shift, err := tt.b.MRPages(tt.off, tt.n, abi.MaxPageShift)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if shift != tt.wantShift || len(pages) != tt.wantPages {
			t.Errorf("%s: shift %d with %d pages, want %d with %d", tt.name, shift, len(pages), tt.wantShift, tt.wantPages)
		}
		size := uint64(1) << shift
		iova, _ := tt.b.GPA(tt.off)
		for _, p := range pages {
			if p%size != 0 {
				t.Errorf("%s: page %#x not aligned to %#x", tt.name, p, size)
			}
		}
		if want := (uint64(iova)%size + tt.n + size - 1) / size; uint64(len(pages)) != want {
			t.Errorf("%s: %d pages, REG_MR wants %d", tt.name, len(pages), want)
		}
		// Every byte (sampled) lands where the buffer has it.
		step := max(1, tt.n/4099)
		for x := uint64(0); x < tt.n; x += step {
			want, _ := tt.b.GPA(tt.off + x)
			o := uint64(iova)%size + x
			got := pages[o/size] + o%size
			if got != uint64(want) {
				t.Fatalf("%s: byte %d at %#x, buffer has it at %#x", tt.name, x, got, uint64(want))
			}
		}
	}
	if pages, shift, err := contig.MRPages(0, 1<<20, 12); err != nil || shift != 12 || len(pages) != 257 {
		t.Errorf("capped at 4 KiB pages: %d pages of shift %d, %v", len(pages), shift, err)
	}
	if _, _, err := contig.MRPages(0, 0, abi.MaxPageShift); err == nil {
		t.Error("zero length accepted")
	}
	if _, _, err := scattered.MRPages(abi.PageSize, 4*abi.PageSize, abi.MaxPageShift); err == nil {
		t.Error("range beyond the buffer accepted")
	}
}
