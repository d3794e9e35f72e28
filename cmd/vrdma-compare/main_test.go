package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/guestresult"
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

func result(t *testing.T, s string) guestresult.Result {
	t.Helper()
	r, err := guestresult.Parse(s)
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
		p    Pair
		want float64
		err  bool
	}{
		{"rxe bw", bw, `{"role":"client","transport":"rxe","op":"write_bw","size":65536,"iters":200,"run":1,"exit":0,"gbits_per_s":0.13,"gbytes_per_s":0.01625}`, RxePerftest, 0.13, false},
		{"rxe lat", lat, `{"role":"client","transport":"rxe","op":"write_lat","size":64,"iters":1000,"run":1,"exit":0,"lat_us_p50":610.06,"lat_us_p99":900,"lat_us_min":500,"lat_us_avg":650}`, RxePerftest, 610.06, false},
		{"rxe wrong op", bw, `{"transport":"rxe","op":"read_bw","size":65536,"gbits_per_s":1}`, RxePerftest, 0, true},
		{"rxe wrong size", bw, `{"transport":"rxe","op":"write_bw","size":4096,"gbits_per_s":1}`, RxePerftest, 0, true},
		{"rxe no transport", bw, `{"op":"write_bw","size":65536,"gbits_per_s":1}`, RxePerftest, 0, true},
		{"rxe no gbits", bw, `{"transport":"rxe","op":"write_bw","size":65536}`, RxePerftest, 0, true},
		{"rxe negative", lat, `{"transport":"rxe","op":"write_lat","size":64,"lat_us_p50":-1}`, RxePerftest, 0, true},
		{"vrdma perftest bw", bw, `{"role":"client","transport":"vrdma-perftest","op":"write_bw","size":65536,"iters":200,"run":1,"exit":0,"gbits_per_s":2.5,"gbytes_per_s":0.3125}`, VrdmaPerftest, 2.5, false},
		{"vrdma perftest lat", lat, `{"role":"client","transport":"vrdma-perftest","op":"write_lat","size":64,"iters":1000,"run":1,"exit":0,"lat_us_p50":40.5,"lat_us_p99":90}`, VrdmaPerftest, 40.5, false},
		// A result of one perftest pair never counts for the other.
		{"rxe result as vrdma perftest", bw, `{"transport":"rxe","op":"write_bw","size":65536,"gbits_per_s":1}`, VrdmaPerftest, 0, true},
		{"vrdma perftest result as rxe", lat, `{"transport":"vrdma-perftest","op":"write_lat","size":64,"lat_us_p50":40}`, RxePerftest, 0, true},
		{"perftest result as Go guest", lat, `{"transport":"vrdma-perftest","op":"write_lat","size":64,"lat_us_p50":40,"verified":true}`, GoGuest, 0, true},
		{"vrdma bw", bw, `{"op":"write","size":65536,"gbytes_per_s":0.25,"verified":true}`, GoGuest, 2, false},
		{"vrdma lat", lat, `{"op":"write","size":64,"lat_us_p50":3.5,"verified":true}`, GoGuest, 3.5, false},
		{"vrdma unverified", bw, `{"op":"write","size":65536,"gbytes_per_s":0.25,"verified":false}`, GoGuest, 0, true},
		{"vrdma wrong op", lat, `{"op":"send","size":64,"lat_us_p50":3.5,"verified":true}`, GoGuest, 0, true},
		{"vrdma zero", bw, `{"op":"write","size":65536,"gbytes_per_s":0,"verified":true}`, GoGuest, 0, true},
		{"no such pair", bw, `{"op":"write","size":65536,"gbytes_per_s":1,"verified":true}`, NumPairs, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.w.Figure(result(t, tc.line), tc.p)
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
		if j := w.PerftestJob(); strings.Count(j, ":") != 2 || strings.ContainsAny(j, ", ") {
			t.Errorf("%s: got job %q, want OP:SIZE:ITERS", w.Name, j)
		}
		if !w.Runs(GoGuest) {
			continue
		}
		for _, a := range w.VrdmaArgs() {
			if a == "" || strings.ContainsAny(a, ", ") {
				t.Errorf("%s: got argument %q, want a word without commas", w.Name, a)
			}
		}
	}
	if got := Workloads[0].PerftestJob(); got != "write_bw:4096:2000" {
		t.Errorf("got %q, want write_bw:4096:2000", got)
	}
}

func TestPerftestJobsCommand(t *testing.T) {
	for _, tc := range []struct {
		role, peer, want string
	}{
		{"server", "", "perftest-jobs -d vrdma0 -t vrdma-perftest -x auto -r 3 server write_bw:65536:200,write_lat:64:1000"},
		{"client", "10.11.0.1", "perftest-jobs -d vrdma0 -t vrdma-perftest -x auto -r 3 client write_bw:65536:200,write_lat:64:1000 10.11.0.1"},
	} {
		if got := perftestJobsCommand(tc.role, ShortWorkloads, 3, tc.peer); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

// stats is a Stats of one run with figure v.
func stats(v float64) Stats { return Stats{N: 1, Median: v, Min: v, Max: v} }

func TestTable(t *testing.T) {
	rows := []Row{
		{W: Workloads[1], S: [NumPairs]Stats{GoGuest: stats(2), VrdmaPerftest: stats(1.5), RxePerftest: stats(0.125)}},
		{W: Workloads[3], S: [NumPairs]Stats{GoGuest: stats(4), VrdmaPerftest: stats(80), RxePerftest: stats(400)}},
		{W: Workloads[4], S: [NumPairs]Stats{GoGuest: stats(4)}},
	}
	got := Table(rows)
	want := "| workload | unit | vrdma Go guest | spread | vrdma perftest | spread | rxe perftest | spread | perftest: vrdma vs rxe | Go guest vs rxe perftest |\n" +
		"|---|---|---:|---|---:|---|---:|---|---:|---:|\n" +
		"| WRITE bandwidth 64 KiB | Gb/s | 2.000 | 2.000–2.000 (n=1) | 1.500 | 1.500–1.500 (n=1) | 0.125 | 0.125–0.125 (n=1) | 12.0× | 16.0× |\n" +
		"| WRITE latency 64 B | µs | 4.000 | 4.000–4.000 (n=1) | 80.000 | 80.000–80.000 (n=1) | 400.000 | 400.000–400.000 (n=1) | 5.0× | 100.0× |\n" +
		"| SEND latency 64 B | µs | 4.000 | 4.000–4.000 (n=1) | — | — | — | — | — | — |\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

func TestVerdict(t *testing.T) {
	met := Row{W: Workloads[1], S: [NumPairs]Stats{VrdmaPerftest: stats(1.5), RxePerftest: stats(0.15)}}
	for _, tc := range []struct {
		name string
		rows []Row
		want string
	}{
		{"met", []Row{met}, "**Target met** in this run for every row."},
		{"missed", []Row{met, {W: Workloads[3], S: [NumPairs]Stats{VrdmaPerftest: stats(80), RxePerftest: stats(400)}}},
			"**Target missed** in this run for: WRITE latency 64 B (5.0×)."},
		{"no figure", []Row{{W: Workloads[4], S: [NumPairs]Stats{RxePerftest: stats(400)}}},
			"**Target missed** in this run for: SEND latency 64 B (no figure)."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Verdict(tc.rows); !strings.HasPrefix(got, tc.want) || !strings.Contains(got, "at most 1/10 of the latency") {
				t.Errorf("got %q, want it to start with %q and state the target", got, tc.want)
			}
		})
	}
}

func TestBlock(t *testing.T) {
	rows := []Row{{W: Workloads[1], S: [NumPairs]Stats{GoGuest: stats(2), VrdmaPerftest: stats(1.5), RxePerftest: stats(0.125)}}}
	b := Block(rows, 1, "setup.", "now")
	for _, want := range []string{"setup. Each figure is the median of 1 runs", "| WRITE bandwidth 64 KiB | Gb/s | 2.000 |", "| 12.0× | 16.0× |", "**Target met**", "Run now."} {
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
// figure, or an error and 0, whatever pair it is taken for.
func FuzzFigure(f *testing.F) {
	f.Add(`{"role":"client","transport":"rxe","op":"write_bw","size":65536,"iters":200,"run":1,"exit":0,"gbits_per_s":0.13,"gbytes_per_s":0.01625}`, uint8(RxePerftest))
	f.Fuzz(func(t *testing.T, line string, pair uint8) {
		r, err := guestresult.Parse(line)
		if err != nil {
			return
		}
		p := Pair(pair % uint8(NumPairs+1)) // NumPairs itself: no such pair
		for _, w := range Workloads {
			v, err := w.Figure(r, p)
			if err != nil && v != 0 {
				t.Fatalf("got %v with error %v, want 0", v, err)
			}
			if err == nil && !(v > 0 && v <= 1e9) {
				t.Fatalf("got figure %v without error", v)
			}
		}
	})
}
