// Package units parses and prints byte sizes as operators write them:
// 4096, 4K, 4k, 4KiB, 64MiB, 1G, 1GB (binary multiples: an RDMA and
// hypervisor operator's G is 2^30).
package units

import (
	"fmt"
	"strconv"
	"strings"
)

var suffixes = []struct {
	s string
	m uint64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"tb", 1 << 40},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40},
	{"b", 1},
}

// ParseBytes parses a byte size.
func ParseBytes(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	mult := uint64(1)
	for _, x := range suffixes {
		if strings.HasSuffix(t, x.s) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, x.s)), x.m
			break
		}
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a number with an optional K, M, G or T suffix", s)
	}
	if n != 0 && n > ^uint64(0)/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

// FormatBytes prints n with the largest binary unit that divides it.
func FormatBytes(n uint64) string {
	for _, u := range []struct {
		s string
		m uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
	}
	return fmt.Sprintf("%dB", n)
}
