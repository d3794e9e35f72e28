package memmap

import "math/bits"

// Add returns a+n and whether the sum fits in 64 bits.
func (a UVA) Add(n uint64) (UVA, bool) {
	s, ok := add(uint64(a), n)
	return UVA(s), ok
}

// add returns a+b and whether it did not overflow.
func add(a, b uint64) (uint64, bool) {
	s, carry := bits.Add64(a, b, 0)
	return s, carry == 0
}
