package roce

import "testing"

func TestPSN(t *testing.T) {
	tests := []struct {
		p, q          PSN
		diff          int32
		before, after bool
	}{
		{5, 5, 0, false, false},
		{6, 5, 1, false, true},
		{0, PSNMask, 1, false, true}, // 0 follows 0xffffff
		{PSNMask, 0, -1, true, false},
		{2, PSNMask - 1, 4, false, true},
		{psnHalf - 1, 0, psnHalf - 1, false, true},
		{psnHalf, 0, -psnHalf, true, false}, // ambiguous: half the space
		{0, psnHalf + 1, psnHalf - 1, false, true},
		{PSNMask, psnHalf, psnHalf - 1, false, true},
	}
	for _, tt := range tests {
		if got := tt.p.Diff(tt.q); got != tt.diff {
			t.Errorf("%#x.Diff(%#x): got %d, want %d", tt.p, tt.q, got, tt.diff)
		}
		if got := tt.p.Before(tt.q); got != tt.before {
			t.Errorf("%#x.Before(%#x): got %t, want %t", tt.p, tt.q, got, tt.before)
		}
		if got := tt.p.After(tt.q); got != tt.after {
			t.Errorf("%#x.After(%#x): got %t, want %t", tt.p, tt.q, got, tt.after)
		}
	}
	adds := []struct {
		p    PSN
		n    uint32
		want PSN
	}{
		{PSNMask, 1, 0},
		{PSNMask - 1, 3, 1},
		{0, 1 << 24, 0},
		{10, 1<<32 - 1, 9}, // 2^32-1 ≡ -1 (mod 2^24)
	}
	for _, tt := range adds {
		if got := tt.p.Add(tt.n); got != tt.want {
			t.Errorf("%#x.Add(%#x): got %#x, want %#x", tt.p, tt.n, got, tt.want)
		}
	}
	// Every step across the wrap: Add and Diff agree.
	for p := PSNMask - 10; p != 11; p = p.Add(1) {
		for n := uint32(0); n < 20; n++ {
			q := p.Add(n)
			if q.Diff(p) != int32(n) || !q.Valid() || (n > 0 && !p.Before(q)) {
				t.Fatalf("%#x+%d = %#x: Diff %d", p, n, q, q.Diff(p))
			}
		}
	}
	if PSN(1 << 24).Valid() {
		t.Error("2^24 is valid")
	}
}
