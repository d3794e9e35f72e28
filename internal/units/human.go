package units

import "fmt"

// FormatHuman prints n for a person reading a table: a whole number of
// the largest binary unit it reaches ("64KiB", "8GiB"), else one decimal
// of it followed by the exact count ("1.5MiB (1572864)"), so the
// rounding never hides a byte count an operator compares.
func FormatHuman(n uint64) string {
	for _, u := range []struct {
		s string
		m uint64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n < u.m {
			continue
		}
		if n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
		return fmt.Sprintf("%.1f%s (%d)", float64(n)/float64(u.m), u.s, n)
	}
	return fmt.Sprintf("%dB", n)
}
