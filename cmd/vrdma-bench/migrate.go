package main

// The migrate section (issue 29: "downtime reported by QEMU with the vrdma
// device against the same guest without it, and the longest stream
// gap"). It runs `vrdma-vmtest migrate` three times under TCG:
// --no-device (the same guest, its memory and program, without a vrdma
// device: the baseline), with the device carrying a verified WRITE stream
// to a peer guest on the same vrdmad, and the same with --across (to a
// second vrdmad, the stream over RoCEv2). Each prints one VRDMA-MIGRATE line; the rows
// are QEMU's downtime with the device against the baseline's, and the
// stream's longest gap between completions against the downtime. A run
// with the device whose stream is not verified fails the section (and
// make bench); missing binaries or guest image leave it unmeasured.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// migrateRun is one VRDMA-MIGRATE line (cmd/vrdma-vmtest migrate.go).
type migrateRun struct {
	Status     string  `json:"status"`
	Device     bool    `json:"device"`
	DowntimeMS float64 `json:"downtime_ms"`
	TotalMS    float64 `json:"total_ms"`
	RAMBytes   uint64  `json:"ram_bytes"`
	GapMS      float64 `json:"gap_ms"`
	Bytes      uint64  `json:"bytes"`
	Verified   bool    `json:"verified"`
	Error      string  `json:"error"`
	line       string  // the line as printed
}

// migrateTimeout bounds one vrdma-vmtest run.
const migrateTimeout = 4 * time.Minute

// runMigrateScenario runs `vrdma-vmtest migrate args...` and returns its
// VRDMA-MIGRATE line; the exit status is the caller's to judge (it is in
// err with the line still returned).
func runMigrateScenario(vmtest string, args ...string) (migrateRun, error) {
	args = append([]string{"migrate", "--timeout", migrateTimeout.String(), "--memory", "256", "--hugepages", "16"}, args...)
	out, err := exec.Command(vmtest, args...).CombinedOutput()
	var r migrateRun
	found := false
	for _, l := range splitLines(string(out)) {
		rest, ok := strings.CutPrefix(l, "VRDMA-MIGRATE ")
		if !ok {
			continue
		}
		if jerr := json.Unmarshal([]byte(rest), &r); jerr != nil {
			return r, fmt.Errorf("vrdma-vmtest %s: bad line %q: %v", strings.Join(args, " "), l, jerr)
		}
		r.line, found = rest, true
	}
	if !found {
		if err == nil {
			err = errors.New("no VRDMA-MIGRATE line")
		}
		return r, fmt.Errorf("vrdma-vmtest %s: %w: %s", strings.Join(args, " "), err, lastLines(string(out), 5))
	}
	if err != nil {
		return r, fmt.Errorf("vrdma-vmtest %s: %w", strings.Join(args, " "), err)
	}
	return r, nil
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	ls := splitLines(strings.TrimSpace(s))
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}

func migrateSection(o options, w io.Writer) (section, error) {
	sec := section{title: "Live migration under TCG: downtime and stream gap",
		intro: "Three runs of `vrdma-vmtest migrate` (256 MiB TCG guests, the patched QEMU, one vrdmad; " +
			"the migration over a unix socket at up to 4 GiB/s). Baseline: `--no-device`, the same guest " +
			"(its memory, kernel and idle program) without a vrdma device. Figure: the guest with its vrdma " +
			"device carrying a verified 4 KiB RDMA WRITE stream to a peer guest, migrated to a second QEMU " +
			"whose device vrdmad creates as the incoming side of the migrant's (same UUID): QEMU's downtime " +
			"(query-migrate, the VM stopped at switch-over, the device's state saved and loaded in it), and " +
			"the stream's longest gap between completions, measured by the peer, whose clock does not stop. " +
			"The third run is the second with `--across`: the destination QEMU's device on a second vrdmad in " +
			"another network namespace, the stream over RoCEv2 between the devices' own addresses, the " +
			"migrant's address moved to that namespace once QEMU reports the migration completed. " +
			"TCG and a shared host make all of it noisy: the rows are one run each."}
	reason := guestsMissing(o)
	if reason != "" {
		sec.notes = append(sec.notes, "Not measured in this run: "+reason+".")
		return sec, nil
	}
	progress(w, "migrate: the guest without a vrdma device (baseline)")
	bare, err := runMigrateScenario(o.vmtest, "--no-device", "--after", "2s")
	if err != nil {
		return sec, fmt.Errorf("migrate: %w", err)
	}
	progress(w, "migrate: the guest with its vrdma device and a verified WRITE stream")
	dev, err := runMigrateScenario(o.vmtest, "--op", "write", "--duration", "25s", "--after", "4s")
	if err != nil {
		return sec, fmt.Errorf("migrate: %w", err)
	}
	progress(w, "migrate --across: to a second vrdmad in another network namespace, the stream over RoCEv2")
	across, err := runMigrateScenario(o.vmtest, "--across", "--op", "write", "--duration", "25s", "--after", "4s")
	if err != nil {
		return sec, fmt.Errorf("migrate --across: %w", err)
	}
	sec.rows = migrateRows(bare, dev, across)
	sec.notes = append(sec.notes, "With `--across` the guests' QPs use an ACK timeout of 2^18 × 4.096 µs (1.07 s): "+
		"the stream's gap is the blackout (switch-over and the address's move) rounded up to the peer's next "+
		"retransmission.", "The VRDMA-MIGRATE lines:", "```\n"+bare.line+"\n"+dev.line+"\n"+across.line+"\n```")
	for _, n := range sec.notes {
		fmt.Fprintln(w, n)
	}
	return sec, nil
}

// migrateAddedTarget is issue 29's bound on the downtime the device adds
// to the same guest's migration without it.
const migrateAddedTarget = 50 * time.Millisecond

func migrateRows(bare, dev, across migrateRun) []row {
	downtime := func(name string, r migrateRun) row {
		return row{name: name, figure: r.DowntimeMS, unit: "ms",
			baseName: "same guest without the device", baseline: bare.DowntimeMS, baseUnit: "ms", invRatio: true,
			target: fmt.Sprintf("device adds ≤ %d ms", migrateAddedTarget.Milliseconds()),
			met:    boolp(r.DowntimeMS-bare.DowntimeMS <= ms(migrateAddedTarget))}
	}
	gap := func(name string, r migrateRun) row {
		return row{name: name, figure: r.GapMS, unit: "ms",
			baseName: "QEMU's downtime", baseline: r.DowntimeMS, baseUnit: "ms", invRatio: true}
	}
	return []row{
		downtime("migration downtime with the vrdma device (QEMU's)", dev),
		gap("migration: longest stream gap", dev),
		{name: "migration total time with the vrdma device", figure: dev.TotalMS, unit: "ms",
			baseName: "same guest without the device", baseline: bare.TotalMS, baseUnit: "ms", invRatio: true},
		downtime("migration to another vrdmad (RoCEv2): downtime (QEMU's)", across),
		gap("migration to another vrdmad: longest stream gap", across),
	}
}
