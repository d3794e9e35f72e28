package units

import "testing"

func TestFormatHuman(t *testing.T) {
	for _, tt := range []struct {
		n    uint64
		want string
	}{
		{0, "0B"},
		{1023, "1023B"},
		{1024, "1KiB"},
		{1536, "1.5KiB (1536)"},
		{64 << 10, "64KiB"},
		{3<<20 + 1, "3.0MiB (3145729)"},
		{8 << 30, "8GiB"},
		{5 << 40, "5TiB"},
		{1<<64 - 1, "16777216.0TiB (18446744073709551615)"},
	} {
		if got := FormatHuman(tt.n); got != tt.want {
			t.Errorf("FormatHuman(%d): got %q, want %q", tt.n, got, tt.want)
		}
	}
}
