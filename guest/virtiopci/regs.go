package virtiopci

import "io"

// Regs is a window of device registers: a virtio structure inside a mapped
// BAR, or a fake in tests. Offsets are relative to the window; accesses
// are naturally aligned and of the width the method names. An access
// outside the window reads as all ones and writes are dropped (no panic).
type Regs interface {
	Read8(off uint32) uint8
	Read16(off uint32) uint16
	Read32(off uint32) uint32
	Write8(off uint32, v uint8)
	Write16(off uint32, v uint16)
	Write32(off uint32, v uint32)
	// Len is the window's size in bytes.
	Len() uint32
}

// ConfigSpace is a PCI function's configuration space
// (/sys/bus/pci/devices/X/config as an *os.File, or a fake).
type ConfigSpace interface {
	io.ReaderAt
	io.WriterAt
}

// window restricts r to [off, off+n). Precondition: off+n <= r.Len().
type window struct {
	r      Regs
	off, n uint32
}

func (w window) in(off, size uint32) bool {
	return off%size == 0 && off < w.n && w.n-off >= size
}

func (w window) Len() uint32 { return w.n }

func (w window) Read8(off uint32) uint8 {
	if !w.in(off, 1) {
		return 0xff
	}
	return w.r.Read8(w.off + off)
}

func (w window) Read16(off uint32) uint16 {
	if !w.in(off, 2) {
		return 0xffff
	}
	return w.r.Read16(w.off + off)
}

func (w window) Read32(off uint32) uint32 {
	if !w.in(off, 4) {
		return 0xffffffff
	}
	return w.r.Read32(w.off + off)
}

func (w window) Write8(off uint32, v uint8) {
	if w.in(off, 1) {
		w.r.Write8(w.off+off, v)
	}
}

func (w window) Write16(off uint32, v uint16) {
	if w.in(off, 2) {
		w.r.Write16(w.off+off, v)
	}
}

func (w window) Write32(off uint32, v uint32) {
	if w.in(off, 4) {
		w.r.Write32(w.off+off, v)
	}
}

// newWindow returns the window [off, off+n) of r, or false when it does not
// fit.
func newWindow(r Regs, off, n uint32) (window, bool) {
	end := uint64(off) + uint64(n)
	if n == 0 || end > uint64(r.Len()) {
		return window{}, false
	}
	if inner, ok := r.(window); ok { // flatten
		return window{r: inner.r, off: inner.off + off, n: n}, true
	}
	return window{r: r, off: off, n: n}, true
}
