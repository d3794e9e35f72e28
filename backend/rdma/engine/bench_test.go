package engine

import (
	"fmt"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

var benchSizes = []int{64, 4 << 10, 64 << 10, 1 << 20}

// BenchmarkWrite measures one signaled RDMA WRITE per iteration between two
// devices' guest memories, posted, executed and completed.
func BenchmarkWrite(b *testing.B) {
	p := newPair(b, pairOpts{qp: qpOpts{sqDepth: 16, rqDepth: 16, maxSGE: 4, inl: 64, guestSize: 16 << 20}})
	a, r := p.a, p.b
	const key = 0x4242_0001
	src := a.g.newMR(b, key, testPD, abi.AccessAll, 0, 1<<20, false)
	dst := r.g.newMR(b, key, testPD, abi.AccessAll, 0, 1<<20, false)
	addMR(a.d, src)
	addMR(r.d, dst)
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			sg := []abi.SGE{{Addr: 0, Length: uint32(size), LKey: key}}
			w := abi.SendWQE{Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, RemoteAddr: 0, RKey: key}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				a.postSend(b, w, sg, nil)
				a.d.Poll(0, a.g.tbl)
				if n, bad := drainCount(a, a.scq, nil); n != 1 || bad != 0 {
					b.Fatalf("completion: got %d CQEs, status %d", n, bad)
				}
			}
		})
	}
}

// BenchmarkMemcpy is the baseline: copy() of the same sizes between two
// guests' memories.
func BenchmarkMemcpy(b *testing.B) {
	ga := newGuest(b, "a", 4<<20)
	gb := newGuest(b, "b", 4<<20)
	src, err := ga.tbl.Slice(guestBase, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	dst, err := gb.tbl.Slice(guestBase, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				copy(dst[:size], src[:size])
			}
		})
	}
}

// BenchmarkWriteBatch64B measures the engine's cost of a small WQE: 32
// RDMA WRITEs of 64 B per iteration (the last one signaled), executed by
// one Poll, as a busy driver posts them.
func BenchmarkWriteBatch64B(b *testing.B) {
	const batch = 32
	p := newPair(b, pairOpts{qp: qpOpts{sqDepth: 64, rqDepth: 16, maxSGE: 4, inl: 64, guestSize: 16 << 20}})
	a, r := p.a, p.b
	const key = 0x4242_0001
	addMR(a.d, a.g.newMR(b, key, testPD, abi.AccessAll, 0, 1<<20, false))
	addMR(r.d, r.g.newMR(b, key, testPD, abi.AccessAll, 0, 1<<20, false))
	sg := []abi.SGE{{Addr: 0, Length: 64, LKey: key}}
	b.SetBytes(64 * batch)
	b.ReportAllocs()
	for b.Loop() {
		for i := range batch {
			w := abi.SendWQE{Opcode: abi.WROpRDMAWrite, RemoteAddr: uint64(64 * i), RKey: key}
			if i == batch-1 {
				w.Flags = abi.WRFlagSignaled
			}
			a.postSend(b, w, sg, nil)
		}
		a.d.Poll(0, a.g.tbl)
		if n, bad := drainCount(a, a.scq, nil); n != 1 || bad != 0 {
			b.Fatalf("completion: got %d CQEs, status %d", n, bad)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/WQE")
}
