package tests

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStackSRQUD (issue 27): shared receive queues and UD QPs through the
// standard stack, unmodified: rdma-core's ibv_srq_pingpong (16 RC QPs on
// one SRQ) and ibv_ud_pingpong, each checking its buffers (-c), polling
// and with completion events; perftest's ib_send_bw/ib_send_lat with
// --use-srq and over UD (-c UD). ibv_devinfo -v shows the SRQ limits the
// device offers; the port's netdev is listed under
// /sys/class/infiniband/vrdma0/device/net and by rdma link. No kernel warning, and rmmod vrdma succeeds afterwards.
func TestStackSRQUD(t *testing.T) {
	vmtest := needStack(t)
	devinfo := "ibv_devinfo -v -d vrdma0 | grep -E 'max_srq|max_srq_wr|max_srq_sge' | sed 's/^/DEVINFO /' && " +
		"ls /sys/class/infiniband/vrdma0/device/net | sed 's/^/NETDEV /' && " +
		"rdma link show vrdma0/1 | sed 's/^/RDMALINK /' && "
	out, code := vmtestRun(t, vmtest, 10*time.Minute, "exec-pair",
		"--server", devinfo+"vrdma-perftest server srqud",
		"--client", "vrdma-perftest client srqud {server}")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"client| VRDMA-SUITE ok", "server| VRDMA-SUITE ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// Each pingpong prints its rate on both sides once its exchanges (and
	// with -c its buffer checks) are done: 2 programs × 2 modes × 2 sides.
	if n := len(regexp.MustCompile(`(?m)\| \d+ bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$`).FindAllString(out, -1)); n != 8 {
		t.Errorf("pingpong result lines: %d, want 8", n)
	}
	limits := map[string]int{}
	for _, m := range regexp.MustCompile(`DEVINFO\s+(max_srq\w*):\s+(\d+)`).FindAllStringSubmatch(out, -1) {
		limits[m[1]], _ = strconv.Atoi(m[2])
	}
	for _, k := range []string{"max_srq", "max_srq_wr", "max_srq_sge"} {
		if limits[k] <= 0 {
			t.Errorf("ibv_devinfo -v: %s = %d, want > 0 (%v)", k, limits[k], limits)
		}
	}
	// ibv_srq_pingpong's SRQ holds its default rx depth of 500 receives.
	if limits["max_srq_wr"] > 0 && limits["max_srq_wr"] < 500 {
		t.Errorf("max_srq_wr %d < 500", limits["max_srq_wr"])
	}
	// The port's netdev is discoverable as on a RoCE NIC (issue 27 item 6):
	// under the RDMA device's parent, and in rdma link.
	if !regexp.MustCompile(`(?m)server\| NETDEV eth0$`).MatchString(out) {
		t.Errorf("/sys/class/infiniband/vrdma0/device/net does not list eth0:\n%s", grepLines(out, "NETDEV"))
	}
	if !regexp.MustCompile(`RDMALINK .*netdev eth0`).MatchString(out) {
		t.Errorf("rdma link does not show netdev eth0:\n%s", grepLines(out, "RDMALINK"))
	}
	checkGuestsClean(t, out, 2)
	if t.Failed() {
		t.Log(out)
	}
}
