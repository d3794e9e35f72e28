package tests

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// ucxFinal matches ucx_perftest's result line (the client prints it once the
// test's iterations are done): "Final:", the iteration count, then the
// latency, bandwidth and message-rate columns.
var ucxFinal = regexp.MustCompile(`(?m)^client\| Final:\s+(\d+)\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+\d+\s+\d+\s*$`)

// TestStackUCX (issue 27): UCX 1.13 (Debian 12's libucx0 and ucx-utils,
// unmodified) over vrdma between two guests. ucx_info -d lists the device
// with the rc_verbs and ud_verbs transports; ucx_perftest, the client
// connecting to the server over TCP itself, runs UCP tag-matching latency
// and bandwidth and UCP put latency and bandwidth over rc_verbs (ud_verbs
// only to wire up), the UCT put tests on rc_verbs itself, and tag latency
// and bandwidth over ud_verbs, each pinned to vrdma0:1
// (guest/vrdma-middleware's ucx suite). Every test must print its result
// line with the iterations asked for; no kernel warning, and rmmod vrdma
// succeeds afterwards.
func TestStackUCX(t *testing.T) {
	vmtest := needStack(t)
	info := "ucx_info -d | grep -E '^#\\s+(Transport|Device):' | sed 's/^/UCXINFO /' && "
	out := execPair(t, vmtest, 12*time.Minute,
		info+"vrdma-middleware server ucx",
		"vrdma-middleware client ucx {server}")
	wantAll(t, out, suiteOK...)
	// ucx_info -d: the device under each verbs transport.
	for _, tl := range []string{"rc_verbs", "ud_verbs"} {
		re := regexp.MustCompile(`UCXINFO #\s+Transport: ` + tl + `\s*\n[^\n]*UCXINFO #\s+Device: vrdma0:1`)
		if !re.MatchString(out) {
			t.Errorf("ucx_info -d does not list %s on vrdma0:1:\n%s", tl, grepLines(out, "UCXINFO"))
		}
	}
	// Eight tests, each with its result line and exit 0 on both sides.
	finals := ucxFinal.FindAllStringSubmatch(out, -1)
	if len(finals) != 8 {
		t.Errorf("ucx_perftest result lines: %d, want 8:\n%s", len(finals), grepLines(out, "Final:"))
	}
	for _, f := range finals {
		if f[1] != "1000" && f[1] != "200" {
			t.Errorf("result line with %s iterations, want 1000 or 200: %s", f[1], f[0])
		}
	}
	for _, role := range []string{"server", "client"} {
		js := jobs(t, out, role)
		if len(js) != 8 {
			t.Errorf("%s: %d ucx_perftest jobs, want 8", role, len(js))
		}
		for _, j := range js {
			if j["exit"] != float64(0) {
				t.Errorf("%s: %v %v exited %v", role, j["tool"], j["flags"], j["exit"])
			}
		}
	}
	endPair(t, out, 2)
}

// TestStackMPI (issue 27): Open MPI 4.1 (Debian 12's openmpi-bin, unmodified)
// over UCX over vrdma: mpirun on the client guest starts rank 0 there and
// rank 1 on the server guest (through vrdma-rsh: the guests have no ssh),
// with --mca pml ucx and no TCP BTL, UCX limited to rc_verbs on vrdma0. The
// MPI program the image ships (guest/mpi/vrdma_mpi_check.c, built with
// Debian's mpicc) ping-pongs 1 B to 1 MiB with every byte checked on both
// sides, then checks an MPI_Allreduce. Each rank must report both phases
// verified, naming its own host and its peer's, and the two hosts must
// differ.
func TestStackMPI(t *testing.T) {
	vmtest := needStack(t)
	out := execPair(t, vmtest, 8*time.Minute,
		"vrdma-middleware server mpi {client}",
		"vrdma-middleware client mpi {server}")
	wantAll(t, out, "client| VRDMA-SUITE ok", "server| VRDMA-SUITE ok",
		// Rank output comes back to mpirun, on the client.
		"client| vrdma-mpi-check: rank 0 on client: pingpong with rank 1 on server: 11 sizes 1..1048576 B x 8 verified",
		"client| vrdma-mpi-check: rank 1 on server: pingpong with rank 0 on client: 11 sizes 1..1048576 B x 8 verified",
		"client| vrdma-mpi-check: rank 0 on client: allreduce of 2 ranks verified",
		"client| vrdma-mpi-check: rank 1 on server: allreduce of 2 ranks verified",
	)
	if strings.Contains(out, "FAILED") {
		t.Errorf("the MPI program reported a failure:\n%s", grepLines(out, "FAILED"))
	}
	endPair(t, out, 2)
}

// TestStackLibfabric (issue 27): libfabric 1.17 (Debian 12's libfabric-bin,
// unmodified) over vrdma: fi_info -p verbs lists vrdma0 as a verbs domain
// on both guests, and fabtests' fi_pingpong runs over "verbs;ofi_rxm" (RDM
// endpoints on RC QPs that rdma_cm connects) between the two guests, every
// size from 64 B to 6 MiB with 100 round trips each, and both sides report
// the last size (guest/vrdma-middleware's libfabric suite).
func TestStackLibfabric(t *testing.T) {
	vmtest := needStack(t)
	out := execPair(t, vmtest, 6*time.Minute,
		"vrdma-middleware server libfabric",
		"vrdma-middleware client libfabric {server}")
	wantAll(t, out, suiteOK...)
	for _, role := range []string{"server", "client"} {
		if !regexp.MustCompile(`(?m)^` + role + `\|\s+domain: vrdma0$`).MatchString(out) {
			t.Errorf("%s: fi_info -p verbs does not list domain vrdma0", role)
		}
		// fi_pingpong's result line for its largest size: size, iterations,
		// "=100", bytes, time, MB/s, usec/xfer, Mxfers/s.
		if !regexp.MustCompile(`(?m)^` + role + `\| 6m\s+100\s+=100\s+\S+\s+[0-9.]+s\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+$`).MatchString(out) {
			t.Errorf("%s: no fi_pingpong result line for 6 MiB", role)
		}
	}
	endPair(t, out, 2)
}
