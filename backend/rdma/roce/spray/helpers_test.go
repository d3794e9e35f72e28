package spray

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
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

const (
	testRKey   = 0x5a5a
	testMRAddr = 0x7f0000000000
)

// side is one end of a test connection: a Conn (or a plain rc.Conn), its
// host and MR.
type side struct {
	conn  rc.Conn
	spray *Conn // nil for a plain peer
	eps   []*udp.Endpoint
	host  *rctest.Host
	mr    *rctest.MR
}

func (s *side) String() string {
	if s.spray == nil {
		return fmt.Sprintf("plain %+v", s.eps[0].Counters())
	}
	out := fmt.Sprintf("mode %v %+v\nQP %+v", s.spray.Mode(), s.spray.Counters(), s.spray.QP().Counters())
	for i, p := range s.spray.Paths() {
		out += fmt.Sprintf("\npath %d: %+v", i, p)
	}
	return out
}

func newHost(mrSize int) (*rctest.Host, *rctest.MR) {
	h := rctest.NewHost()
	mr := &rctest.MR{Buf: make([]byte, mrSize), Addr: testMRAddr, RKey: testRKey,
		Access: rc.AccessRemoteWrite | rc.AccessRemoteRead | rc.AccessRemoteAtomic}
	h.AddMR(mr)
	return h, mr
}

// listen binds an endpoint per address (in ns, if not nil).
func listen(t testing.TB, ns *netlab.NS, port uint16, addrs ...netip.Addr) []*udp.Endpoint {
	t.Helper()
	var eps []*udp.Endpoint
	for _, a := range addrs {
		var e *udp.Endpoint
		mk := func() error {
			var err error
			e, err = udp.Listen(udp.Config{Addr: a, Port: port})
			return err
		}
		var err error
		if ns != nil {
			err = ns.Do(mk)
		} else {
			err = mk()
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		eps = append(eps, e)
	}
	return eps
}

// connect makes x on aEps and y on bEps, connected, and starts both. A
// nil config makes that side a plain udp.Conn (rxe's stand-in).
func connect(t testing.TB, aEps, bEps []*udp.Endpoint, xc, yc *Config, rcc rc.Config, mrSize int) (*side, *side) {
	t.Helper()
	mk := func(eps []*udp.Endpoint, peer *udp.Endpoint, cfg *Config, qpn, dest uint32, sq, rq roce.PSN) *side {
		h, mr := newHost(mrSize)
		c := rcc
		c.QPN, c.DestQPN, c.SQPSN, c.RQPSN = qpn, dest, sq, rq
		s := &side{eps: eps, host: h, mr: mr}
		if cfg == nil {
			conn, err := eps[0].NewConn(c, peer.LocalAddr(), h)
			if err != nil {
				t.Fatal(err)
			}
			s.conn = conn
		} else {
			sc := *cfg
			sc.RC, sc.Locals, sc.Peer = c, eps, peer.LocalAddr()
			conn, err := New(sc, h)
			if err != nil {
				t.Fatal(err)
			}
			s.conn, s.spray = conn, conn
		}
		t.Cleanup(s.conn.Close)
		return s
	}
	x := mk(aEps, bEps[0], xc, 0x101, 0x202, 0xfffff0, 0x123456)
	y := mk(bEps, aEps[0], yc, 0x202, 0x101, 0x123456, 0xfffff0)
	start := func(s *side, sq roce.PSN) {
		c := rcc
		c.SQPSN = sq
		if err := s.conn.Start(c); err != nil {
			t.Fatal(err)
		}
	}
	start(x, 0xfffff0)
	start(y, 0x123456)
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

// postAll posts wrs from x (retrying while the queue is full) and waits
// for their completions, which must all succeed in order.
func postAll(ctx context.Context, t testing.TB, x *side, wrs []rc.SendWR) {
	t.Helper()
	const chunk = 128
	for i := 0; i < len(wrs); i += chunk {
		part := wrs[i:min(len(wrs), i+chunk)]
		for _, wr := range part {
			for {
				err := x.conn.Post(wr)
				if err == nil {
					break
				}
				if err != rc.ErrQueueFull || ctx.Err() != nil {
					t.Fatalf("post %#x: %v\n%s", wr.ID, err, x)
				}
				time.Sleep(time.Millisecond)
			}
		}
		cs, err := x.host.TakeSends(ctx, len(part))
		if err != nil {
			t.Fatalf("%v\n%s", err, x)
		}
		for j, c := range cs {
			if c.ID != part[j].ID || c.Status != abi.WCSuccess {
				t.Fatalf("completion %d: %+v, want WR %#x success\n%s", j, c, part[j].ID, x)
			}
		}
	}
}

// exercise runs WRITE, READ, SEND with immediate, WRITE with immediate and
// FETCH_ADD from x to y (total bytes each, messages of msg bytes) and
// checks every byte, every completion, the order of the receives, and
// that each atomic ran once.
func exercise(t testing.TB, x, y *side, total, msg, atomics int, seed uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	n := total / msg
	src := random(total, seed)
	var wrs []rc.SendWR
	for i := range n {
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMAWrite, Length: uint32(msg),
			RemoteAddr: testMRAddr + uint64(i*msg), RKey: testRKey, Local: rctest.Buf(src[i*msg : (i+1)*msg])})
	}
	postAll(ctx, t, x, wrs)
	if !bytes.Equal(y.mr.Copy(0, total), src) {
		t.Fatal("WRITE: data differs")
	}
	dst := make([]byte, total)
	wrs = wrs[:0]
	for i := range n {
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMARead, Length: uint32(msg),
			RemoteAddr: testMRAddr + uint64(i*msg), RKey: testRKey, Local: rctest.Buf(dst[i*msg : (i+1)*msg])})
	}
	postAll(ctx, t, x, wrs)
	if !bytes.Equal(dst, src) {
		t.Fatal("READ: data differs")
	}
	// SEND with immediate and WRITE with immediate, interleaved: the
	// receives are consumed in posting order.
	sendSrc := random(total, seed+1)
	recv := make([]byte, total)
	for i := range n {
		y.host.PostRecv(rc.Recv{ID: uint64(i), Len: uint32(msg), Buf: rctest.Buf(recv[i*msg : (i+1)*msg])})
	}
	wrs = wrs[:0]
	for i := range n {
		if i%4 == 3 {
			wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRRDMAWriteWithImm, Length: uint32(msg), Imm: uint32(i) ^ 0xabcd0000,
				RemoteAddr: testMRAddr + uint64(i*msg), RKey: testRKey, Local: rctest.Buf(sendSrc[i*msg : (i+1)*msg])})
			continue
		}
		wrs = append(wrs, rc.SendWR{ID: uint64(i), Opcode: rc.WRSendWithImm, Length: uint32(msg), Imm: uint32(i) ^ 0xabcd0000,
			Local: rctest.Buf(sendSrc[i*msg : (i+1)*msg])})
	}
	postAll(ctx, t, x, wrs)
	rcs, err := y.host.TakeRecvs(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range rcs {
		write := i%4 == 3
		if c.ID != uint64(i) || c.Status != abi.WCSuccess || c.ByteLen != uint32(msg) || !c.WithImm || c.Imm != uint32(i)^0xabcd0000 || c.Write != write {
			t.Fatalf("receive completion %d: %+v", i, c)
		}
	}
	for i := range n {
		want := sendSrc[i*msg : (i+1)*msg]
		got := recv[i*msg : (i+1)*msg]
		if i%4 == 3 {
			got = y.mr.Copy(i*msg, msg)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("SEND/WRITE with immediate %d: data differs", i)
		}
	}
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

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
