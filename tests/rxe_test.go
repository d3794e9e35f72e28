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
// bandwidth at 64 KiB and WRITE latency at 64 B on the three pairs
// (cmd/vrdma-compare --short): vrdma Go guests, perftest over vrdma in
// stack guests (kernel driver and provider), perftest over soft-RoCE. Every
// pair must produce numbers and both ratios must be computed, the Go
// guests' data must verify (the command fails otherwise), and perftest's
// own output and the results of both perftest pairs must be in the log.
// Skips outside CI when the binaries or a guest image are missing; fails in
// CI.
func TestCompareRxeShort(t *testing.T) {
	if testing.Short() {
		t.Skip("boots six VMs")
	}
	root := repoRoot(t)
	needBinary(t, "qemu-system-x86_64")
	needBinary(t, "vrdmad")
	cmp := needBinary(t, "vrdma-compare")
	for _, f := range []string{"guest/vmlinuz", "guest/initramfs.img", "guest-stack/vmlinuz", "guest-stack/initramfs.img",
		"rxe/vmlinux", "rxe/initramfs.img"} {
		if _, err := os.Stat(filepath.Join(root, "bin", f)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI: bin/%s is missing (make guest-image guest-stack-image rxe-image): %v", f, err)
			}
			t.Skipf("bin/%s not built (make guest-image guest-stack-image rxe-image): %v", f, err)
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
	// | WRITE bandwidth 64 KiB | Gb/s | 1.706 | ... | 1.200 | ... | 0.130 | ... | 9.2× | 13.1× |
	// (Go guest, vrdma perftest and rxe perftest medians, each with its
	// spread; then both ratios).
	fig := `([0-9.]+) \| [^|]+ \| `
	row := regexp.MustCompile(`(?m)^\| (WRITE bandwidth 64 KiB|WRITE latency 64 B) \| [^|]+ \| ` + fig + fig + fig + `([0-9.]+)× \| ([0-9.]+)× \|$`)
	rows := row.FindAllStringSubmatch(string(out), -1)
	if len(rows) != 2 {
		t.Fatalf("got %d table rows with figures for the three pairs and both ratios, want 2:\n%s", len(rows), out)
	}
	for _, r := range rows {
		for _, s := range r[2:] {
			if v, err := strconv.ParseFloat(s, 64); err != nil || v <= 0 {
				t.Errorf("%s: figure %q is not a positive number", r[1], s)
			}
		}
		t.Logf("%s: Go guest %s, vrdma perftest %s, rxe perftest %s; perftest vrdma vs rxe %s×, Go guest vs rxe %s×",
			r[1], r[2], r[3], r[4], r[5], r[6])
	}
	if !strings.Contains(string(out), "Target") {
		t.Errorf("no verdict on issue 18's target:\n%s", out)
	}
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"RDMA_Write BW Test", "RDMA_Write Latency Test", // perftest's banners
		"#bytes", `"transport":"rxe"`, `"transport":"vrdma-perftest"`, `"verified":true`,
		"Device         : vrdma0", "Device         : rxe0", // perftest's own report of the device it ran on
	} {
		if !strings.Contains(string(log), want) {
			t.Errorf("log lacks %q", want)
		}
	}
}
