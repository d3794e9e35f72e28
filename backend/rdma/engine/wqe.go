package engine

import (
	"encoding/binary"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Scratch bounds: a WQE never exceeds a page, so neither do its SGEs.
const (
	maxSendSGEs = (abi.PageSize - abi.SendWQEHdrSize) / abi.SGESize
	maxRecvSGEs = (abi.PageSize - abi.RecvWQEHdrSize) / abi.SGESize
	knownFlags  = abi.WRFlagSignaled | abi.WRFlagInline | abi.WRFlagFence | abi.WRFlagSolicited | abi.WRFlagAV
)

// sendWQE is the validated device-local copy of a send WQE's header.
type sendWQE struct {
	wrID       uint64
	opcode     uint8
	flags      uint8
	numSGE     uint16
	imm        uint32
	remoteAddr uint64
	rkey       uint32
	inlineLen  uint32
	compareAdd uint64
	swap       uint64
	ah         uint32 // UD only
	remoteQPN  uint32 // UD only
	remoteQKey uint32 // UD only
	// With WRFlagAV (UD only): the destination the WQE carries, checked
	// at the send as CREATE_AH checks its addresses (sendUD).
	avDGID      [16]byte
	avSGIDIndex uint32
	// BIND_MW and REG_MR (RC only): the operation's own WQE layout
	// (memops.go).
	mem memWQE
}

// dataOff is where the WQE's SGEs or inline data start in its stride:
// after the vrdma_av with AV.
func (w *sendWQE) dataOff() int {
	if w.flags&abi.WRFlagAV != 0 {
		return abi.SendWQEHdrSize + abi.AVSize
	}
	return abi.SendWQEHdrSize
}

// decodeSend decodes the header of the send WQE copied into b (the QP's
// stride bytes) and its SGEs into sges; a BIND_MW or REG_MR WQE, which
// has a layout of its own and no SGEs, is decodeMem's. It reports whether the WQE is well
// formed for a QP with the given limits: a known opcode and flags, num_sge
// ≤ maxSGE (0 with INLINE, inline only for SEND and WRITE), inline_len ≤
// maxInline, SGEs or inline data inside the stride, reserved bytes zero.
// ah, remote_qpn and remote_qkey are a UD QP's (ud) and zero for RC; a UD
// QP sends SEND and SEND_WITH_IMM only, without FENCE, to a 24-bit QP
// number ("other opcodes and FENCE are LOC_QP_OP_ERR"). With AV (UD only)
// the WQE names no AH (ah zero) and carries a vrdma_av at offset 64 whose
// reserved bytes are zero; its SGEs or inline data then start at offset
// 96 and must fit the stride after it. Even when it fails, wr_id and
// opcode are filled for the error CQE.
func decodeSend(b []byte, ud bool, maxSGE, maxInline uint32, sges []abi.SGE) (w sendWQE, ok bool) {
	if len(b) < abi.SendWQEHdrSize {
		return w, false
	}
	if b[8] == abi.WROpBindMW || b[8] == abi.WROpRegMR {
		return decodeMem(b, ud)
	}
	le := binary.LittleEndian
	w.wrID = le.Uint64(b[0:])
	w.opcode = b[8]
	w.flags = b[9]
	w.numSGE = le.Uint16(b[10:])
	w.imm = le.Uint32(b[12:])
	w.remoteAddr = le.Uint64(b[16:])
	w.rkey = le.Uint32(b[24:])
	w.inlineLen = le.Uint32(b[28:])
	w.compareAdd = le.Uint64(b[32:])
	w.swap = le.Uint64(b[40:])
	w.ah = le.Uint32(b[48:])
	w.remoteQPN = le.Uint32(b[52:])
	w.remoteQKey = le.Uint32(b[56:])
	if le.Uint32(b[60:]) != 0 {
		return w, false
	}
	if !ud && (w.ah != 0 || w.remoteQPN != 0 || w.remoteQKey != 0) {
		return w, false
	}
	if ud && (w.remoteQPN >= 1<<24 || w.flags&abi.WRFlagFence != 0 ||
		(w.opcode != abi.WROpSend && w.opcode != abi.WROpSendWithImm)) {
		return w, false
	}
	if w.opcode > abi.WROpSendWithInv || w.flags&^knownFlags != 0 || w.inlineLen > maxInline {
		return w, false
	}
	if w.flags&abi.WRFlagAV != 0 {
		// "AV on an RC QP or a WQE whose AV, SGEs or inline data run
		// past its stride ... completes with LOC_QP_OP_ERR".
		if !ud || w.ah != 0 || len(b) < abi.SendWQEHdrSize+abi.AVSize {
			return w, false
		}
		av := b[abi.SendWQEHdrSize : abi.SendWQEHdrSize+abi.AVSize]
		copy(w.avDGID[:], av[0:16])
		w.avSGIDIndex = le.Uint32(av[16:])
		for _, c := range av[20:] {
			if c != 0 {
				return w, false
			}
		}
	}
	off := w.dataOff()
	room := uint64(len(b) - off)
	if w.flags&abi.WRFlagInline != 0 {
		switch w.opcode {
		case abi.WROpSend, abi.WROpSendWithImm, abi.WROpSendWithInv, abi.WROpRDMAWrite, abi.WROpRDMAWriteWithImm:
		default:
			return w, false
		}
		return w, w.numSGE == 0 && uint64(w.inlineLen) <= room
	}
	n := uint64(w.numSGE)
	if n > uint64(maxSGE) || n > uint64(len(sges)) || n*abi.SGESize > room {
		return w, false
	}
	decodeSGEs(b[off:], sges[:n])
	return w, true
}

// decodeSGEs decodes len(sges) SGEs from b (which holds them all).
func decodeSGEs(b []byte, sges []abi.SGE) {
	le := binary.LittleEndian
	for i := range sges {
		e := b[i*abi.SGESize : (i+1)*abi.SGESize]
		sges[i] = abi.SGE{Addr: le.Uint64(e[0:]), Length: le.Uint32(e[8:]), LKey: le.Uint32(e[12:])}
	}
}

// decodeRecv decodes a receive WQE copied into b (the RQ's stride) and its
// SGEs into sges; it reports whether it is well formed (reserved bytes
// zero, num_sge ≤ maxSGE and inside the stride). wr_id is always filled.
func decodeRecv(b []byte, maxSGE uint32, sges []abi.SGE) (wrID uint64, n int, ok bool) {
	if len(b) < abi.RecvWQEHdrSize {
		return 0, 0, false
	}
	le := binary.LittleEndian
	wrID = le.Uint64(b[0:])
	num := uint64(le.Uint16(b[8:]))
	if le.Uint16(b[10:]) != 0 || le.Uint32(b[12:]) != 0 {
		return wrID, 0, false
	}
	if num > uint64(maxSGE) || num > uint64(len(sges)) || num*abi.SGESize > uint64(len(b)-abi.RecvWQEHdrSize) {
		return wrID, 0, false
	}
	decodeSGEs(b[abi.RecvWQEHdrSize:], sges[:num])
	return wrID, int(num), true
}

// wcOpcode maps a send opcode to the CQE opcode (0 for an unknown one).
func wcOpcode(op uint8) uint8 {
	switch op {
	case abi.WROpRDMAWrite, abi.WROpRDMAWriteWithImm:
		return abi.WCOpRDMAWrite
	case abi.WROpRDMARead:
		return abi.WCOpRDMARead
	case abi.WROpAtomicCmpSwp:
		return abi.WCOpCompSwap
	case abi.WROpAtomicFetchAdd:
		return abi.WCOpFetchAdd
	case abi.WROpLocalInv:
		return abi.WCOpLocalInv
	case abi.WROpBindMW:
		return abi.WCOpBindMW
	case abi.WROpRegMR:
		return abi.WCOpRegMR
	}
	return abi.WCOpSend // SEND, SEND_WITH_IMM, SEND_WITH_INV
}

// rnrDelayUS is the IB RNR NAK timer encoding in microseconds (code 0 is
// the longest, 655.36 ms).
var rnrDelayUS = [32]int64{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880,
	163840, 245760, 327680, 491520,
}
