package main

import (
	"bytes"
	"image"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tt := range tests {
		if got := median(tt.in); got != tt.want {
			t.Errorf("median(%v): got %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestSizeName(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{{64, "64 B"}, {4096, "4 KiB"}, {1 << 20, "1 MiB"}, {16 << 30, "16 GiB"}, {1500, "1500 B"}}
	for _, tt := range tests {
		if got := sizeName(tt.n); got != tt.want {
			t.Errorf("sizeName(%d): got %q, want %q", tt.n, got, tt.want)
		}
	}
}

func TestRowRatio(t *testing.T) {
	tests := []struct {
		name string
		r    row
		want float64
	}{
		{"rate", row{figure: 2, baseline: 4}, 0.5},
		{"time", row{figure: 2, baseline: 4, invRatio: true}, 2},
		{"no baseline", row{figure: 2}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.ratio(); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestVerdict(t *testing.T) {
	rows := []row{{name: "a", met: boolp(true)}, {name: "b", met: boolp(false)}, {name: "c"}}
	got := verdict(rows, "why")
	if !strings.Contains(got, "missed") || !strings.Contains(got, "b") || !strings.Contains(got, "why") {
		t.Errorf("got %q, want a miss of b with the explanation", got)
	}
	if got := verdict(rows[:1], "why"); !strings.Contains(got, "met") || strings.Contains(got, "why") {
		t.Errorf("got %q, want met without the explanation", got)
	}
}

func TestChart(t *testing.T) {
	pts := []bwPoint{{64, 0.1, 0.1, 5}, {4096, 2, 3, 40}, {1 << 20, 10, 12, 20}}
	dir := t.TempDir()
	p := filepath.Join(dir, "bw.png")
	if err := writeChart(p, pts); err != nil {
		t.Fatal(err)
	}
	img := readChart(t, p)
	// Each series' colour must appear (lines and markers were drawn).
	for i, c := range seriesColor {
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
			t.Errorf("series %s: colour not drawn", seriesName[i])
		}
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args string
		ok   bool
	}{
		{"", true},
		{"--quick --row-time 10ms --repeats 1", true},
		{"--repeats 0", false},
		{"--row-time -1s", false},
		{"stray", false},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			_, err := parseFlags(strings.Fields(tt.args))
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
		})
	}
}

// TestQuickSuite runs the whole suite with small sizes and checks that
// every table row carries a figure, a baseline and a ratio.
func TestQuickSuite(t *testing.T) {
	if testing.Short() {
		t.Skip("runs daemons and measurements")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (mlock, pin-all)")
	}
	dir := t.TempDir()
	md, pngPath := filepath.Join(dir, "b.md"), filepath.Join(dir, "b.png")
	var out bytes.Buffer
	err := run([]string{"--quick", "--row-time", "50ms", "--repeats", "1", "--out", md, "--png", pngPath,
		"--vmtest", filepath.Join(dir, "none")}, &out)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	b, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for _, want := range []string{"do not edit", "## Bandwidth", "## Message rate", "## Latency", "## Control path",
		"## Registration", "## Start-up", "## Scaling", "## Isolation", "## Spin-up", "Not measured in this run"} {
		if !strings.Contains(doc, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	// The scaling rig gives back every descriptor and pin it took.
	if i := strings.Index(doc, "Problem:"); i >= 0 {
		t.Errorf("report names a problem: %s", doc[i:min(len(doc), i+300)])
	}
	for _, want := range []string{"benchmarks-scaling.png", "Jain's fairness index", "clients that never yield",
		"victim p99 beside a 64 B WRITE flood", "victim p99 beside a 4 MiB READ flood", "engine"} {
		if !strings.Contains(doc, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, scalingPNG)); err != nil {
		t.Errorf("scaling chart: %v", err)
	}
	// The roce section links its picture when it measured it.
	if strings.Contains(doc, "("+lossPNG+")") {
		if _, err := os.Stat(filepath.Join(dir, lossPNG)); err != nil {
			t.Errorf("loss chart: %v", err)
		}
	}
	rows := 0
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "| Measurement") {
			continue
		}
		rows++
		cells := strings.Split(l, " | ")
		if len(cells) != len(header) {
			t.Errorf("row %q: got %d cells, want %d", l, len(cells), len(header))
			continue
		}
		if !strings.Contains(cells[2], ":") || !strings.HasSuffix(cells[3], "×") {
			t.Errorf("row %q: want a baseline and a ratio", l)
		}
	}
	if rows < 15 {
		t.Errorf("got %d rows, want at least 15", rows)
	}
	if _, err := os.Stat(pngPath); err != nil {
		t.Errorf("chart: %v", err)
	}
	_ = time.Second
}

// TestCarryCompareRxe: regenerating the page keeps the block that
// make compare-rxe wrote.
func TestCarryCompareRxe(t *testing.T) {
	old := []byte("# old\n\n<!-- BEGIN compare-rxe -->\nrxe table\n<!-- END compare-rxe -->\n")
	got := string(carryCompareRxe(old, []byte("# new\n")))
	if !strings.Contains(got, "# new") || !strings.Contains(got, "rxe table") {
		t.Fatalf("regenerated page lost something:\n%s", got)
	}
	if got := string(carryCompareRxe(nil, []byte("# new\n"))); got != "# new\n" {
		t.Fatalf("without an old page: %q", got)
	}
}

// readChart decodes the PNG at p and checks its size.
func readChart(t *testing.T, p string) image.Image {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != chartW || b.Dy() != chartH {
		t.Fatalf("got %v, want %dx%d", b, chartW, chartH)
	}
	return img
}
