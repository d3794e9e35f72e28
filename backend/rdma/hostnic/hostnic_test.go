package hostnic

import (
	"errors"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/hostnic/ibv"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

func TestParseSpec(t *testing.T) {
	for in, want := range map[string]string{
		"soft": "soft", "verbs:mlx5_0": "verbs:mlx5_0:1", "verbs:rxe0:1": "verbs:rxe0:1", "verbs:erdma_0:2": "verbs:erdma_0:2",
	} {
		s, err := ParseSpec(in)
		if err != nil || s.String() != want {
			t.Errorf("ParseSpec(%q) = %v, %v; want %s", in, s, err, want)
		}
	}
	for _, in := range []string{"", "hard", "verbs", "verbs:", "verbs::1", "verbs:mlx5_0:0", "verbs:mlx5_0:256",
		"verbs:mlx5_0:x", "verbs:a/b", "verbs:a b", "verbs:" + strings.Repeat("x", 65), "SOFT"} {
		if _, err := ParseSpec(in); !errors.Is(err, ErrSpec) {
			t.Errorf("ParseSpec(%q): %v, want ErrSpec", in, err)
		}
	}
}

// TestOpenMissing: a host without the device (this one has no RDMA device
// at all) gets an error naming it.
func TestOpenMissing(t *testing.T) {
	_, err := Open(Spec{Verbs: true, Device: "vrdma_no_such0", Port: 1}, nil)
	if err == nil || !strings.Contains(err.Error(), "vrdma_no_such0") {
		t.Fatalf("Open of a missing device: %v", err)
	}
	if _, err := Open(Spec{}, nil); err == nil {
		t.Fatal("Open(soft) succeeded")
	}
}

// TestMappings: the device's terms and rdma-core's agree where the code
// relies on it, and the tables map every value.
func TestMappings(t *testing.T) {
	for abiS, ibvS := range map[abi.WCStatus]ibv.WCStatus{
		abi.WCSuccess: ibv.WCSuccess, abi.WCLocLenErr: ibv.WCLocLenErr, abi.WCLocQPOpErr: ibv.WCLocQPOpErr,
		abi.WCLocProtErr: ibv.WCLocProtErr, abi.WCWRFlushErr: ibv.WCWRFlushErr, abi.WCRemAccessErr: ibv.WCRemAccessErr,
		abi.WCRemOpErr: ibv.WCRemOpErr, abi.WCRetryExcErr: ibv.WCRetryExcErr, abi.WCRNRRetryExcErr: ibv.WCRNRRetryExcErr,
		abi.WCRemInvReqErr: ibv.WCRemInvReqErr, abi.WCGeneralErr: ibv.WCGeneralErr,
	} {
		if got := wcStatus(ibvS); got != abiS {
			t.Errorf("wcStatus(%v) = %v, want %v", ibvS, got, abiS)
		}
	}
	if wcStatus(ibv.WCStatus(200)) != abi.WCGeneralErr {
		t.Error("an unknown status is not GENERAL_ERR")
	}
	for abiO, ibvO := range map[uint8]ibv.WCOpcode{
		abi.WCOpSend: ibv.WCOpSend, abi.WCOpRDMAWrite: ibv.WCOpRDMAWrite, abi.WCOpRDMARead: ibv.WCOpRDMARead,
		abi.WCOpCompSwap: ibv.WCOpCompSwap, abi.WCOpFetchAdd: ibv.WCOpFetchAdd, abi.WCOpRecv: ibv.WCOpRecv,
		abi.WCOpRecvRDMAWithImm: ibv.WCOpRecvRDMAWithImm,
	} {
		if got := wcOpcode(ibvO); got != abiO {
			t.Errorf("wcOpcode(%v) = %d, want %d", ibvO, got, abiO)
		}
	}
	if len(wrOpcodes) != abi.WROpAtomicFetchAdd+1 || len(qpStates) != abi.QPSErr+1 || len(mtus) != abi.MTU4096+1 {
		t.Error("a table does not cover the device's values")
	}
	if sendFlags(abi.WRFlagSignaled|abi.WRFlagInline|abi.WRFlagFence|abi.WRFlagSolicited) !=
		ibv.SendSignaled|ibv.SendInline|ibv.SendFence|ibv.SendSolicited {
		t.Error("send flags")
	}
	if accessFlags(abi.AccessAll) != ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessRemoteAtomic {
		t.Error("access flags")
	}
	var all uint32
	for _, m := range attrMasks {
		all |= m.from
	}
	if want := uint32(abi.QPAttrState | abi.QPAttrAccessFlags | abi.QPAttrPKeyIndex | abi.QPAttrPort | abi.QPAttrAV |
		abi.QPAttrPathMTU | abi.QPAttrTimeout | abi.QPAttrRetryCnt | abi.QPAttrRNRRetry | abi.QPAttrRQPSN |
		abi.QPAttrMaxQPRdAtomic | abi.QPAttrMinRNRTimer | abi.QPAttrSQPSN | abi.QPAttrMaxDestRdAtomic | abi.QPAttrDestQPN); all != want {
		t.Errorf("attribute masks cover %#x, want %#x", all, want)
	}
}
