package main

import (
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestJain(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"none", nil, 1},
		{"all zero", []float64{0, 0, 0}, 1},
		{"one", []float64{7}, 1},
		{"equal", []float64{3, 3, 3, 3}, 1},
		{"one takes all of four", []float64{0, 0, 5, 0}, 0.25},
		{"half idle", []float64{1, 1, 0, 0}, 0.5},
		// (1+2+3)² / (3·(1+4+9)) = 36/42
		{"1 2 3", []float64{1, 2, 3}, 36.0 / 42},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := jain(tt.xs); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("jain(%v): got %v, want %v", tt.xs, got, tt.want)
			}
		})
	}
	// Scaling every rate alike does not change the index.
	if a, b := jain([]float64{1, 2, 3}), jain([]float64{1e9, 2e9, 3e9}); math.Abs(a-b) > 1e-12 {
		t.Errorf("jain is not scale-invariant: %v against %v", a, b)
	}
}

func TestMinShare(t *testing.T) {
	tests := []struct {
		xs   []float64
		want float64
	}{{nil, 1}, {[]float64{0, 0}, 1}, {[]float64{2, 2}, 1}, {[]float64{1, 3}, 0.5}, {[]float64{0, 4}, 0}}
	for _, tt := range tests {
		if got := minShare(tt.xs); got != tt.want {
			t.Errorf("minShare(%v): got %v, want %v", tt.xs, got, tt.want)
		}
	}
}

func TestScalingRows(t *testing.T) {
	tests := []struct {
		pt       scalePoint
		rows     int
		met      []bool // per row with a target, in order
		noTarget bool   // the aggregate row has none
	}{
		{scalePoint{pairs: 1, agg: 10, one: 10, fair: 1}, 1, nil, true},
		{scalePoint{pairs: 2, agg: 8, one: 10, fair: 0.95}, 2, []bool{true, true}, false},
		{scalePoint{pairs: 4, agg: 7.9, one: 10, fair: 0.8}, 2, []bool{false, false}, false},
		{scalePoint{pairs: 32, agg: 1, one: 10, fair: 0.99}, 2, []bool{true}, true},
		{scalePoint{pairs: 128, agg: 6, one: 10, fair: 0.9}, 2, []bool{true, true}, false},
		{scalePoint{pairs: 128, agg: 5.9, one: 10, fair: 0.9}, 2, []bool{false, true}, false},
		{scalePoint{pairs: 128, agg: 6, one: 12, fair: 0.9}, 2, []bool{false, true}, false},
	}
	for _, tt := range tests {
		rows := scalingRows(tt.pt)
		if len(rows) != tt.rows {
			t.Errorf("%d pairs: got %d rows, want %d", tt.pt.pairs, len(rows), tt.rows)
			continue
		}
		if got := rows[0].met == nil; got != tt.noTarget {
			t.Errorf("%d pairs: aggregate row without target: got %v, want %v", tt.pt.pairs, got, tt.noTarget)
		}
		var met []bool
		for _, r := range rows {
			if r.met != nil {
				met = append(met, *r.met)
			}
		}
		if len(met) != len(tt.met) {
			t.Errorf("%d pairs: got verdicts %v, want %v", tt.pt.pairs, met, tt.met)
			continue
		}
		for i := range met {
			if met[i] != tt.met[i] {
				t.Errorf("%d pairs: got verdicts %v, want %v", tt.pt.pairs, met, tt.met)
				break
			}
		}
	}
}

func TestScalingChart(t *testing.T) {
	pts := []scalePoint{{pairs: 1, agg: 10, one: 10}, {pairs: 2, agg: 9, one: 11}, {pairs: 4, agg: 8, one: 9},
		{pairs: 128, agg: 6, one: 10}, {pairs: -1, agg: 12, one: 10}, {pairs: -4, agg: 0.4, one: 12}}
	p := filepath.Join(t.TempDir(), scalingPNG)
	if err := writeScalingChart(p, pts); err != nil {
		t.Fatal(err)
	}
	img := readChart(t, p)
	for _, c := range append(seriesColor[:3:3], orange) {
		found := false
		for y := 0; y < chartH && !found; y++ {
			for x := 0; x < chartW; x++ {
				r, g, b, _ := img.At(x, y).RGBA()
				if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(b>>8) == c.B {
					found = true
					break
				}
			}
		}
		if !found {
			t.Errorf("colour %v not drawn", c)
		}
	}
}

func TestParsePairs(t *testing.T) {
	tests := []struct {
		args string
		want []int
		ok   bool
	}{
		{"", []int{1, 2, 4, 8, 32, 128}, true},
		{"--quick", []int{1, 2, 4}, true},
		{"--pairs 4,1,2", []int{1, 2, 4}, true},
		{"--quick --pairs 1,16", []int{1, 16}, true},
		{"--pairs 2,4", nil, false},
		{"--pairs x", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			o, err := parseFlags(strings.Fields(tt.args))
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
			if err == nil && !slices.Equal(o.s.pairs, tt.want) {
				t.Errorf("got pairs %v, want %v", o.s.pairs, tt.want)
			}
		})
	}
}

func TestCapitalize(t *testing.T) {
	for in, want := range map[string]string{"": "", "each": "Each", "The": "The", "1 pool": "1 pool"} {
		if got := capitalize(in); got != want {
			t.Errorf("capitalize(%q): got %q, want %q", in, got, want)
		}
	}
}
