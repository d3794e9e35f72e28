package abi

import "math/bits"

// GPA is a guest-physical address. Both sides use it: the driver computes
// the addresses it hands the device (page lists, records, buffers), the
// device translates them through its memory table. Arithmetic on a GPA is
// overflow-checked.
type GPA uint64

// Add returns a+n and whether the sum fits in 64 bits.
func (a GPA) Add(n uint64) (GPA, bool) {
	s, carry := bits.Add64(uint64(a), n, 0)
	return GPA(s), carry == 0
}
