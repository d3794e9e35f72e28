package roceinterop

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/internal/pftexchange"
)

// Synthetic captures for CheckCapture: our QP 0x11 at HostIP, the peer's
// 0x22 at GuestIP, our MR at 0x10000.
const (
	testQPN, testPeerQPN = 0x11, 0x22
	testVA               = 0x10000
	testPSN              = 0xfffffe // wraps during the run
)

func testRun(op pftexchange.Op, role string, size, iters int) *Run {
	mem := make([]byte, 64<<10)
	for i := range mem {
		mem[i] = Fill(0, i)
	}
	return &Run{Job: Job{op, size, iters}, Role: role, local: HostIP, mem: mem, init: bytes.Clone(mem),
		Mine: pftexchange.Keys{QPN: testQPN, PSN: testPSN, VAddr: testVA}, Peer: pftexchange.Keys{QPN: testPeerQPN}}
}

// in is a frame from the peer to our QP, out one from us to the peer's.
func in(p roce.Packet) Frame {
	p.BTH.DestQP = testQPN
	return Frame{Src: GuestIP, Dst: HostIP, Packet: p}
}

func out(p roce.Packet) Frame {
	p.BTH.DestQP = testPeerQPN
	return Frame{Src: HostIP, Dst: GuestIP, Packet: p}
}

func bth(op roce.Opcode, psn roce.PSN) roce.BTH { return roce.BTH{Opcode: op, PSN: psn & roce.PSNMask} }

func TestCheckCapture(t *testing.T) {
	base := roce.PSN(testPSN)
	tests := []struct {
		name    string
		run     func() (*Run, []Frame)
		corrupt func(r *Run, fs []Frame) // makes the check fail
		want    string                   // in the failure
	}{
		{"server write_bw", func() (*Run, []Frame) {
			// Two 2048-byte WRITEs to offsets 0 and 4096, two packets each.
			r := testRun(pftexchange.WriteBW, "server", 2048, 2)
			var fs []Frame
			for m, off := range []int{0, 4096} {
				psn := roce.PSN(100 + 2*m)
				copy(r.mem[off:], bytes.Repeat([]byte{byte(m + 1)}, 2048))
				fs = append(fs, in(roce.Packet{BTH: bth(roce.OpWriteFirst, psn), RETH: roce.RETH{VA: testVA + uint64(off), DMALen: 2048},
					Payload: bytes.Clone(r.mem[off : off+1024])}))
				fs = append(fs, in(roce.Packet{BTH: bth(roce.OpWriteLast, psn+1), Payload: bytes.Clone(r.mem[off+1024 : off+2048])}))
			}
			return r, fs
		}, func(r *Run, fs []Frame) { r.mem[4096+1500] ^= 1 }, "payload differs"},
		{"server atomic_bw", func() (*Run, []Frame) {
			r := testRun(pftexchange.AtomicBW, "server", 8, 5)
			var fs []Frame
			for k := range 5 {
				f := in(roce.Packet{BTH: bth(roce.OpFetchAdd, roce.PSN(7+k)), AtomicETH: roce.AtomicETH{VA: testVA + 64, SwapAdd: 1}})
				fs = append(fs, f)
				if k == 2 {
					fs = append(fs, f) // a retransmission, executed once
				}
			}
			binary.LittleEndian.PutUint64(r.mem[64:], binary.LittleEndian.Uint64(r.init[64:])+5)
			return r, fs
		}, func(r *Run, fs []Frame) {
			binary.LittleEndian.PutUint64(r.mem[64:], binary.LittleEndian.Uint64(r.init[64:])+6)
		}, "word at"},
		{"server send_bw", func() (*Run, []Frame) {
			r := testRun(pftexchange.SendBW, "server", 1024, 3)
			var fs []Frame
			for k := range 3 {
				fs = append(fs, in(roce.Packet{BTH: bth(roce.OpSendOnly, roce.PSN(50+k)), Payload: bytes.Clone(r.mem[k*1024 : (k+1)*1024])}))
			}
			return r, fs
		}, func(r *Run, fs []Frame) { r.mem[2*1024+3] ^= 1 }, "differs from receive 2"},
		{"client write_bw", func() (*Run, []Frame) {
			r := testRun(pftexchange.WriteBW, "client", 2048, 2)
			var fs []Frame
			for d := range 4 {
				op := []roce.Opcode{roce.OpWriteFirst, roce.OpWriteLast}[d%2]
				fs = append(fs, out(roce.Packet{BTH: bth(op, base.Add(uint32(d))), Payload: bytes.Clone(r.mem[d*1024 : (d+1)*1024])}))
			}
			fs = append(fs, in(roce.Packet{BTH: bth(roce.OpAcknowledge, base.Add(3)), AETH: roce.AETH{Syndrome: roce.ACKSyndrome(31)}}))
			return r, fs
		}, func(r *Run, fs []Frame) {
			for i := range fs {
				if fs[i].Packet.BTH.Opcode == roce.OpAcknowledge {
					fs[i].Packet.BTH.PSN = base.Add(1)
				}
			}
		}, "acknowledged: false"},
		{"client read_bw", func() (*Run, []Frame) {
			r := testRun(pftexchange.ReadBW, "client", 2048, 2)
			var fs []Frame
			for m := range 2 {
				psn := base.Add(uint32(2 * m))
				fs = append(fs, out(roce.Packet{BTH: bth(roce.OpReadRequest, psn), RETH: roce.RETH{VA: 0x5000, DMALen: 2048}}))
				fs = append(fs, in(roce.Packet{BTH: bth(roce.OpReadResponseFirst, psn), Payload: bytes.Clone(r.mem[m*2048 : m*2048+1024])}))
				fs = append(fs, in(roce.Packet{BTH: bth(roce.OpReadResponseLast, psn.Add(1)), Payload: bytes.Clone(r.mem[m*2048+1024 : (m+1)*2048])}))
			}
			return r, fs
		}, func(r *Run, fs []Frame) { r.mem[2048+1024+7] ^= 1 }, "not what landed"},
		{"client atomic_bw", func() (*Run, []Frame) {
			r := testRun(pftexchange.AtomicBW, "client", 8, 3)
			var fs []Frame
			for k := range 3 {
				binary.LittleEndian.PutUint64(r.mem[8*k:], 40+uint64(k))
				fs = append(fs, in(roce.Packet{BTH: bth(roce.OpAtomicAcknowledge, base.Add(uint32(k))),
					AtomicAckETH: roce.AtomicAckETH{OrigData: 40 + uint64(k)}}))
			}
			return r, fs
		}, func(r *Run, fs []Frame) { binary.LittleEndian.PutUint64(r.mem[8:], 99) }, "original value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, fs := tt.run()
			// Frames of another QP pair are ignored.
			fs = append(fs, Frame{Src: GuestIP, Dst: HostIP, Packet: roce.Packet{BTH: roce.BTH{Opcode: roce.OpSendOnly, DestQP: 0x99}, Payload: []byte{1}}})
			if got, err := r.CheckCapture(fs); err != nil {
				t.Fatalf("good capture: %v", err)
			} else {
				t.Logf("%s", got)
			}
			tt.corrupt(r, fs)
			if _, err := r.CheckCapture(fs); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("broken: got %v, want an error with %q", err, tt.want)
			}
		})
	}
	if _, err := testRun(pftexchange.WriteBW, "server", 1024, 1).CheckCapture(nil); err == nil || !strings.Contains(err.Error(), "no RoCE frames") {
		t.Fatalf("empty capture: %v", err)
	}
}
