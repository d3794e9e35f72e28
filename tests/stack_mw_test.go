package tests

import (
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestStackMW (issue 27): memory windows between two guests through
// libibverbs alone (guest/mwcheck, vrdma-mw-check): a type 1 window bound
// with ibv_bind_mw and two type 2 windows bound with IBV_WR_BIND_MW, written
// and read through, refused on a QP a type 2 window is not bound to and
// past a window's end, invalidated by SEND_WITH_INV (the receive reports
// the key) and LOCAL_INV, unbound, and dead afterwards; the server checks
// its MR changed exactly where the windows were written. ibv_devinfo -v
// shows the window capabilities and max_mw.
func TestStackMW(t *testing.T) {
	vmtest := needStack(t)
	devinfo := "ibv_devinfo -v -d vrdma0 | grep -E 'max_mw|MEM_WINDOW|MEM_MGT' | sed 's/^/DEVINFO /' && "
	out := execPair(t, vmtest, 8*time.Minute,
		devinfo+"vrdma-perftest server mw",
		"vrdma-perftest client mw {server}")
	wantAll(t, out, "client| MW-CHECK PASSED", "server| MW-CHECK PASSED",
		"client| VRDMA-SUITE ok", "server| VRDMA-SUITE ok",
		"SEND_WITH_INV received with IBV_WC_WITH_INV",
		"the MR changed exactly where the windows were written",
		"a type 2 window refuses another QP (REM_ACCESS_ERR)",
		"the window LOCAL_INV freed is dead (REM_ACCESS_ERR)",
		"the unbound type 1 window is dead (REM_ACCESS_ERR)")
	if m := regexp.MustCompile(`DEVINFO\s+max_mw:\s+(\d+)`).FindStringSubmatch(out); m == nil {
		t.Errorf("ibv_devinfo -v shows no max_mw:\n%s", grepLines(out, "DEVINFO"))
	} else if n, _ := strconv.Atoi(m[1]); n <= 0 {
		t.Errorf("max_mw = %d, want > 0", n)
	}
	for _, flag := range []string{"MEM_WINDOW", "MEM_WINDOW_TYPE_2B", "MEM_MGT_EXTENSIONS"} {
		if !regexp.MustCompile(`DEVINFO\s+` + flag + `\b`).MatchString(out) {
			t.Errorf("ibv_devinfo -v lacks %s:\n%s", flag, grepLines(out, "DEVINFO"))
		}
	}
	endPair(t, out, 2)
}

// TestStackNVMeoF (issue 27): a kernel storage protocol over vrdma. The
// server guest exports a RAM disk with the kernel's NVMe over RDMA target
// (nvmet-rdma over rdma_cm, kernel RC QPs, RDMA READ and WRITE of the
// host's buffers, SEND_WITH_INV); the client guest connects with the
// kernel's NVMe over RDMA host (nvme-rdma: fast registration with
// IB_WR_REG_MR, LOCAL_INV or remote invalidation), writes 4 MiB to the
// namespace, reads them back past its page cache and compares, and the
// server finds the same bytes on its disk. No kernel warning, rmmod vrdma
// succeeds afterwards.
func TestStackNVMeoF(t *testing.T) {
	vmtest := needStack(t)
	out := execPair(t, vmtest, 8*time.Minute,
		"vrdma-perftest server nvmeof",
		"vrdma-perftest client nvmeof {server} && dmesg | grep -i nvme | sed 's/^/DMESG /'")
	wantAll(t, out, "client| VRDMA-SUITE ok", "server| VRDMA-SUITE ok",
		"client| NVMEOF connected: rdma traddr=10.11.0.1,trsvcid=4420",
		"read back 4194304 bytes")
	m := regexp.MustCompile(`NVMEOF target disk md5 ([0-9a-f]{32}), client wrote ([0-9a-f]{32})`).FindStringSubmatch(out)
	if m == nil || m[1] != m[2] {
		t.Errorf("the target's disk does not hold what the client wrote: %v", m)
	}
	endPair(t, out, 2)
}
