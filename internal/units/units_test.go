package units

import "testing"

func TestParseBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		bad  bool
	}{
		{"4096", 4096, false}, {"4K", 4096, false}, {"4k", 4096, false}, {"64KiB", 64 << 10, false},
		{"1M", 1 << 20, false}, {"16GiB", 16 << 30, false}, {"1GB", 1 << 30, false}, {"0", 0, false},
		{"", 0, true}, {"x", 0, true}, {"-1", 0, true}, {"99999999999T", 0, true}, {"1.5G", 0, true},
	} {
		got, err := ParseBytes(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
	if s := FormatBytes(64 << 20); s != "64MiB" {
		t.Errorf("FormatBytes(64MiB) = %q", s)
	}
}
