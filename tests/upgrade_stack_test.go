package tests

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestStackUpgrade (issue 29): two TCG guests run ib_write_bw -D 30 and
// ib_send_lat at the same time over the vrdma kernel driver and Debian's
// perftest while vrdmad is upgraded twice (vrdma-vmtest exec-pair
// --upgrades 2: a new vrdmad process takes every device over, live).
// Both perftests exit 0, no guest logs anything suspicious (a DEVICE_FATAL
// would: "device failed"), and the driver unloads cleanly.
func TestStackUpgrade(t *testing.T) {
	vmtest := needStack(t)
	// About 45 s on a quiet machine; 150 s and more when other work
	// shares the two cores (ib_send_lat's 200000 round trips under TCG):
	// the bound catches a stream that stopped, not a slow one.
	out, code := vmtestRun(t, vmtest, 10*time.Minute, "exec-pair", "--upgrades", "2", "--upgrade-interval", "8s",
		"--server", "vrdma-perftest server upgrade", "--client", "vrdma-perftest client upgrade {server}")
	defer endPair(t, out, 2)
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	wantAll(t, out, suiteOK...)
	for _, role := range []string{"server", "client"} {
		js := jobs(t, out, role)
		if len(js) != 2 {
			t.Errorf("%s: %d jobs, want ib_write_bw and ib_send_lat", role, len(js))
		}
		for _, j := range js {
			if j["exit"] != float64(0) {
				t.Errorf("%s: %v", role, j)
			}
		}
	}
	pids := map[float64]bool{}
	n := 0
	for _, l := range strings.Split(out, "\n") {
		rest, ok := strings.CutPrefix(l, "VRDMA-UPGRADE ")
		if !ok {
			continue
		}
		n++
		var u map[string]any
		if err := json.Unmarshal([]byte(rest), &u); err != nil {
			t.Fatalf("bad line %q: %v", l, err)
		}
		if u["ok"] != true {
			t.Errorf("upgrade failed: %s", rest)
		}
		for _, k := range []string{"old_pid", "new_pid"} {
			if p, _ := u[k].(float64); p > 0 {
				pids[p] = true
			}
		}
		t.Logf("upgrade: %s", rest)
	}
	if n != 2 || len(pids) != 3 {
		t.Errorf("%d upgrades through %d vrdmad processes, want 2 through 3", n, len(pids))
	}
	if strings.Contains(out, "device failed") {
		t.Errorf("a guest's driver saw its device fail:\n%s", grepLines(out, "device failed"))
	}
}
