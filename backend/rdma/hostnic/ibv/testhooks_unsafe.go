//go:build cgo && linux

package ibv

// Hooks for the package's tests (cgo is not allowed in _test.go files):
// the C layouts, and QPs and CQs over fake.c's fake provider.

/*
#include "shim.h"
*/
import "C"

import "unsafe"

// cLayouts are the sizes and offsets of the C structures the Go ones
// mirror, by name.
func cLayouts() map[string]uintptr {
	l := func(i C.int) uintptr { return uintptr(C.vibv_layout(i)) }
	return map[string]uintptr{
		"SendWR.size": l(C.VIBV_L_SEND_WR_SIZE), "SendWR.RemoteAddr": l(C.VIBV_L_SEND_WR_REMOTE_ADDR),
		"SendWR.CompareAdd": l(C.VIBV_L_SEND_WR_COMPARE_ADD), "SendWR.Swap": l(C.VIBV_L_SEND_WR_SWAP),
		"SendWR.RKey": l(C.VIBV_L_SEND_WR_RKEY), "SendWR.Imm": l(C.VIBV_L_SEND_WR_IMM),
		"SendWR.FirstSGE": l(C.VIBV_L_SEND_WR_FIRST_SGE), "SendWR.NumSGE": l(C.VIBV_L_SEND_WR_NUM_SGE),
		"SendWR.Opcode": l(C.VIBV_L_SEND_WR_OPCODE), "SendWR.SendFlags": l(C.VIBV_L_SEND_WR_FLAGS),
		"RecvWR.size": l(C.VIBV_L_RECV_WR_SIZE), "RecvWR.FirstSGE": l(C.VIBV_L_RECV_WR_FIRST_SGE),
		"RecvWR.NumSGE": l(C.VIBV_L_RECV_WR_NUM_SGE),
		"SGE.size":      l(C.VIBV_L_SGE_SIZE), "SGE.Length": l(C.VIBV_L_SGE_LENGTH), "SGE.LKey": l(C.VIBV_L_SGE_LKEY),
		"WC.size": l(C.VIBV_L_WC_SIZE), "WC.Status": l(C.VIBV_L_WC_STATUS), "WC.Opcode": l(C.VIBV_L_WC_OPCODE),
		"WC.VendorErr": l(C.VIBV_L_WC_VENDOR_ERR), "WC.ByteLen": l(C.VIBV_L_WC_BYTE_LEN),
		"WC.ImmData": l(C.VIBV_L_WC_IMM), "WC.QPNum": l(C.VIBV_L_WC_QP_NUM), "WC.SrcQP": l(C.VIBV_L_WC_SRC_QP),
		"WC.WCFlags": l(C.VIBV_L_WC_FLAGS), "WC.PKeyIndex": l(C.VIBV_L_WC_PKEY_INDEX),
		"WC.SLID": l(C.VIBV_L_WC_SLID), "WC.SL": l(C.VIBV_L_WC_SL),
		"WC.DLIDPathBits": l(C.VIBV_L_WC_DLID_PATH_BITS), "WC.Status.size": l(C.VIBV_L_WC_STATUS_SIZE),
	}
}

// newFakeQP is a QP over the fake provider with the given scratch sizes.
func newFakeQP(nswr, sendSGE, nrwr, recvSGE uint32) *QP {
	q := C.vibv_fake_qp(C.uint32_t(nswr), C.uint32_t(sendSGE), C.uint32_t(nrwr), C.uint32_t(recvSGE))
	if q == nil {
		return nil
	}
	return &QP{num: uint32(C.vibv_qp_num(q)), q: q,
		caps: QPCaps{MaxSendWR: nswr, MaxSendSGE: sendSGE, MaxRecvWR: nrwr, MaxRecvSGE: recvSGE}}
}

func (qp *QP) freeFake() {
	C.vibv_fake_free(qp.q)
	qp.q = nil
}

// fakeFailAt makes the fake provider's post fail at the index-th WR it
// sees (from now), with errno err; -1 never. It also resets the record.
func fakeFailAt(index int, err int) { C.vibv_fake_fail_at(C.int(index), C.int(err)) }

// fakeCount is how many WRs the fake provider accepted.
func fakeCount() int { return int(C.vibv_fake_count()) }

// fakeWR is what the fake provider saw of a WR.
type fakeWR struct {
	WRID                         uint64
	Opcode                       WROpcode
	SendFlags                    SendFlags
	Imm                          uint32
	NumSGE                       int
	RemoteAddr, CompareAdd, Swap uint64
	RKey                         uint32
	LastSGE                      SGE
}

func fakeGet(i int) fakeWR {
	var (
		wr  C.struct_ibv_send_wr
		sge C.struct_ibv_sge
	)
	C.vibv_fake_get(C.uint32_t(i), &wr, &sge)
	// The unions, through their C layout.
	imm := *(*uint32)(unsafe.Pointer(&wr.anon0))
	f := fakeWR{
		WRID: uint64(wr.wr_id), Opcode: WROpcode(wr.opcode), SendFlags: SendFlags(wr.send_flags),
		Imm: imm, NumSGE: int(wr.num_sge),
		LastSGE: SGE{Addr: uint64(sge.addr), Length: uint32(sge.length), LKey: uint32(sge.lkey)},
	}
	u := unsafe.Pointer(&wr.wr)
	if f.Opcode == WRAtomicCmpAndSwp || f.Opcode == WRAtomicFetchAndAdd {
		a := (*struct {
			remoteAddr, compareAdd, swap uint64
			rkey                         uint32
		})(u)
		f.RemoteAddr, f.CompareAdd, f.Swap, f.RKey = a.remoteAddr, a.compareAdd, a.swap, a.rkey
	} else {
		r := (*struct {
			remoteAddr uint64
			rkey       uint32
		})(u)
		f.RemoteAddr, f.RKey = r.remoteAddr, r.rkey
	}
	return f
}

// newFakeCQ is a CQ over the fake provider holding pending completions.
func newFakeCQ(pending uint64) *CQ { return &CQ{cq: C.vibv_fake_cq(C.uint64_t(pending))} }
