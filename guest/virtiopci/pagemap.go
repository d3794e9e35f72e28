package virtiopci

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// /proc/self/pagemap entries (Documentation/admin-guide/mm/pagemap.rst):
// bit 63 page present, bits 0–54 the page frame number (zero without
// CAP_SYS_ADMIN).
const (
	pagemapPresent = 1 << 63
	pagemapPFNMask = 1<<55 - 1
	pagemapEntry   = 8
	frameShift     = 12
	maxPFN         = 1<<(52-frameShift) - 1 // x86-64 physical addresses have at most 52 bits
)

// ParsePagemapEntry decodes one 8-byte pagemap entry and returns the
// physical address of its page frame.
func ParsePagemapEntry(raw []byte) (uint64, error) {
	if len(raw) != pagemapEntry {
		return 0, fmt.Errorf("pagemap entry of %d bytes: %w", len(raw), ErrHugepages)
	}
	e := binary.LittleEndian.Uint64(raw)
	if e&pagemapPresent == 0 {
		return 0, fmt.Errorf("pagemap: page not present: %w", ErrHugepages)
	}
	pfn := e & pagemapPFNMask
	if pfn == 0 {
		return 0, fmt.Errorf("pagemap: frame number hidden (not root?): %w", ErrHugepages)
	}
	if pfn > maxPFN {
		return 0, fmt.Errorf("pagemap: frame number %#x beyond 52-bit physical addresses: %w", pfn, ErrHugepages)
	}
	return pfn << frameShift, nil
}

// physAddr reads the physical address of virtual address va from pagemap
// (an open /proc/self/pagemap).
func physAddr(pagemap *os.File, va uintptr) (uint64, error) {
	var raw [pagemapEntry]byte
	off := int64(va>>frameShift) * pagemapEntry
	if n, err := pagemap.ReadAt(raw[:], off); err != nil || n != len(raw) {
		return 0, fmt.Errorf("read pagemap at %#x: %v: %w", off, err, ErrHugepages)
	}
	pa, err := ParsePagemapEntry(raw[:])
	if err != nil {
		return 0, err
	}
	return pa | uint64(va)&(1<<frameShift-1), nil
}

// Paths of the hugepage pool controls.
const (
	nrHugepagesPath   = "/proc/sys/vm/nr_hugepages"
	freeHugepagesPath = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"
)

// readCount reads a decimal counter file.
func readCount(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s: %q is not a count", path, b)
	}
	return n, nil
}

// ensureHugepages grows the kernel's 2 MiB pool so that n pages are free.
func ensureHugepages(n int) error {
	free, err := readCount(freeHugepagesPath)
	if err != nil {
		return fmt.Errorf("%v: %w", err, ErrHugepages)
	}
	if free >= n {
		return nil
	}
	total, err := readCount(nrHugepagesPath)
	if err != nil {
		return fmt.Errorf("%v: %w", err, ErrHugepages)
	}
	want := total + n - free
	if err := os.WriteFile(nrHugepagesPath, []byte(strconv.Itoa(want)), 0); err != nil {
		return fmt.Errorf("set %s to %d: %v: %w", nrHugepagesPath, want, err, ErrHugepages)
	}
	if free, err = readCount(freeHugepagesPath); err != nil || free < n {
		return fmt.Errorf("%d free 2 MiB hugepages after asking for %d more, want %d (guest memory too small?): %w", free, n, n, ErrHugepages)
	}
	return nil
}
