package memmap

import "unsafe"

// wordsOf views b, whose length is a multiple of 8 and whose first byte is
// 8-byte aligned (a page-aligned mapping plus an offset that is a multiple
// of 8), as 64-bit words, for atomic ORs into a dirty log.
func wordsOf(b []byte) []uint64 {
	if len(b) < 8 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
}

// littleEndian reports whether the host stores the low byte of a word
// first: the log's bit i of byte j is then bit 8*(j%8)+i of word j/8.
func littleEndian() bool {
	v := uint16(1)
	return *(*byte)(unsafe.Pointer(&v)) == 1
}
