package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/hostniclab"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/vmm/qemu"
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

// TestVerbsSectionRxe runs the section as make bench does, at the
// repository's root, with quick settings (two pairs of 64-iteration
// ib_write_bw jobs, one 500-WQE window: two TCG guests, under a minute
// on an idle machine). It checks that every row was measured, not
// whether the target was met (TCG on a shared machine is noisy). Needs
// make build, make qemu and make rxe-image; CI has them.
func TestVerbsSectionRxe(t *testing.T) {
	if testing.Short() {
		t.Skip("boots two TCG guests")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	_, err = qemu.FindBinary(root)
	if err == nil {
		_, _, err = roceinterop.RxeImage(root)
	}
	if err == nil {
		err = verbsBinaries(filepath.Join(root, "bin", "vrdmad"), filepath.Join(root, "bin", "vrdma-vmtest"))
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: %v", err)
		}
		t.Skip(err)
	}
	t.Chdir(root)
	var progress strings.Builder
	o := options{vmtest: "bin/vrdma-vmtest", s: settings{rowTime: 50 * time.Millisecond, repeats: 1, quick: true}}
	sec, err := verbsSection(o, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.rows) != 4 {
		t.Fatalf("got %d rows, want 4; notes %q\n%s", len(sec.rows), sec.notes, progress.String())
	}
	for _, r := range sec.rows {
		if r.figure <= 0 || r.baseline <= 0 {
			t.Errorf("row %q: figure %v, baseline %v: want both measured", r.name, r.figure, r.baseline)
		}
		t.Logf("%s", strings.Join(r.cells(), " | "))
	}
	if len(sec.notes) != 2 || !strings.Contains(sec.notes[1], "WQEs posted") {
		t.Errorf("notes %q: want the verdict and the method", sec.notes)
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
	// Per WQE: the median window's 250 µs, of which 150 µs in
	// ibv_post_send, 100 µs vrdmad's own.
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
