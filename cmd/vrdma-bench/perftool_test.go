package main

import (
	"bytes"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestPerftestSection runs the perftest section with a freshly built
// vrdma-perf: each row has a two-process figure beside its one-process
// baseline, the bandwidth rows carry the ≥ 0.8× target, and the report
// prints them; without the binary the section says it did not run.
func TestPerftestSection(t *testing.T) {
	o := options{perf: filepath.Join(t.TempDir(), "vrdma-perf"), s: settings{rowTime: 300 * time.Millisecond, repeats: 1}}
	sec, err := perftestSection(o, io.Discard)
	if err != nil || len(sec.rows) != 0 || len(sec.notes) != 1 || !strings.Contains(sec.notes[0], "is not built") {
		t.Errorf("without vrdma-perf: got %+v, %v; want a note that it is not built", sec, err)
	}
	if testing.Short() {
		t.Skip("short mode: builds vrdma-perf and runs it (make test runs it in its full pass)")
	}
	if out, err := exec.Command("go", "build", "-o", o.perf, "../vrdma-perf").CombinedOutput(); err != nil {
		t.Fatalf("build vrdma-perf: %v: %s", err, out)
	}
	sec, err = perftestSection(o, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(sec.rows) != len(perfRows) {
		t.Fatalf("got %d rows, want %d: %+v", len(sec.rows), len(perfRows), sec.rows)
	}
	for i, r := range sec.rows {
		if r.name != perfRows[i].name+", two processes" || r.baseName != "one process" || r.figure <= 0 || r.baseline <= 0 {
			t.Errorf("row %d: got %+v, want both figures of %s", i, r, perfRows[i].name)
		}
		if bw := !perfRows[i].lat; bw != (r.met != nil) || (bw && r.target != "≥ 0.8×") {
			t.Errorf("row %q: target %q, judged %v", r.name, r.target, r.met != nil)
		}
	}
	var md bytes.Buffer
	writeMarkdown(&md, "env", []section{sec}, time.Second)
	if !strings.Contains(md.String(), "| ib_write_bw 64 KiB, two processes |") {
		t.Errorf("the report lacks the two-process row:\n%s", md.String())
	}
	t.Logf("\n%s", md.String())
}
