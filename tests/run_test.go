package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/netlab"
)

// TestMakeRun runs the main job, scripts/run.sh (make run without its
// builds), and checks that each of its three sections showed what it says:
// perftest's own bandwidth and latency tables between two VMs, the
// container operations verified, and RoCEv2 between two namespaces
// verified; and that it leaves no namespace, process or file behind.
func TestMakeRun(t *testing.T) {
	needStackImage(t)
	for _, b := range []string{"vrdma-perf", "vrdmactl"} {
		needBinary(t, b)
	}
	netlab.Require(t)
	root := repoRoot(t)
	tmp := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "run.sh"))
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("make run's job took %.0f s", time.Since(start).Seconds())
	if err != nil {
		t.Fatalf("scripts/run.sh: %v\n%s", err, out)
	}
	s := string(out)
	for _, want := range []string{
		"== 1/3 VM to VM", "== 2/3 without a VM", "== 3/3 two hosts",
		// perftest's own tables, from the client VM.
		"RDMA_Write BW Test", "BW average[MB/sec]", "RDMA_Write Latency Test", "t_typical[usec]",
		"-> shown: unmodified ib_write_bw and ib_write_lat ran between two VMs",
		"-> shown: RDMA WRITE, READ, SEND and atomics between two container processes, every byte verified",
		"-> shown: RDMA WRITE, READ and SEND as RoCEv2 between two hosts' vrdmads",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if n := strings.Count(s, "-> shown:"); n != 3 {
		t.Errorf("%d sections said what they showed, want 3", n)
	}
	if t.Failed() {
		t.Logf("output:\n%s", s)
	}
	if ents, err := os.ReadDir(tmp); err != nil || len(ents) != 0 {
		t.Errorf("run.sh left %d entries in its TMPDIR (%v)", len(ents), err)
	}
	if nss, err := exec.Command("ip", "netns", "list").Output(); err == nil && strings.Contains(string(nss), "vrdma-run-") {
		t.Errorf("run.sh left network namespaces:\n%s", nss)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), tmp) {
			t.Errorf("process %s still runs: %q", filepath.Dir(p), strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
}
