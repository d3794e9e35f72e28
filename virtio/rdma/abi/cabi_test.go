package abi

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// cHeader is the C definition of the device ABI that the guest kernel driver
// and the rdma-core provider include.
const cHeader = "../../../guest/include/vrdma-abi.h"

// TestCHeaderMatchesSpec compiles guest/include/vrdma-abi.h and checks every
// struct docs/spec.md defines — its size, and each field's offset and size —
// and the command and status numbers against the Go ABI, so the three
// definitions of the device ABI (spec, Go, C) cannot drift apart.
func TestCHeaderMatchesSpec(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("no C compiler (cc) in CI")
		}
		t.Skip("no C compiler (cc)")
	}
	tables, sizes := specTables(t)
	names := make([]string, 0, len(tables))
	for n := range tables {
		names = append(names, n)
	}
	sort.Strings(names)

	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"vrdma-abi.h\"\n")
	src.WriteString("#define F(s, f) printf(\"field %s %s %zu %zu\\n\", #s, #f, offsetof(struct s, f), sizeof(((struct s *)0)->f))\n")
	src.WriteString("int main(void)\n{\n")
	for _, n := range names {
		fmt.Fprintf(&src, "\tprintf(\"size %s %%zu\\n\", sizeof(struct %s));\n", n, n)
		for _, f := range tables[n] {
			fmt.Fprintf(&src, "\tF(%s, %s);\n", n, f.name)
		}
	}
	ops := make([]Opcode, 0, len(opcodeNames))
	for op := range opcodeNames {
		ops = append(ops, op)
	}
	sort.Slice(ops, func(i, j int) bool { return ops[i] < ops[j] })
	for _, op := range ops {
		fmt.Fprintf(&src, "\tprintf(\"const VRDMA_CMD_%s %%d\\n\", (int)VRDMA_CMD_%s);\n", op, op)
	}
	for s := range statusNames {
		fmt.Fprintf(&src, "\tprintf(\"const VRDMA_STATUS_%s %%d\\n\", (int)VRDMA_STATUS_%s);\n", s.String(), s.String())
	}
	consts := map[string]int{
		"VIRTIO_ID_VRDMA": DeviceID, "VRDMA_ABI_VERSION": ABIVersion,
		"VRDMA_CONTROLQ": ControlQueue, "VRDMA_EVENTQ": EventQueue, "VRDMA_FIRST_DOORBELLQ": FirstDoorbellQueue,
		"VRDMA_CQ_F_ARM_RECORD": CQFlagArmRecord, "VRDMA_CQ_ARM_SOLICITED": CQArmSolicited,
		"VRDMA_QP_F_RQ_NOTIFY":   QPFlagRQNotify,
		"VRDMA_CQ_ARM_SEQ_SHIFT": CQArmSeqShift, "VRDMA_PAGE_SHIFT": PageShift,
		"VRDMA_MAX_PAGE_SHIFT": MaxPageShift, "VRDMA_MIN_SQ_WQE_SHIFT": MinSQWQEShift,
		"VRDMA_MIN_RQ_WQE_SHIFT": MinRQWQEShift, "VRDMA_MAX_WQE_SHIFT": MaxWQEShift,
		"VRDMA_WQE_SIGNALED": WRFlagSignaled, "VRDMA_WQE_INLINE": WRFlagInline,
		"VRDMA_WQE_FENCE": WRFlagFence, "VRDMA_WQE_SOLICITED": WRFlagSolicited,
		"VRDMA_WR_SEND": WROpSend, "VRDMA_WR_SEND_WITH_IMM": WROpSendWithImm,
		"VRDMA_WR_RDMA_WRITE": WROpRDMAWrite, "VRDMA_WR_RDMA_WRITE_WITH_IMM": WROpRDMAWriteWithImm,
		"VRDMA_WR_RDMA_READ": WROpRDMARead, "VRDMA_WR_ATOMIC_CMP_AND_SWP": WROpAtomicCmpSwp,
		"VRDMA_WR_ATOMIC_FETCH_AND_ADD": WROpAtomicFetchAdd,
		"VRDMA_WC_SEND":                 WCOpSend, "VRDMA_WC_RDMA_WRITE": WCOpRDMAWrite, "VRDMA_WC_RDMA_READ": WCOpRDMARead,
		"VRDMA_WC_COMP_SWAP": WCOpCompSwap, "VRDMA_WC_FETCH_ADD": WCOpFetchAdd, "VRDMA_WC_RECV": WCOpRecv,
		"VRDMA_WC_RECV_RDMA_WITH_IMM": WCOpRecvRDMAWithImm, "VRDMA_WC_F_WITH_IMM": WCFlagWithImm,
		"VRDMA_EVENT_CQ_COMPLETION": EventCQCompletion, "VRDMA_EVENT_CQ_ERROR": EventCQError,
		"VRDMA_EVENT_QP_FATAL": EventQPFatal, "VRDMA_EVENT_PORT_ACTIVE": EventPortActive,
		"VRDMA_EVENT_PORT_ERROR": EventPortError, "VRDMA_EVENT_DEVICE_FATAL": EventDeviceFatal,
		"VRDMA_GID_TYPE_ROCE_V1": GIDTypeRoCEv1, "VRDMA_GID_TYPE_ROCE_V2": GIDTypeRoCEv2,
		"VRDMA_QPT_RC": QPTypeRC, "VRDMA_QPS_RESET": QPSReset, "VRDMA_QPS_INIT": QPSInit,
		"VRDMA_QPS_RTR": QPSRTR, "VRDMA_QPS_RTS": QPSRTS, "VRDMA_QPS_ERR": QPSErr,
		"VRDMA_ACCESS_LOCAL_WRITE": AccessLocalWrite, "VRDMA_ACCESS_REMOTE_WRITE": AccessRemoteWrite,
		"VRDMA_ACCESS_REMOTE_READ": AccessRemoteRead, "VRDMA_ACCESS_REMOTE_ATOMIC": AccessRemoteAtomic,
		"VRDMA_QP_STATE": QPAttrState, "VRDMA_QP_ACCESS_FLAGS": QPAttrAccessFlags,
		"VRDMA_QP_PKEY_INDEX": QPAttrPKeyIndex, "VRDMA_QP_PORT": QPAttrPort, "VRDMA_QP_AV": QPAttrAV,
		"VRDMA_QP_PATH_MTU": QPAttrPathMTU, "VRDMA_QP_TIMEOUT": QPAttrTimeout,
		"VRDMA_QP_RETRY_CNT": QPAttrRetryCnt, "VRDMA_QP_RNR_RETRY": QPAttrRNRRetry,
		"VRDMA_QP_RQ_PSN": QPAttrRQPSN, "VRDMA_QP_MAX_QP_RD_ATOMIC": QPAttrMaxQPRdAtomic,
		"VRDMA_QP_MIN_RNR_TIMER": QPAttrMinRNRTimer, "VRDMA_QP_SQ_PSN": QPAttrSQPSN,
		"VRDMA_QP_MAX_DEST_RD_ATOMIC": QPAttrMaxDestRdAtomic, "VRDMA_QP_DEST_QPN": QPAttrDestQPN, "VRDMA_QP_PATHS": QPAttrPaths,
		"VRDMA_QP_QKEY": QPAttrQKey, "VRDMA_QPT_UD": QPTypeUD, "VRDMA_QP_F_SRQ": QPFlagSRQ,
		"VRDMA_SRQ_MAX_WR": SRQAttrMaxWR, "VRDMA_SRQ_LIMIT": SRQAttrLimit,
		"VRDMA_QKEY_USE_QP": QKeyUseQP, "VRDMA_QPT_GSI": QPTypeGSI, "VRDMA_WQE_AV": WRFlagAV,
		"VRDMA_AV_SIZE": AVSize, "VRDMA_DEVICE_CAP_GSI": DeviceCapGSI, "VRDMA_GSI_QPN": GSIQPN,
		"VRDMA_GSI_QKEY": GSIQKey, "VRDMA_REG_MR_F_DMA": RegMRFlagDMA,
		"VRDMA_WR_LOCAL_INV": WROpLocalInv, "VRDMA_WR_SEND_WITH_INV": WROpSendWithInv,
		"VRDMA_WR_BIND_MW": WROpBindMW, "VRDMA_WR_REG_MR": WROpRegMR,
		"VRDMA_WC_BIND_MW": WCOpBindMW, "VRDMA_WC_LOCAL_INV": WCOpLocalInv, "VRDMA_WC_REG_MR": WCOpRegMR,
		"VRDMA_WC_F_WITH_INV": WCFlagWithInv, "VRDMA_ACCESS_MW_BIND": AccessMWBind,
		"VRDMA_MW_TYPE_1": MWType1, "VRDMA_MW_TYPE_2": MWType2, "VRDMA_MAX_FAST_REG_PAGES": MaxFastRegPages,
		"VRDMA_DEV_CAP_MEM_WINDOW": DevCapMemWindow, "VRDMA_DEV_CAP_MEM_MGT_EXTENSIONS": DevCapMemMgtExt,
		"VRDMA_DEV_CAP_MEM_WINDOW_TYPE_2B": DevCapMemWindowType2B, "VRDMA_KEY_BYTE_MASK": KeyByteMask, "VRDMA_GRH_SIZE": GRHSize, "VRDMA_WC_F_GRH": WCFlagGRH,
		"VRDMA_EVENT_SRQ_LIMIT_REACHED": EventSRQLimit, "VRDMA_EVENT_QP_LAST_WQE_REACHED": EventQPLastWQE,
	}
	cnames := make([]string, 0, len(consts))
	for n := range consts {
		cnames = append(cnames, n)
	}
	sort.Strings(cnames)
	for _, n := range cnames {
		fmt.Fprintf(&src, "\tprintf(\"const %s %%lld\\n\", (long long)(%s));\n", n, n)
	}
	src.WriteString("\treturn 0;\n}\n")

	dir := t.TempDir()
	cfile, bin := filepath.Join(dir, "abi.c"), filepath.Join(dir, "abi")
	if err := os.WriteFile(cfile, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	inc, err := filepath.Abs(filepath.Dir(cHeader))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(cc, "-std=gnu11", "-Wall", "-Werror", "-I", inc, "-o", bin, cfile).CombinedOutput(); err != nil {
		t.Fatalf("compiling against %s: %v\n%s", cHeader, err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("running the layout program: %v", err)
	}

	gotSize := map[string]int{}
	gotField := map[string]specField{}
	gotConst := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		w := strings.Fields(sc.Text())
		switch {
		case len(w) == 3 && w[0] == "size":
			gotSize[w[1]], _ = strconv.Atoi(w[2])
		case len(w) == 5 && w[0] == "field":
			off, _ := strconv.Atoi(w[3])
			size, _ := strconv.Atoi(w[4])
			gotField[w[1]+"."+w[2]] = specField{off, size, w[2]}
		case len(w) == 3 && w[0] == "const":
			gotConst[w[1]], _ = strconv.ParseInt(w[2], 10, 64)
		}
	}
	for _, n := range names {
		if gotSize[n] != sizes[n] {
			t.Errorf("struct %s: C size %d, spec says %d", n, gotSize[n], sizes[n])
		}
		for _, f := range tables[n] {
			if got := gotField[n+"."+f.name]; got != f {
				t.Errorf("struct %s field %s: C has offset %d size %d, spec says offset %d size %d",
					n, f.name, got.off, got.size, f.off, f.size)
			}
		}
	}
	for _, op := range ops {
		if got := gotConst["VRDMA_CMD_"+op.String()]; got != int64(op) {
			t.Errorf("VRDMA_CMD_%s = %d in C, %d in Go", op, got, op)
		}
	}
	for s := range statusNames {
		if got := gotConst["VRDMA_STATUS_"+s.String()]; got != int64(s) {
			t.Errorf("VRDMA_STATUS_%s = %d in C, %d in Go", s.String(), got, uint32(s))
		}
	}
	for _, n := range cnames {
		if gotConst[n] != int64(consts[n]) {
			t.Errorf("%s = %d in C, %d in Go", n, gotConst[n], consts[n])
		}
	}
}
