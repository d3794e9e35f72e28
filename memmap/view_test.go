package memmap

import (
	"bytes"
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestViewScattered: pages scattered over two regions appear back to back
// in the view, both ways coherent with guest memory, and the view outlives
// the table and regions it was made from.
func TestViewScattered(t *testing.T) {
	p := viewPage
	a := mapNew(t, "viewa", 16*p, RegionSpec{GuestAddr: 0, Size: 16 * p, UserAddr: 0x10000000})
	b := mapNew(t, "viewb", 16*p, RegionSpec{GuestAddr: abi.GPA(16 * p), Size: 16 * p, UserAddr: 0x20000000})
	tab := tableOf(t, a, b)
	for i := range 32 {
		pg, err := tab.Slice(abi.GPA(uint64(i)*p), p)
		if err != nil {
			t.Fatal(err)
		}
		for j := range pg {
			pg[j] = byte(i)
		}
	}
	// Page 7, pages 14..17 (crossing the regions), page 3.
	runs := []Run{{GPA: abi.GPA(7 * p), Len: p}, {GPA: abi.GPA(14 * p), Len: 4 * p}, {GPA: abi.GPA(3 * p), Len: p}}
	v, err := tab.NewView(runs)
	if err != nil {
		t.Fatalf("NewView: %v", err)
	}
	defer v.Close()
	if v.Len() != 6*p || v.Addr()%uintptr(p) != 0 {
		t.Fatalf("view %#x+%#x", v.Addr(), v.Len())
	}
	want := []byte{7, 14, 15, 16, 17, 3}
	vb := v.Bytes()
	for i, w := range want {
		if !bytes.Equal(vb[uint64(i)*p:uint64(i+1)*p], bytes.Repeat([]byte{w}, int(p))) {
			t.Fatalf("view page %d is not guest page %d", i, w)
		}
	}
	// Writes through the view reach guest memory and back.
	vb[2*p+5] = 0xaa
	if pg, _ := tab.Slice(abi.GPA(15*p), p); pg[5] != 0xaa {
		t.Fatalf("a write through the view did not reach guest page 15")
	}
	if pg, _ := tab.Slice(abi.GPA(3*p), p); true {
		pg[9] = 0xbb
	}
	if vb[5*p+9] != 0xbb {
		t.Fatalf("a guest write did not show in the view")
	}
	// The view holds the pages itself.
	tab.Release()
	a.Release()
	b.Release()
	if vb[5*p+9] != 0xbb || vb[0] != 7 {
		t.Fatalf("the view lost its pages with the table")
	}
	if err := v.Close(); err != nil {
		t.Fatal(err)
	}
	if v.Bytes() != nil || v.Close() != nil {
		t.Fatal("Close is not idempotent")
	}
}

// TestViewRejects: unaligned runs, unmapped memory and private mappings
// give errors and leave nothing mapped.
func TestViewRejects(t *testing.T) {
	p := viewPage
	a := mapNew(t, "viewrej", 8*p, RegionSpec{GuestAddr: 0, Size: 8 * p, UserAddr: 0x10000000})
	defer a.Release()
	tab := tableOf(t, a)
	defer tab.Release()
	before := countMaps(t, "viewrej")
	for _, runs := range [][]Run{
		nil,
		{{GPA: 1, Len: p}},
		{{GPA: 0, Len: p + 1}},
		{{GPA: 0, Len: 0}},
		{{GPA: abi.GPA(6 * p), Len: 4 * p}}, // runs past the region
		{{GPA: 0, Len: p}, {GPA: abi.GPA(100 * p), Len: p}},
		{{GPA: ^abi.GPA(0) &^ abi.GPA(p-1), Len: 2 * p}},
	} {
		if v, err := tab.NewView(runs); err == nil {
			v.Close()
			t.Errorf("NewView(%v) succeeded", runs)
		}
	}
	if got := countMaps(t, "viewrej"); got != before {
		t.Fatalf("failed views left %d mappings of the file behind", got-before)
	}

	// A private mapping (a front-end that did not share its memory) cannot
	// be duplicated.
	mem, err := unix.Mmap(-1, 0, int(4*p), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	priv := &Table{byGPA: []span{{start: 0, end: 4 * p, data: mem}}}
	if _, err := priv.NewView([]Run{{GPA: 0, Len: p}}); !errors.Is(err, ErrViewUnsupported) {
		t.Fatalf("view of a private mapping: %v, want ErrViewUnsupported", err)
	}
}
