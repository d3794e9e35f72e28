//go:build amd64

package virtiopci

import "unsafe"

// barRegs is a mapped BAR. Each access is one plain MOV of the named width
// (mmio_amd64.s): the compiler can neither elide, merge nor reorder an
// assembly call, which is what MMIO needs. sync/atomic is no substitute: it
// has no 8- or 16-bit operations and its stores are locked XCHGs.
type barRegs struct {
	mem []byte // the mapping; immutable
}

func (b *barRegs) Len() uint32 { return uint32(min(len(b.mem), 1<<32-1)) }

func (b *barRegs) in(off, size uint32) bool {
	return off%size == 0 && uint64(off)+uint64(size) <= uint64(len(b.mem))
}

func (b *barRegs) Read8(off uint32) uint8 {
	if !b.in(off, 1) {
		return 0xff
	}
	return mmioRead8((*uint8)(unsafe.Pointer(&b.mem[off])))
}

func (b *barRegs) Read16(off uint32) uint16 {
	if !b.in(off, 2) {
		return 0xffff
	}
	return mmioRead16((*uint16)(unsafe.Pointer(&b.mem[off])))
}

func (b *barRegs) Read32(off uint32) uint32 {
	if !b.in(off, 4) {
		return 0xffffffff
	}
	return mmioRead32((*uint32)(unsafe.Pointer(&b.mem[off])))
}

func (b *barRegs) Write8(off uint32, v uint8) {
	if b.in(off, 1) {
		mmioWrite8((*uint8)(unsafe.Pointer(&b.mem[off])), v)
	}
}

func (b *barRegs) Write16(off uint32, v uint16) {
	if b.in(off, 2) {
		mmioWrite16((*uint16)(unsafe.Pointer(&b.mem[off])), v)
	}
}

func (b *barRegs) Write32(off uint32, v uint32) {
	if b.in(off, 4) {
		mmioWrite32((*uint32)(unsafe.Pointer(&b.mem[off])), v)
	}
}

//go:noescape
func mmioRead8(p *uint8) uint8

//go:noescape
func mmioRead16(p *uint16) uint16

//go:noescape
func mmioRead32(p *uint32) uint32

//go:noescape
func mmioWrite8(p *uint8, v uint8)

//go:noescape
func mmioWrite16(p *uint16, v uint16)

//go:noescape
func mmioWrite32(p *uint32, v uint32)
