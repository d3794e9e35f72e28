package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/vmm/guestvm"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float64
		want Stats
		ok   bool
	}{
		{"empty", nil, Stats{}, false},
		{"one", []float64{2}, Stats{N: 1, Median: 2, Min: 2, Max: 2}, true},
		{"odd", []float64{5, 1, 3, 9, 2}, Stats{N: 5, Median: 3, Min: 1, Max: 9}, true},
		{"even", []float64{4, 1, 3, 2}, Stats{N: 4, Median: 2.5, Min: 1, Max: 4}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Summarize(tc.in)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %+v, %v, want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestAdvantage(t *testing.T) {
	for _, tc := range []struct {
		name       string
		m          Metric
		v, r, want float64
		ok         bool
	}{
		{"bandwidth", Bandwidth, 2, 0.5, 4, true},
		{"latency", Latency, 5, 500, 100, true},
		{"bandwidth zero rxe", Bandwidth, 1, 0, 0, false},
		{"latency zero vrdma", Latency, 0, 1, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Advantage(tc.m, tc.v, tc.r)
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %v, %v, want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

const testBlock = BeginMarker + "\nnew\n" + EndMarker + "\n"

func TestReplaceBlock(t *testing.T) {
	for _, tc := range []struct {
		name, doc, want string
		err             bool
	}{
		{"empty doc", "", testBlock, false},
		{"append", "# Bench\n\ntable\n", "# Bench\n\ntable\n\n" + testBlock, false},
		{"replace", "a\n" + BeginMarker + "\nold\n" + EndMarker + "\nb\n", "a\n" + BeginMarker + "\nnew\n" + EndMarker + "\nb\n", false},
		{"end before begin", EndMarker + "\n" + BeginMarker + "\n", "", true},
		{"begin only", "x\n" + BeginMarker + "\n", "", true},
		{"two blocks", testBlock + testBlock, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReplaceBlock(tc.doc, testBlock)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("got %q, %v, want %q, error %v", got, err, tc.want, tc.err)
			}
			if err != nil && !errors.Is(err, ErrMarkers) {
				t.Errorf("got error %v, want ErrMarkers", err)
			}
		})
	}
	if _, err := ReplaceBlock("", "no markers"); !errors.Is(err, ErrMarkers) {
		t.Errorf("got %v for a block without markers, want ErrMarkers", err)
	}
	// Idempotent: replacing twice gives the same document.
	once, _ := ReplaceBlock("head\n", testBlock)
	twice, err := ReplaceBlock(once, testBlock)
	if err != nil || twice != once {
		t.Errorf("got %q, %v, want %q", twice, err, once)
	}
}

func result(t *testing.T, s string) guestvm.Result {
	t.Helper()
	r, err := guestvm.ParseResult(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestFigure(t *testing.T) {
	bw, lat := Workloads[1], Workloads[3]
	for _, tc := range []struct {
		name string
		w    Workload
		line string
		rxe  bool
		want float64
		err  bool
	}{
		{"rxe bw", bw, `{"role":"client","transport":"rxe","op":"write_bw","size":65536,"iters":200,"run":1,"exit":0,"gbits_per_s":0.13,"gbytes_per_s":0.01625}`, true, 0.13, false},
		{"rxe lat", lat, `{"role":"client","transport":"rxe","op":"write_lat","size":64,"iters":1000,"run":1,"exit":0,"lat_us_p50":610.06,"lat_us_p99":900}`, true, 610.06, false},
		{"rxe wrong op", bw, `{"transport":"rxe","op":"read_bw","size":65536,"gbits_per_s":1}`, true, 0, true},
		{"rxe wrong size", bw, `{"transport":"rxe","op":"write_bw","size":4096,"gbits_per_s":1}`, true, 0, true},
		{"rxe no transport", bw, `{"op":"write_bw","size":65536,"gbits_per_s":1}`, true, 0, true},
		{"rxe no gbits", bw, `{"transport":"rxe","op":"write_bw","size":65536}`, true, 0, true},
		{"rxe negative", lat, `{"transport":"rxe","op":"write_lat","size":64,"lat_us_p50":-1}`, true, 0, true},
		{"vrdma bw", bw, `{"op":"write","size":65536,"gbytes_per_s":0.25,"verified":true}`, false, 2, false},
		{"vrdma lat", lat, `{"op":"write","size":64,"lat_us_p50":3.5,"verified":true}`, false, 3.5, false},
		{"vrdma unverified", bw, `{"op":"write","size":65536,"gbytes_per_s":0.25,"verified":false}`, false, 0, true},
		{"vrdma wrong op", lat, `{"op":"send","size":64,"lat_us_p50":3.5,"verified":true}`, false, 0, true},
		{"vrdma zero", bw, `{"op":"write","size":65536,"gbytes_per_s":0,"verified":true}`, false, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.w.Figure(result(t, tc.line), tc.rxe)
			if (err != nil) != tc.err || got != tc.want {
				t.Errorf("got %v, %v, want %v, error %v", got, err, tc.want, tc.err)
			}
			if err != nil && !errors.Is(err, ErrBadResult) {
				t.Errorf("got error %v, want ErrBadResult", err)
			}
		})
	}
}

func TestWorkloadArgs(t *testing.T) {
	for _, w := range Workloads {
		if j := w.RxeJob(); strings.Count(j, ":") != 2 || strings.ContainsAny(j, ", ") {
			t.Errorf("%s: got job %q, want OP:SIZE:ITERS", w.Name, j)
		}
		for _, a := range w.VrdmaArgs() {
			if a == "" || strings.ContainsAny(a, ", ") {
				t.Errorf("%s: got argument %q, want a word without commas", w.Name, a)
			}
		}
	}
	if got := Workloads[0].RxeJob(); got != "write_bw:4096:2000" {
		t.Errorf("got %q, want write_bw:4096:2000", got)
	}
}

func TestTableAndBlock(t *testing.T) {
	rows := []Row{
		{W: Workloads[1], Vrdma: Stats{N: 1, Median: 2, Min: 2, Max: 2}, HaveV: true, Rxe: Stats{N: 1, Median: 0.5, Min: 0.5, Max: 0.5}, HaveR: true},
		{W: Workloads[3], Vrdma: Stats{N: 1, Median: 4, Min: 4, Max: 4}, HaveV: true},
	}
	b := Block(rows, 1, "setup.", "now")
	for _, want := range []string{"| WRITE bandwidth 64 KiB | Gb/s | 2.000 |", "| 4.0× |", "| — | — | — |"} {
		if !strings.Contains(b, want) {
			t.Errorf("block lacks %q:\n%s", want, b)
		}
	}
	if _, err := ReplaceBlock("", b); err != nil {
		t.Errorf("got %v for Block's output, want a valid block", err)
	}
}

func TestRunUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"stray argument", []string{"x"}, 2},
		{"bad runs", []string{"--runs", "0", "--qemu", "/nonexistent"}, 2},
		{"bad flag", []string{"--nope"}, 2},
		{"missing images", []string{"--qemu", "/nonexistent/qemu"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if got := run(tc.args, &out, &errb); got != tc.want {
				t.Errorf("got exit %d, want %d (%s)", got, tc.want, errb.String())
			}
		})
	}
}

// FuzzReplaceBlock: any document either gets exactly one block back, or an
// error and "".
func FuzzReplaceBlock(f *testing.F) {
	f.Add("# Benchmarks\n\n" + testBlock + "tail\n")
	f.Fuzz(func(t *testing.T, doc string) {
		got, err := ReplaceBlock(doc, testBlock)
		if err != nil {
			if got != "" {
				t.Fatalf("got %q with error %v, want \"\"", got, err)
			}
			return
		}
		if strings.Count(got, BeginMarker) != 1 || strings.Count(got, EndMarker) != 1 || !strings.Contains(got, testBlock[:len(testBlock)-1]) {
			t.Fatalf("got %q, want the block exactly once", got)
		}
	})
}

// FuzzFigure: any guest result line either yields a positive finite
// figure, or an error and 0.
func FuzzFigure(f *testing.F) {
	f.Add(`{"role":"client","transport":"rxe","op":"write_bw","size":65536,"iters":200,"run":1,"exit":0,"gbits_per_s":0.13,"gbytes_per_s":0.01625}`, true)
	f.Fuzz(func(t *testing.T, line string, rxe bool) {
		r, err := guestvm.ParseResult(line)
		if err != nil {
			return
		}
		for _, w := range Workloads {
			v, err := w.Figure(r, rxe)
			if err != nil && v != 0 {
				t.Fatalf("got %v with error %v, want 0", v, err)
			}
			if err == nil && !(v > 0 && v <= 1e9) {
				t.Fatalf("got figure %v without error", v)
			}
		}
	})
}
