package udp

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// node is one side of a test connection: an endpoint, a QP, Go memory.
type node struct {
	ep   *Endpoint
	qp   *rc.QP
	host *rctest.Host
	mr   *rctest.MR
}

const (
	testRKey   = 0x5a5a
	testMRAddr = 0x7f0000000000
)

// connect makes a QP on each endpoint, connected to each other, with an MR
// of mrSize bytes each.
func connect(t testing.TB, a, b *Endpoint, cfg rc.Config, mrSize int) (*node, *node) {
	t.Helper()
	mk := func(ep *Endpoint, qpn, dest uint32, sq, rq roce.PSN, peer netip.AddrPort) *node {
		h := rctest.NewHost()
		mr := &rctest.MR{Buf: make([]byte, mrSize), Addr: testMRAddr, RKey: testRKey,
			Access: rc.AccessRemoteWrite | rc.AccessRemoteRead | rc.AccessRemoteAtomic}
		h.AddMR(mr)
		c := cfg
		c.QPN, c.DestQPN, c.SQPSN, c.RQPSN = qpn, dest, sq, rq
		qp, err := ep.NewQP(c, peer, h)
		if err != nil {
			t.Fatal(err)
		}
		return &node{ep: ep, qp: qp, host: h, mr: mr}
	}
	x := mk(a, 0x101, 0x202, 0xfffff0, 0x123456, b.LocalAddr())
	y := mk(b, 0x202, 0x101, 0x123456, 0xfffff0, a.LocalAddr())
	return x, y
}

func random(n int, seed uint64) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, 1))
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

// postAll posts wrs from x in chunks the send queue holds and waits for
// their completions, which must all succeed in order.
func postAll(ctx context.Context, t testing.TB, x *node, wrs []rc.SendWR) {
	t.Helper()
	const chunk = 128
	for i := 0; i < len(wrs); i += chunk {
		part := wrs[i:min(len(wrs), i+chunk)]
		for _, wr := range part {
			if err := x.qp.Post(wr); err != nil {
				t.Fatalf("post %#x: %v", wr.ID, err)
			}
		}
		cs, err := x.host.TakeSends(ctx, len(part))
		if err != nil {
			t.Fatalf("%v; QP counters %+v; endpoint %+v", err, x.qp.Counters(), x.ep.Counters())
		}
		for j, c := range cs {
			if c.ID != part[j].ID || c.Status != abi.WCSuccess {
				t.Fatalf("completion %d: %+v, want WR %#x success\n%s", j, c, part[j].ID, fmtCounters(x))
			}
		}
	}
}

func postAllB(b *testing.B, x *node, wrs []rc.SendWR) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	postAll(ctx, b, x, wrs)
}

// exercise runs WRITE, READ, SEND with immediate and FETCH_ADD traffic
// from x to y (total bytes each for WRITE, READ and SEND, in messages of
// msg bytes) and checks every byte, every completion, and that each atomic
// ran once.
func exercise(t testing.TB, x, y *node, total, msg, atomics int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	n := total / msg
	// WRITE: x's data into y's MR.
	src := random(total, 1)
	var wrs []rc.SendWR
	for i := range n {
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMAWrite, Length: uint32(msg),
			RemoteAddr: testMRAddr + uint64(i*msg), RKey: testRKey, Local: rctest.Buf(src[i*msg : (i+1)*msg])})
	}
	t0 := time.Now()
	postAll(ctx, t, x, wrs)
	t.Logf("WRITE %d bytes: %v", total, time.Since(t0))
	if !bytes.Equal(y.mr.Copy(0, total), src) {
		t.Fatal("WRITE: data differs")
	}
	// READ: y's MR (now src) back into x.
	dst := make([]byte, total)
	wrs = wrs[:0]
	for i := range n {
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMARead, Length: uint32(msg),
			RemoteAddr: testMRAddr + uint64(i*msg), RKey: testRKey, Local: rctest.Buf(dst[i*msg : (i+1)*msg])})
	}
	t0 = time.Now()
	postAll(ctx, t, x, wrs)
	t.Logf("READ %d bytes: %v %+v", total, time.Since(t0), x.qp.Counters())
	if !bytes.Equal(dst, src) {
		t.Fatal("READ: data differs")
	}
	// SEND with immediate into y's receives.
	sendSrc := random(total, 2)
	recv := make([]byte, total)
	for i := range n {
		y.host.PostRecv(rc.Recv{ID: uint64(i), Len: uint32(msg), Buf: rctest.Buf(recv[i*msg : (i+1)*msg])})
	}
	wrs = wrs[:0]
	for i := range n {
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRSendWithImm, Length: uint32(msg), Imm: uint32(i) ^ 0xabcd0000,
			Local: rctest.Buf(sendSrc[i*msg : (i+1)*msg])})
	}
	postAll(ctx, t, x, wrs)
	rcs, err := y.host.TakeRecvs(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range rcs {
		if c.ID != uint64(i) || c.Status != abi.WCSuccess || c.ByteLen != uint32(msg) || !c.WithImm || c.Imm != uint32(i)^0xabcd0000 {
			t.Fatalf("receive completion %d: %+v", i, c)
		}
	}
	if !bytes.Equal(recv, sendSrc) {
		t.Fatal("SEND: data differs")
	}
	// FETCH_ADD on one word of y's MR.
	word := uint64(total)
	y.mr.Store(int(word), binary.LittleEndian.AppendUint64(nil, 1000))
	before := y.mr.Atomics()
	results := make([]byte, 8*atomics)
	wrs = wrs[:0]
	for i := range atomics {
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRAtomicFetchAdd, Length: 8, RemoteAddr: testMRAddr + word,
			RKey: testRKey, SwapAdd: 3, Local: rctest.Buf(results[8*i : 8*i+8])})
	}
	postAll(ctx, t, x, wrs)
	for i := range atomics {
		if got := binary.LittleEndian.Uint64(results[8*i:]); got != 1000+3*uint64(i) {
			t.Fatalf("FETCH_ADD %d returned %d, want %d", i, got, 1000+3*i)
		}
	}
	if got := binary.LittleEndian.Uint64(y.mr.Copy(int(word), 8)); got != 1000+3*uint64(atomics) || y.mr.Atomics()-before != atomics {
		t.Fatalf("atomic word %d after %d executions, want %d after %d", got, y.mr.Atomics()-before, 1000+3*atomics, atomics)
	}
}

func fmtCounters(x *node) string {
	return fmt.Sprintf("QP %+v\nendpoint %+v", x.qp.Counters(), x.ep.Counters())
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}
