package tests

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestStackRDMACM (issue 27): rdma_cm over vrdma between two guests. The
// guest kernel's RDMA core runs ib_mad on the device's GSI QP (QP1, shown
// by rdma resource with the kernel as its owner) and ib_cm over it, so
// librdmacm's programs connect unmodified: rping with 100 validated pings,
// ucmatose (RC) and udaddy (UD through SIDR) with two connections each,
// and perftest connecting through rdma_cm (-R). No kernel warning, and
// rmmod vrdma succeeds afterwards (the kernel's QPs and CQs are torn down
// with the ib_device).
func TestStackRDMACM(t *testing.T) {
	vmtest := needStack(t)
	res := "rdma resource show qp link vrdma0/1 | sed 's/^/RES /' && "
	out := execPair(t, vmtest, 12*time.Minute,
		res+"vrdma-perftest server rdmacm",
		res+"vrdma-perftest client rdmacm {server}")
	wantAll(t, out, suiteOK...)
	// The GSI QP is the kernel's QP 1 on both sides.
	for _, side := range []string{"server", "client"} {
		if !regexp.MustCompile(`(?m)^` + side + `\| RES .*lqpn 1 .*type GSI`).MatchString(out) {
			t.Errorf("%s: rdma resource shows no GSI QP 1:\n%s", side, grepLines(out, "RES "))
		}
	}
	// rping -v prints each ping it received and validated (-V).
	if n := len(regexp.MustCompile(`(?m)^client\| ping data: rdma-ping-\d+: `).FindAllString(out, -1)); n != 100 {
		t.Errorf("rping client printed %d pings, want 100", n)
	}
	// ucmatose and udaddy say so on each side once their data moved.
	if n := strings.Count(out, "data transfers complete"); n < 4 {
		t.Errorf("ucmatose/udaddy: %d \"data transfers complete\" lines, want 4:\n%s", n, grepLines(out, "transfers"))
	}
	// perftest's result rows over rdma_cm (bandwidth: bytes iterations
	// peak average msg-rate; latency: bytes iterations t_min ...).
	if n := len(regexp.MustCompile(`(?m)^client\| \s*65536\s+\d+\s+[0-9.]+\s+[0-9.]+`).FindAllString(out, -1)); n < 2 {
		t.Errorf("perftest -R: %d bandwidth rows, want 2", n)
	}
	endPair(t, out, 2)
}
