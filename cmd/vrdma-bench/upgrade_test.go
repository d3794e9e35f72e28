package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestLongestAcross: the gap reported for a handover is the longest one
// between consecutive completions that overlaps the request…answer
// window, including the gaps that straddle its edges.
func TestLongestAcross(t *testing.T) {
	ends := []int64{0, 10, 20, 100, 110, 400, 410, 420}
	for _, tt := range []struct {
		name     string
		from, to int64
		want     time.Duration
		ok       bool
	}{
		{"inside one gap", 150, 200, 290, true},
		{"straddles the start of a gap", 105, 120, 290, true},
		{"covers several gaps", 15, 105, 80, true},
		{"the window starts at a completion", 100, 105, 10, true},
		{"before the stream", -50, -10, 0, false},
		{"after the last completion", 500, 600, 0, false},
		{"the last gap", 415, 600, 10, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := longestAcross(ends, tt.from, tt.to)
			if got != tt.want || ok != tt.ok {
				t.Errorf("longestAcross(%d, %d): got %v, %v, want %v, %v", tt.from, tt.to, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestStamp: a slot that still holds an earlier round's bytes (a lost
// WRITE) or one changed byte is not taken for the round's.
func TestStamp(t *testing.T) {
	const r = 100
	b := make([]byte, upgradeMsg)
	stamp(b, r)
	if !stamped(b, r) {
		t.Fatalf("round %d's bytes are not taken for its own", r)
	}
	// The slot's previous WRITE was upgradeSlots rounds before (the
	// stamps repeat every 256 rounds, beyond upgradeSlots).
	for _, other := range []uint64{r - upgradeSlots, r - 1, r + 1} {
		if stamped(b, other) {
			t.Errorf("round %d's bytes are taken for round %d's", r, other)
		}
	}
	b[upgradeMsg-1]++
	if stamped(b, r) {
		t.Error("a changed byte went unnoticed")
	}
}

// TestUpgradeStream runs the upgrade section's measurement on a vrdmad
// built from this tree with a short stream and two handovers, and checks
// what it found: every handover answered by a new process serving both
// devices, the stream verified across them, gaps measured, the last
// process stopped cleanly.
func TestUpgradeStream(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the daemon locks registered memory")
	}
	if _, err := exec.LookPath("go"); err != nil {
		if _, err := os.Stat(filepath.Join(runtime.GOROOT(), "bin", "go")); err != nil {
			t.Skip("no go tool to build vrdmad with")
		}
	}
	bin, err := buildVrdmad(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const rounds, settle, upgrades = 500, 100, 2
	res, err := measureUpgrade(upgradeConfig{vrdmad: bin, rounds: rounds, settle: settle, upgrades: upgrades, progress: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(upgradeTable(res))
	if res.stopErr != nil {
		t.Errorf("the last vrdmad did not exit cleanly: %v", res.stopErr)
	}
	if len(res.base) != rounds {
		t.Errorf("baseline gaps: got %d, want %d", len(res.base), rounds)
	}
	if want := uint64(settle + rounds + (upgrades+1)*settle); res.rounds < want {
		t.Errorf("rounds completed and verified: got %d, want at least %d", res.rounds, want)
	}
	if len(res.handovers) != upgrades {
		t.Fatalf("handovers: got %d, want %d", len(res.handovers), upgrades)
	}
	pids := map[int]bool{}
	for i, h := range res.handovers {
		if h.ans.PID == h.oldPid || pids[h.ans.PID] || h.ans.Devices != 2 || h.ans.Connected != 2 {
			t.Errorf("handover %d: answer %+v from pid %d", i+1, h.ans, h.oldPid)
		}
		pids[h.oldPid], pids[h.ans.PID] = true, true
		if h.gap <= 0 || h.ans.PauseMS <= 0 {
			t.Errorf("handover %d: gap %v, pause_ms %v: want both measured", i+1, h.gap, h.ans.PauseMS)
		}
	}
	rows := upgradeRows(res)
	if len(rows) != 2 || rows[0].met == nil || rows[0].baseline <= 0 || rows[1].met != nil {
		t.Errorf("rows %+v: want the gap row judged against a measured p99, the pause_ms row informative", rows)
	}
	if !strings.Contains(upgradeTable(res), "Handover 2:") {
		t.Errorf("the raw figures miss the second handover")
	}
}

// TestUpgradeFlags: --upgrades defaults to upgradeCount (upgradeQuickCount
// with --quick), keeps a count given, and refuses a negative one.
func TestUpgradeFlags(t *testing.T) {
	for _, tt := range []struct {
		args string
		want int
		ok   bool
	}{
		{"", upgradeCount, true},
		{"--quick", upgradeQuickCount, true},
		{"--quick --upgrades 5", 5, true},
		{"--upgrades 1", 1, true},
		{"--upgrades -1", 0, false},
	} {
		t.Run(tt.args, func(t *testing.T) {
			o, err := parseFlags(strings.Fields(tt.args))
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
			if tt.ok && o.upgrades != tt.want {
				t.Errorf("got %d upgrades, want %d", o.upgrades, tt.want)
			}
		})
	}
}

// TestTinyRatio: a figure far beyond its baseline (the upgrade gap
// against the stream's p99) prints its ratio with two significant
// digits, not as 0.00×.
func TestTinyRatio(t *testing.T) {
	r := row{name: "gap", figure: 100, unit: "ms", baseName: "p99", baseline: 0.031, baseUnit: "ms", invRatio: true}
	if got, want := r.cells()[3], "0.00031×"; got != want {
		t.Errorf("ratio cell: got %q, want %q", got, want)
	}
	r.baseline = 50
	if got, want := r.cells()[3], "0.50×"; got != want {
		t.Errorf("ratio cell: got %q, want %q", got, want)
	}
}
