package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/hostniclab"
)

// TestVerbsSection runs the section with quick settings from the
// package's directory, where it finds neither QEMU's nor the rxe image's
// bin/ (they are the repository root's): it must then say what it did not
// measure instead of failing, as the roce section's rxe rows do. `make
// bench` runs it at the root (`vrdma-bench --only verbs`).
func TestVerbsSection(t *testing.T) {
	o := options{vmtest: "bin/vrdma-vmtest", s: settings{rowTime: 50 * time.Millisecond, repeats: 1, quick: true}}
	sec, err := verbsSection(o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.rows) != 0 || len(sec.notes) != 1 || !strings.HasPrefix(sec.notes[0], "Not measured in this run: ") {
		t.Fatalf("rows %+v, notes %q: want no row and one note saying what is missing", sec.rows, sec.notes)
	}
}

// verbsOutcome is a run's outcome as hostniclab.Run returns it: the
// perftest jobs (plain, vrdma, vrdma, plain) then the per-WQE jobs.
func verbsOutcome() *hostniclab.Outcome {
	w := func(cpu, post uint64) *hostniclab.Window {
		return &hostniclab.Window{WallNs: 2e9, VrdmadCPUNs: cpu, Posted: 4000, PostNs: post, Completions: 4000,
			Memcpy64Ns: 100, GetppidNs: 2000}
	}
	return &hostniclab.Outcome{HostInit: 12 * time.Second, HostTime: 70 * time.Second, PeerTime: 40 * time.Second,
		Results: []hostniclab.JobResult{
			{Job: "write_bw:65536:256", Plain: true, PeerGbitsPerS: 0.10, Verified: true},
			{Job: "write_bw:65536:256", PeerGbitsPerS: 0.09, Verified: true},
			{Job: "write_bw:65536:256", PeerGbitsPerS: 0.07, Verified: true},
			{Job: "write_bw:65536:256", Plain: true, PeerGbitsPerS: 0.12, Verified: true},
			{Job: "write_bw:64:4000", Local: true, Window: w(800e6, 400e6), Verified: true},
			{Job: "write_bw:64:4000", Local: true, Window: w(1000e6, 600e6), Verified: true},
			{Job: "write_bw:64:4000", Local: true, Window: w(1200e6, 600e6), Verified: true},
		}}
}

func TestVerbsRows(t *testing.T) {
	r, err := verbsCollect(verbsOutcome(), 256, 4000)
	if err != nil {
		t.Fatal(err)
	}
	r.hostMemcpy, r.hostGetppid = 2, 1000
	if got := strings.Join(r.order, ","); got != "plain,vrdma,vrdma,plain" {
		t.Errorf("order %s", got)
	}
	rows := verbsRows(r)
	if len(rows) != 4 {
		t.Fatalf("got %d rows, want 4", len(rows))
	}
	// vrdma's median 0.08 against plain's 0.11: 0.73×, missed.
	if tp := rows[0]; tp.figure != 0.08 || tp.baseline != 0.11 || tp.met == nil || *tp.met {
		t.Errorf("throughput row %+v: want 0.08 against 0.11, target missed", tp)
	}
	// Per WQE: 250 µs, of which 150 µs in ibv_post_send, 100 µs vrdmad's
	// own (medians of 200/100, 250/150, 300/150 µs).
	want := []float64{250e3, 150e3, 100e3}
	for i, w := range want {
		if got := rows[1+i].figure; got != w {
			t.Errorf("row %q: %v ns, want %v", rows[1+i].name, got, w)
		}
		if rows[1+i].ratio() == 0 {
			t.Errorf("row %q has no ratio", rows[1+i].name)
		}
	}
	if rows[1].baseline != 100 || rows[2].baseline != 250e3 {
		t.Errorf("baselines %v, %v: want the guest's copy, then the total", rows[1].baseline, rows[2].baseline)
	}
	n := verbsNotes(r)
	// The copy is inflated 50×: vrdmad's own 100 µs is 2 µs here, 2.1 µs
	// with mlx5's assumed post, 0.476 M WQEs/s of one core.
	for _, s := range []string{"vrdma 0.09, 0.07; plain 0.1, 0.12", "12000 WQEs posted", "inflates them 50.0× and 2.0×",
		"≈ 2000 ns on this machine's cores", "≈ 2100 ns per WQE with mlx5", "≈ 0.476 M WQEs/s"} {
		if !strings.Contains(n, s) {
			t.Errorf("notes lack %q:\n%s", s, n)
		}
	}
}

func TestVerbsCollectErrors(t *testing.T) {
	for name, edit := range map[string]func(*hostniclab.Outcome){
		"no rate":      func(o *hostniclab.Outcome) { o.Results[1].PeerGbitsPerS = 0 },
		"no window":    func(o *hostniclab.Outcome) { o.Results[4].Window = nil },
		"nothing post": func(o *hostniclab.Outcome) { o.Results[5].Window.Posted = 0 },
		"unpaired":     func(o *hostniclab.Outcome) { o.Results = o.Results[1:] },
		"no local":     func(o *hostniclab.Outcome) { o.Results = o.Results[:4] },
	} {
		t.Run(name, func(t *testing.T) {
			o := verbsOutcome()
			edit(o)
			if _, err := verbsCollect(o, 256, 4000); err == nil {
				t.Error("no error")
			}
		})
	}
}
