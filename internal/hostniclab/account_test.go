package hostniclab

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
)

func TestParseNICCounters(t *testing.T) {
	text := `# HELP vrdma_hostnic_posted_work_requests_total Work requests posted.
# TYPE vrdma_hostnic_posted_work_requests_total counter
vrdma_hostnic_posted_work_requests_total{rnic="verbs:rxe0:1"} 12000
vrdma_hostnic_post_seconds_total{rnic="verbs:rxe0:1"} 0.25
vrdma_hostnic_completions_total{rnic="verbs:rxe0:1"} 1.1e+04
vrdma_hostnic_cq_events_total{rnic="verbs:rxe0:1"} 7
vrdma_devices 2
`
	got, err := ParseNICCounters([]byte(text))
	want := NICCounters{Posted: 12000, PostNs: 250_000_000, Completions: 11000, NICs: 1}
	if err != nil || got != want {
		t.Fatalf("ParseNICCounters = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"vrdma_devices 2\n", `vrdma_hostnic_post_seconds_total{rnic="x"} nope` + "\n",
		`vrdma_hostnic_posted_work_requests_total{rnic="x"}` + "\n"} {
		if c, err := ParseNICCounters([]byte(bad)); err == nil {
			t.Errorf("ParseNICCounters(%q) = %+v, no error", bad, c)
		}
	}
}

func TestStatCPU(t *testing.T) {
	// Fields 14 and 15 (utime, stime) are 150 and 50 ticks; the command
	// holds a space and a parenthesis.
	line := "42 (vrd mad) x) S 1 42 42 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 9 0 100 1000 10 18446744073709551615\n"
	got, err := statCPU(line)
	if err != nil || got != 2*time.Second {
		t.Fatalf("statCPU = %v, %v; want 2s", got, err)
	}
	if _, err := statCPU("42 (short) S 1 2"); err == nil {
		t.Error("statCPU of a short line: no error")
	}
}

// TestProcCPU reads this process's CPU time, which grows with work.
func TestProcCPU(t *testing.T) {
	a, err := ProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	b, err := ProcCPU(os.Getpid())
	if err != nil || b <= a {
		t.Fatalf("ProcCPU after 50 ms of work: %v then %v, %v", a, b, err)
	}
}

func TestWindow(t *testing.T) {
	from := sample{at: time.Unix(10, 0), cpu: time.Second, nic: NICCounters{Posted: 100, PostNs: 1000, Completions: 90}}
	to := sample{at: time.Unix(12, 0), cpu: 3 * time.Second, nic: NICCounters{Posted: 1100, PostNs: 501000, Completions: 1090}}
	w := window(from, to)
	if w.WallNs != 2e9 || w.VrdmadCPUNs != 2e9 || w.Posted != 1000 || w.PostNs != 500000 || w.Completions != 1000 {
		t.Fatalf("window = %+v", w)
	}
	if total, post := w.PerWQE(); total != 2e6 || post != 500 {
		t.Errorf("PerWQE = %v, %v; want 2e6, 500", total, post)
	}
	if total, post := (Window{}).PerWQE(); total != 0 || post != 0 {
		t.Errorf("PerWQE without posts = %v, %v", total, post)
	}
	if m, g := Calibrate(); m <= 0 || g <= 0 {
		t.Errorf("Calibrate = %v, %v", m, g)
	}
}

// TestPlainArgs: the plain server's flags are guest/perftest-jobs'
// (ib_OP -d DEV -i 1 -x GID -F -s SIZE -n ITERS --report_gbits).
func TestPlainArgs(t *testing.T) {
	job, err := roceinterop.ParseJob("write_bw:65536:256")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(PlainArgs(job, "rxe0"), " ")
	if want := "-d rxe0 -i 1 -x 1 -F -s 65536 -n 256 --report_gbits"; got != want {
		t.Errorf("PlainArgs = %q, want %q", got, want)
	}
	if p, err := PlainProgram(pftexchange.WriteBW); p != "ib_write_bw" || err != nil {
		t.Errorf("PlainProgram(write_bw) = %q, %v", p, err)
	}
	if _, err := PlainProgram(pftexchange.WriteImmBW); err == nil {
		t.Error("PlainProgram(write_imm_bw): no error")
	}
	perftest, err := os.ReadFile("../../guest/perftest-jobs")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{`-i 1 -x "$gid" -F -s "$2" -n "$3"`, "--report_gbits"} {
		if !slices.ContainsFunc(strings.Split(string(perftest), "\n"), func(l string) bool { return strings.Contains(l, f) }) {
			t.Errorf("guest/perftest-jobs no longer runs perftest with %q: PlainArgs must follow it", f)
		}
	}
}
