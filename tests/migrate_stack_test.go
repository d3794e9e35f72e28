package tests

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Live migration (issue 29, part 2): a TCG guest whose vrdma device carries
// a verified RDMA stream to a peer guest on the same vrdmad moves to a
// second QEMU (bin/vrdma-vmtest migrate): vrdmad gets an incoming device
// with the migrant's UUID, QEMU carries the device's state
// (patches/0004-vhost-user-rdma-migration.patch) and the stream completes
// with every byte verified on both sides. A migration cancelled halfway
// leaves the migrant in its QEMU with the stream intact. Timings are
// printed, checked only for being there.

// migrateWait bounds one scenario: two boots (~5 s each under TCG), the
// stream and the migration.
const migrateWait = 3 * time.Minute

// needMigrate returns bin/vrdma-vmtest once QEMU, vrdmad and the guest
// image are there (skipping outside CI, failing in CI).
func needMigrate(t *testing.T) string {
	t.Helper()
	needBinary(t, "qemu-system-x86_64")
	needBinary(t, "vrdmad")
	vmtest := needBinary(t, "vrdma-vmtest")
	for _, f := range []string{"guest/vmlinuz", "guest/initramfs.img"} {
		if _, err := os.Stat(filepath.Join(repoRoot(t), "bin", f)); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("CI: bin/%s is missing (make guest-image): %v", f, err)
			}
			t.Skipf("bin/%s not built (make guest-image): %v", f, err)
		}
	}
	return vmtest
}

// migrateLine runs vrdma-vmtest migrate with args (and -v, so the guests'
// consoles are in the output) and returns its VRDMA-MIGRATE line, its
// output and its exit status.
func migrateLine(t *testing.T, vmtest string, args ...string) (map[string]any, string, int) {
	t.Helper()
	args = append([]string{"migrate", "-v", "--memory", "256", "--hugepages", "16"}, args...)
	out, code := vmtestRun(t, vmtest, migrateWait, args...)
	var line map[string]any
	for _, l := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(l, "VRDMA-MIGRATE "); ok {
			if line != nil {
				t.Fatalf("two VRDMA-MIGRATE lines:\n%s", out)
			}
			if err := json.Unmarshal([]byte(rest), &line); err != nil {
				t.Fatalf("bad line %q: %v", l, err)
			}
		}
	}
	if line == nil {
		t.Fatalf("no VRDMA-MIGRATE line (exit %d):\n%s", code, out)
	}
	t.Logf("VRDMA-MIGRATE %v", line)
	return line, out, code
}

// kernelTrouble reports kernel log lines that say something went wrong.
func kernelTrouble(t *testing.T, out string) {
	t.Helper()
	for _, bad := range []string{"WARNING:", "BUG:", "Call Trace:", "Oops", "Kernel panic", "device failed", "VRDMA-KERNEL-WARNING"} {
		if strings.Contains(out, bad) {
			t.Errorf("the guests' consoles say %q:\n%s", bad, grepLines(out, bad))
		}
	}
}

// wantNumber checks that line[key] is a number above zero.
func wantNumber(t *testing.T, line map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := line[k].(float64); !ok || v <= 0 {
			t.Errorf("%s = %v, want a positive number", k, line[k])
		}
	}
}

// migratedStream runs a migration of a 25 s stream of op (after 4 s,
// with the further args) and checks what every completed one must show:
// exit 0, a verified stream, the numbers, no error, no kernel trouble.
// It returns the output.
func migratedStream(t *testing.T, vmtest, op string, args ...string) string {
	t.Helper()
	line, out, code := migrateLine(t, vmtest, append(args, "--op", op, "--duration", "25s", "--after", "4s")...)
	if code != 0 {
		t.Errorf("exit %d:\n%s", code, out)
	}
	if line["verified"] != true || line["status"] != "completed" || line["cancelled"] != false || line["device"] != true || line["op"] != op {
		t.Errorf("got %v, want a completed migration of a verified %s stream", line, op)
	}
	wantNumber(t, line, "downtime_ms", "total_ms", "ram_bytes", "gap_ms", "bytes")
	// Loosely: the stream's pause is the migration's, not the stream's
	// whole length.
	if g, _ := line["gap_ms"].(float64); g >= 25000 {
		t.Errorf("gap_ms %v: the stream stood still for its whole duration", g)
	}
	if e, ok := line["error"]; ok {
		t.Errorf("error %v", e)
	}
	kernelTrouble(t, out)
	return out
}

// TestMigrateStream migrates the migrant's guest in the middle of a
// verified WRITE stream and of a verified SEND stream: the migration
// completes, both sides verify every byte, neither guest sees an error.
func TestMigrateStream(t *testing.T) {
	vmtest := needMigrate(t)
	for _, op := range []string{"write", "send"} {
		t.Run(op, func(t *testing.T) { migratedStream(t, vmtest, op) })
	}
}

// TestMigrateAcross migrates the migrant's guest to a QEMU served by a
// second vrdmad in another network namespace, the peer staying on the
// first, in the middle of a verified WRITE stream and of a verified SEND
// stream over RoCEv2 between the devices' own addresses: the migrant's
// address moves to the second namespace after the switch-over, the peer's
// retransmissions cover the blackout, and the stream completes with every
// byte verified (a page the network transport wrote during the migration
// and did not mark in QEMU's dirty log would arrive stale: the SEND
// stream's check found that once).
func TestMigrateAcross(t *testing.T) {
	vmtest := needMigrate(t)
	for _, op := range []string{"write", "send"} {
		t.Run(op, func(t *testing.T) {
			if out := migratedStream(t, vmtest, op, "--across"); !strings.Contains(out, "moved to vrdmad B's namespace") {
				t.Errorf("the migrant's address did not move:\n%s", out)
			}
		})
	}
}

// TestMigrateCancel starts a slowed-down migration, cancels it halfway:
// the migrant stays in its QEMU and the stream completes verified there.
func TestMigrateCancel(t *testing.T) {
	vmtest := needMigrate(t)
	line, out, code := migrateLine(t, vmtest, "--op", "write", "--cancel", "--duration", "20s", "--after", "3s")
	if code != 0 {
		t.Errorf("exit %d:\n%s", code, out)
	}
	if line["verified"] != true || line["status"] != "cancelled" || line["cancelled"] != true {
		t.Errorf("got %v, want a cancelled migration and a verified stream", line)
	}
	wantNumber(t, line, "ram_bytes", "bytes")
	kernelTrouble(t, out)
}

// TestMigrateNoDevice migrates the same guest without a vrdma device:
// the baseline of the downtime (vrdma-bench's migrate section).
func TestMigrateNoDevice(t *testing.T) {
	vmtest := needMigrate(t)
	line, out, code := migrateLine(t, vmtest, "--no-device", "--after", "2s")
	if code != 0 || line["status"] != "completed" || line["device"] != false {
		t.Errorf("exit %d, got %v; want a completed migration:\n%s", code, line, out)
	}
	wantNumber(t, line, "downtime_ms", "ram_bytes")
	kernelTrouble(t, out)
}

// TestMigrateUsage: streams the scenario cannot run are refused (exit 2).
func TestMigrateUsage(t *testing.T) {
	vmtest := needBinary(t, "vrdma-vmtest")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--across", "--no-device"}, "--no-device and --across do not go together"},
		{[]string{"--op", "read"}, "want write or send"},
		{[]string{"--op", "send", "--size", "64"}, "at least 128"},
		{[]string{"--after", "1m", "--duration", "30s"}, "shorter than --duration"},
	} {
		out, code := vmtestRun(t, vmtest, time.Minute, append([]string{"migrate"}, tc.args...)...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%q: exit %d, output %q; want exit 2 and %q", tc.args, code, out, tc.want)
		}
	}
}
