package main

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeTools are stand-ins for ucx_perftest and ib_send_lat that record
// their environment and arguments in $JOBS_LOG and print what Debian's
// programs print: UCX 1.13's table, whose final row is labelled "Final:"
// in builds with OpenMP and not otherwise (both forms are exercised), and
// perftest's latency table.
var fakeTools = map[string]string{
	"ucx_perftest": `#!/bin/sh
echo "ucx_perftest UCX_TLS=$UCX_TLS UCX_NET_DEVICES=$UCX_NET_DEVICES DGID_CHECK=$UCX_UD_VERBS_ETH_DGID_CHECK $*" >>"$JOBS_LOG"
echo "+--------------+--------------+---------+---------+---------+----------+----------+-----------+-----------+"
echo "|    Stage     | # iterations | typical | average | overall |  average |  overall |  average  |  overall  |"
case "$*" in
*tag_bw*) echo "Final:                   200      0.000   293.441   293.441      212.99     212.99        3408        3408" ;;
*tag_lat*) echo "                 1000     41.250    44.101    44.101        0.17       0.17       22675       22675" ;;
esac
`,
	"ib_send_lat": `#!/bin/sh
echo "ib_send_lat $*" >>"$JOBS_LOG"
echo " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
echo " 64       1000          30.12          90.00        35.50              36.25          2.00            60.00                  80.00"
`,
}

// TestPerftestJobsMiddleware runs guest/perftest-jobs' client with the
// middleware jobs against fake programs: the command lines it builds
// (UCX's environment, -R without -x) and the VRDMA-RESULT lines it turns
// their output into, which Figure must accept.
func TestPerftestJobsMiddleware(t *testing.T) {
	dir := t.TempDir()
	for name, body := range fakeTools {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	logPath := filepath.Join(dir, "jobs.log")
	script, err := filepath.Abs("../../guest/perftest-jobs")
	if err != nil {
		t.Fatal(err)
	}
	ws := Workloads[len(Workloads)-3:]
	jobs := make([]string, len(ws))
	for i, w := range ws {
		jobs[i] = w.PerftestJob()
	}
	cmd := exec.Command("sh", script, "-d", "vrdma0", "-t", "vrdma-perftest", "-x", "1", "client", strings.Join(jobs, ","), "10.9.0.1")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin", "JOBS_LOG=" + logPath}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("perftest-jobs: %v\n%s", err, out)
	}
	calls, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"ucx_perftest UCX_TLS=rc_verbs,ud_verbs:aux UCX_NET_DEVICES=vrdma0:1 DGID_CHECK=n -t tag_bw -s 65536 -n 200 -w 20 -f 10.9.0.1",
		"ucx_perftest UCX_TLS=rc_verbs,ud_verbs:aux UCX_NET_DEVICES=vrdma0:1 DGID_CHECK=n -t tag_lat -s 8 -n 1000 -w 100 -f 10.9.0.1",
		"ib_send_lat -d vrdma0 -i 1 -F -s 64 -n 1000 -R 10.9.0.1",
	} {
		if !strings.Contains(string(calls), want+"\n") {
			t.Errorf("no call %q in\n%s", want, calls)
		}
	}
	wantFig := map[string]float64{"ucx_tag_bw": 212.99 * 1048576 * 8 / 1e9, "ucx_tag_lat": 41.25, "send_lat_cm": 35.5}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "VRDMA-ERROR") {
			t.Errorf("%s", line)
		}
		payload, ok := strings.CutPrefix(line, "VRDMA-RESULT ")
		if !ok {
			continue
		}
		var r struct {
			Op string `json:"op"`
		}
		if err := json.Unmarshal([]byte(payload), &r); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		for _, w := range ws {
			if w.PerftestOp != r.Op {
				continue
			}
			n++
			res := result(t, payload)
			v, err := w.Figure(res, VrdmaPerftest)
			if err != nil {
				t.Errorf("%s: %v", w.Name, err)
			} else if math.Abs(v-wantFig[r.Op]) > 1e-3 {
				t.Errorf("%s: figure %v, want %v", w.Name, v, wantFig[r.Op])
			}
		}
	}
	if n != len(ws) {
		t.Errorf("%d results for %d jobs:\n%s", n, len(ws), out)
	}
}

// TestMiddlewareRowsSkipGoGuest: the Go guest runs no workload it lacks,
// and a result offered for one is refused.
func TestMiddlewareRowsSkipGoGuest(t *testing.T) {
	for _, w := range Workloads {
		if got, want := w.Runs(GoGuest), w.VrdmaOp != ""; got != want {
			t.Errorf("%s: Runs(GoGuest) = %v", w.Name, got)
		}
		if !w.Runs(VrdmaPerftest) || !w.Runs(RxePerftest) {
			t.Errorf("%s: a perftest pair does not run it", w.Name)
		}
	}
	w := Workloads[len(Workloads)-1]
	if _, err := w.Figure(result(t, `{"op":"","size":64,"verified":true,"lat_us_p50":3}`), GoGuest); err == nil {
		t.Errorf("%s: the Go guest's figure was accepted", w.Name)
	}
}

func TestSelect(t *testing.T) {
	for _, tc := range []struct {
		words string
		want  []string
	}{
		{"ucx", []string{"UCX tag bandwidth 64 KiB (rc_verbs)", "UCX tag latency 8 B (rc_verbs)"}},
		{"RDMA_CM, read", []string{"READ bandwidth 64 KiB", "SEND latency 64 B, rdma_cm (-R)"}},
		{",", nil},
		{"nothing", nil},
	} {
		var got []string
		for _, w := range Select(Workloads, tc.words) {
			got = append(got, w.Name)
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("Select(%q) = %q, want %q", tc.words, got, tc.want)
		}
	}
}
