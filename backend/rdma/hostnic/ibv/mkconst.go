//go:build ignore

// mkconst writes zconst.go (the constants, as literals, for builds with and
// without cgo) and zconst_check.go (compile-time checks, in every cgo build,
// that each literal equals its C.IBV_* value in the installed verbs.h).
// The values come from the headers through `go tool cgo -godefs`.
//
//	go run mkconst.go   (in this directory; needs gcc and libibverbs-dev)
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

type group struct {
	typ, doc string
	consts   [][2]string // Go name, C name
}

var groups = []group{
	{"WCStatus", "Work completion statuses (enum ibv_wc_status).", [][2]string{
		{"WCSuccess", "IBV_WC_SUCCESS"}, {"WCLocLenErr", "IBV_WC_LOC_LEN_ERR"},
		{"WCLocQPOpErr", "IBV_WC_LOC_QP_OP_ERR"}, {"WCLocEECOpErr", "IBV_WC_LOC_EEC_OP_ERR"},
		{"WCLocProtErr", "IBV_WC_LOC_PROT_ERR"}, {"WCWRFlushErr", "IBV_WC_WR_FLUSH_ERR"},
		{"WCMWBindErr", "IBV_WC_MW_BIND_ERR"}, {"WCBadRespErr", "IBV_WC_BAD_RESP_ERR"},
		{"WCLocAccessErr", "IBV_WC_LOC_ACCESS_ERR"}, {"WCRemInvReqErr", "IBV_WC_REM_INV_REQ_ERR"},
		{"WCRemAccessErr", "IBV_WC_REM_ACCESS_ERR"}, {"WCRemOpErr", "IBV_WC_REM_OP_ERR"},
		{"WCRetryExcErr", "IBV_WC_RETRY_EXC_ERR"}, {"WCRNRRetryExcErr", "IBV_WC_RNR_RETRY_EXC_ERR"},
		{"WCLocRDDViolErr", "IBV_WC_LOC_RDD_VIOL_ERR"}, {"WCRemInvRdReqErr", "IBV_WC_REM_INV_RD_REQ_ERR"},
		{"WCRemAbortErr", "IBV_WC_REM_ABORT_ERR"}, {"WCInvEECNErr", "IBV_WC_INV_EECN_ERR"},
		{"WCInvEECStateErr", "IBV_WC_INV_EEC_STATE_ERR"}, {"WCFatalErr", "IBV_WC_FATAL_ERR"},
		{"WCRespTimeoutErr", "IBV_WC_RESP_TIMEOUT_ERR"}, {"WCGeneralErr", "IBV_WC_GENERAL_ERR"},
	}},
	{"WCOpcode", "Work completion opcodes (enum ibv_wc_opcode).", [][2]string{
		{"WCOpSend", "IBV_WC_SEND"}, {"WCOpRDMAWrite", "IBV_WC_RDMA_WRITE"},
		{"WCOpRDMARead", "IBV_WC_RDMA_READ"}, {"WCOpCompSwap", "IBV_WC_COMP_SWAP"},
		{"WCOpFetchAdd", "IBV_WC_FETCH_ADD"}, {"WCOpBindMW", "IBV_WC_BIND_MW"},
		{"WCOpLocalInv", "IBV_WC_LOCAL_INV"}, {"WCOpRecv", "IBV_WC_RECV"},
		{"WCOpRecvRDMAWithImm", "IBV_WC_RECV_RDMA_WITH_IMM"},
	}},
	{"WCFlags", "Work completion flags (enum ibv_wc_flags).", [][2]string{
		{"WCWithGRH", "IBV_WC_GRH"}, {"WCWithImm", "IBV_WC_WITH_IMM"},
		{"WCIPCsumOK", "IBV_WC_IP_CSUM_OK"}, {"WCWithInv", "IBV_WC_WITH_INV"},
	}},
	{"WROpcode", "Send work request opcodes (enum ibv_wr_opcode).", [][2]string{
		{"WRRDMAWrite", "IBV_WR_RDMA_WRITE"}, {"WRRDMAWriteWithImm", "IBV_WR_RDMA_WRITE_WITH_IMM"},
		{"WRSend", "IBV_WR_SEND"}, {"WRSendWithImm", "IBV_WR_SEND_WITH_IMM"},
		{"WRRDMARead", "IBV_WR_RDMA_READ"}, {"WRAtomicCmpAndSwp", "IBV_WR_ATOMIC_CMP_AND_SWP"},
		{"WRAtomicFetchAndAdd", "IBV_WR_ATOMIC_FETCH_AND_ADD"},
	}},
	{"SendFlags", "Send work request flags (enum ibv_send_flags).", [][2]string{
		{"SendFence", "IBV_SEND_FENCE"}, {"SendSignaled", "IBV_SEND_SIGNALED"},
		{"SendSolicited", "IBV_SEND_SOLICITED"}, {"SendInline", "IBV_SEND_INLINE"},
	}},
	{"AccessFlags", "Memory region and QP access flags (enum ibv_access_flags).", [][2]string{
		{"AccessLocalWrite", "IBV_ACCESS_LOCAL_WRITE"}, {"AccessRemoteWrite", "IBV_ACCESS_REMOTE_WRITE"},
		{"AccessRemoteRead", "IBV_ACCESS_REMOTE_READ"}, {"AccessRemoteAtomic", "IBV_ACCESS_REMOTE_ATOMIC"},
		{"AccessMWBind", "IBV_ACCESS_MW_BIND"}, {"AccessZeroBased", "IBV_ACCESS_ZERO_BASED"},
		{"AccessOnDemand", "IBV_ACCESS_ON_DEMAND"}, {"AccessRelaxedOrdering", "IBV_ACCESS_RELAXED_ORDERING"},
	}},
	{"QPState", "QP states (enum ibv_qp_state).", [][2]string{
		{"QPSReset", "IBV_QPS_RESET"}, {"QPSInit", "IBV_QPS_INIT"}, {"QPSRTR", "IBV_QPS_RTR"},
		{"QPSRTS", "IBV_QPS_RTS"}, {"QPSSQD", "IBV_QPS_SQD"}, {"QPSSQE", "IBV_QPS_SQE"},
		{"QPSErr", "IBV_QPS_ERR"},
	}},
	{"QPType", "QP transport types (enum ibv_qp_type).", [][2]string{
		{"QPTRC", "IBV_QPT_RC"}, {"QPTUC", "IBV_QPT_UC"}, {"QPTUD", "IBV_QPT_UD"},
	}},
	{"QPAttrMask", "Which QPAttr fields Modify and Query use (enum ibv_qp_attr_mask).", [][2]string{
		{"AttrState", "IBV_QP_STATE"}, {"AttrCurState", "IBV_QP_CUR_STATE"},
		{"AttrEnSQDAsyncNotify", "IBV_QP_EN_SQD_ASYNC_NOTIFY"}, {"AttrAccessFlags", "IBV_QP_ACCESS_FLAGS"},
		{"AttrPKeyIndex", "IBV_QP_PKEY_INDEX"}, {"AttrPort", "IBV_QP_PORT"}, {"AttrQKey", "IBV_QP_QKEY"},
		{"AttrAV", "IBV_QP_AV"}, {"AttrPathMTU", "IBV_QP_PATH_MTU"}, {"AttrTimeout", "IBV_QP_TIMEOUT"},
		{"AttrRetryCnt", "IBV_QP_RETRY_CNT"}, {"AttrRNRRetry", "IBV_QP_RNR_RETRY"},
		{"AttrRQPSN", "IBV_QP_RQ_PSN"}, {"AttrMaxQPRdAtomic", "IBV_QP_MAX_QP_RD_ATOMIC"},
		{"AttrAltPath", "IBV_QP_ALT_PATH"}, {"AttrMinRNRTimer", "IBV_QP_MIN_RNR_TIMER"},
		{"AttrSQPSN", "IBV_QP_SQ_PSN"}, {"AttrMaxDestRdAtomic", "IBV_QP_MAX_DEST_RD_ATOMIC"},
		{"AttrPathMigState", "IBV_QP_PATH_MIG_STATE"}, {"AttrCap", "IBV_QP_CAP"},
		{"AttrDestQPN", "IBV_QP_DEST_QPN"},
	}},
	{"MTU", "Path MTUs (enum ibv_mtu).", [][2]string{
		{"MTU256", "IBV_MTU_256"}, {"MTU512", "IBV_MTU_512"}, {"MTU1024", "IBV_MTU_1024"},
		{"MTU2048", "IBV_MTU_2048"}, {"MTU4096", "IBV_MTU_4096"},
	}},
	{"PortState", "Port states (enum ibv_port_state).", [][2]string{
		{"PortNop", "IBV_PORT_NOP"}, {"PortDown", "IBV_PORT_DOWN"}, {"PortInit", "IBV_PORT_INIT"},
		{"PortArmed", "IBV_PORT_ARMED"}, {"PortActive", "IBV_PORT_ACTIVE"},
		{"PortActiveDefer", "IBV_PORT_ACTIVE_DEFER"},
	}},
	{"LinkLayer", "Port link layers (IBV_LINK_LAYER_*).", [][2]string{
		{"LinkLayerUnspecified", "IBV_LINK_LAYER_UNSPECIFIED"},
		{"LinkLayerInfiniBand", "IBV_LINK_LAYER_INFINIBAND"},
		{"LinkLayerEthernet", "IBV_LINK_LAYER_ETHERNET"},
	}},
	{"AtomicCap", "Device atomic capabilities (enum ibv_atomic_cap).", [][2]string{
		{"AtomicNone", "IBV_ATOMIC_NONE"}, {"AtomicHCA", "IBV_ATOMIC_HCA"}, {"AtomicGlob", "IBV_ATOMIC_GLOB"},
	}},
	{"GIDType", "GID types (enum ibv_gid_type).", [][2]string{
		{"GIDTypeIB", "IBV_GID_TYPE_IB"}, {"GIDTypeRoCEv1", "IBV_GID_TYPE_ROCE_V1"},
		{"GIDTypeRoCEv2", "IBV_GID_TYPE_ROCE_V2"},
	}},
	{"EventType", "Asynchronous event types (enum ibv_event_type).", [][2]string{
		{"EventCQErr", "IBV_EVENT_CQ_ERR"}, {"EventQPFatal", "IBV_EVENT_QP_FATAL"},
		{"EventQPReqErr", "IBV_EVENT_QP_REQ_ERR"}, {"EventQPAccessErr", "IBV_EVENT_QP_ACCESS_ERR"},
		{"EventCommEst", "IBV_EVENT_COMM_EST"}, {"EventSQDrained", "IBV_EVENT_SQ_DRAINED"},
		{"EventPathMig", "IBV_EVENT_PATH_MIG"}, {"EventPathMigErr", "IBV_EVENT_PATH_MIG_ERR"},
		{"EventDeviceFatal", "IBV_EVENT_DEVICE_FATAL"}, {"EventPortActive", "IBV_EVENT_PORT_ACTIVE"},
		{"EventPortErr", "IBV_EVENT_PORT_ERR"}, {"EventLIDChange", "IBV_EVENT_LID_CHANGE"},
		{"EventPKeyChange", "IBV_EVENT_PKEY_CHANGE"}, {"EventSMChange", "IBV_EVENT_SM_CHANGE"},
		{"EventSRQErr", "IBV_EVENT_SRQ_ERR"}, {"EventSRQLimitReached", "IBV_EVENT_SRQ_LIMIT_REACHED"},
		{"EventQPLastWQEReached", "IBV_EVENT_QP_LAST_WQE_REACHED"},
		{"EventClientReregister", "IBV_EVENT_CLIENT_REREGISTER"}, {"EventGIDChange", "IBV_EVENT_GID_CHANGE"},
		{"EventWQFatal", "IBV_EVENT_WQ_FATAL"},
	}},
}

const header = "// Code generated by mkconst.go from <infiniband/verbs.h>; DO NOT EDIT.\n\n"

func main() {
	// godefs input: every constant as its C name.
	var in bytes.Buffer
	in.WriteString("package ibv\n\n// #include <infiniband/verbs.h>\nimport \"C\"\n\n")
	for _, g := range groups {
		fmt.Fprintf(&in, "const (\n")
		for _, c := range g.consts {
			fmt.Fprintf(&in, "\t%s = C.%s\n", c[0], c[1])
		}
		fmt.Fprintf(&in, ")\n\n")
	}
	dir, err := os.MkdirTemp("", "mkconst")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "consts.go")
	if err := os.WriteFile(src, in.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command("go", "tool", "cgo", "-godefs", "-objdir", dir, src)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		log.Fatalf("cgo -godefs: %v", err)
	}
	values := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[1] == "=" {
			values[f[0]] = f[2]
		}
	}

	var z, chk bytes.Buffer
	z.WriteString(header + "package ibv\n\n")
	chk.WriteString(header + "//go:build cgo && linux\n\npackage ibv\n\n// #include <infiniband/verbs.h>\nimport \"C\"\n\n" +
		"// Each index is zero exactly when the literal in zconst.go equals the\n// header's value: a mismatch does not compile.\nvar (\n")
	for _, g := range groups {
		fmt.Fprintf(&z, "// %s\nconst (\n", g.doc)
		for _, c := range g.consts {
			v, ok := values[c[0]]
			if !ok {
				log.Fatalf("no value for %s (%s)", c[0], c[1])
			}
			fmt.Fprintf(&z, "\t%s %s = %s // %s\n", c[0], g.typ, v, c[1])
			fmt.Fprintf(&chk, "\t_ = [1]struct{}{}[%s-C.%s]\n\t_ = [1]struct{}{}[C.%s-%s]\n", c[0], c[1], c[1], c[0])
		}
		z.WriteString(")\n\n")
	}
	chk.WriteString(")\n")
	for name, b := range map[string][]byte{"zconst.go": z.Bytes(), "zconst_check.go": chk.Bytes()} {
		f, err := format.Source(b)
		if err != nil {
			log.Fatalf("%s: %v", name, err)
		}
		if err := os.WriteFile(name, f, 0o644); err != nil {
			log.Fatal(err)
		}
	}
}
