package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCompareRxeShort is make compare-rxe's short form: one run of WRITE
// bandwidth at 64 KiB and WRITE latency at 64 B on both pairs (vrdma
// guests and soft-RoCE guests, cmd/vrdma-compare --short). Both pairs must
// produce numbers, vrdma's data must verify (the command fails otherwise),
// and perftest's own output must be in the log. Skips outside CI when the
// binaries or either guest image are missing; fails in CI.
func TestCompareRxeShort(t *testing.T) {
	if testing.Short() {
		t.Skip("boots four VMs")
	}
	root := repoRoot(t)
	needBinary(t, "qemu-system-x86_64")
	needBinary(t, "vrdmad")
	cmp := needBinary(t, "vrdma-compare")
	for _, f := range []string{"guest/vmlinuz", "guest/initramfs.img", "rxe/vmlinux", "rxe/initramfs.img"} {
		if _, err := os.Stat(filepath.Join(root, "bin", f)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI: bin/%s is missing (make guest-image rxe-image): %v", f, err)
			}
			t.Skipf("bin/%s not built (make guest-image rxe-image): %v", f, err)
		}
	}
	logPath := filepath.Join(t.TempDir(), "compare-rxe.log")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, cmp, "--short", "--log", logPath).CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(logPath)
		t.Fatalf("vrdma-compare --short: %v\n%s\n=== log ===\n%s", err, out, log)
	}
	// | WRITE bandwidth 64 KiB | Gb/s | 1.706 | ... | 0.130 | ... | 13.1× |
	row := regexp.MustCompile(`(?m)^\| (WRITE bandwidth 64 KiB|WRITE latency 64 B) \| [^|]+ \| ([0-9.]+) \| [^|]+ \| ([0-9.]+) \| [^|]+ \| ([0-9.]+)× \|$`)
	rows := row.FindAllStringSubmatch(string(out), -1)
	if len(rows) != 2 {
		t.Fatalf("got %d table rows with figures for both pairs, want 2:\n%s", len(rows), out)
	}
	for _, r := range rows {
		for _, s := range r[2:] {
			if v, err := strconv.ParseFloat(s, 64); err != nil || v <= 0 {
				t.Errorf("%s: figure %q is not a positive number", r[1], s)
			}
		}
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"RDMA_Write BW Test", "RDMA_Write Latency Test", // perftest's banners
		"#bytes", `"transport":"rxe"`, `"verified":true`,
	} {
		if !strings.Contains(string(log), want) {
			t.Errorf("log lacks %q", want)
		}
	}
}
