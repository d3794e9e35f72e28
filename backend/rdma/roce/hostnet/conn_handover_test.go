package hostnet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// memHost is a device's side of a connection for these tests: one MR
// (remote access under key, local SGEs under the same key), receives, and
// the completions. handover makes the host of a new process: the same
// memory (the guest's), the receives not consumed and the one being
// filled, no completions.
type memHost struct {
	mr  *rctest.MR
	key uint32

	mu      sync.Mutex
	recvs   []rc.Recv            // posted, not consumed
	taken   map[uint64]rc.Buffer // consumed receives by ID (RecvBuffer)
	sends   []rc.Completion
	recvd   []rc.RecvCompletion
	failed  bool
	changed chan struct{}
}

func newMemHost(key uint32, size int, base uint64) *memHost {
	return &memHost{
		mr:  &rctest.MR{Buf: make([]byte, size), Addr: base, RKey: key, Access: rc.AccessRemoteWrite | rc.AccessRemoteRead | rc.AccessRemoteAtomic},
		key: key, taken: map[uint64]rc.Buffer{}, changed: make(chan struct{}, 1),
	}
}

func (h *memHost) handover() *memHost {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := &memHost{mr: h.mr, key: h.key, taken: map[uint64]rc.Buffer{}, changed: make(chan struct{}, 1)}
	n.recvs = append(n.recvs, h.recvs...)
	for id, b := range h.taken {
		n.taken[id] = b
	}
	return n
}

// sges returns the SGEs of n bytes at offset off of the MR, in two
// pieces (a description with more than one SGE).
func (h *memHost) sges(off, n int) []rc.SGEState {
	a := h.mr.Addr + uint64(off)
	k := n / 3
	return []rc.SGEState{{LKey: h.key, Addr: a, Length: uint32(k)}, {LKey: h.key, Addr: a + uint64(k), Length: uint32(n - k)}}
}

func (h *memHost) buffer(sges []rc.SGEState) (*sgeBuf, error) {
	for _, s := range sges {
		if s.LKey != h.key || s.Addr < h.mr.Addr || s.Addr-h.mr.Addr+uint64(s.Length) > uint64(len(h.mr.Buf)) {
			return nil, fmt.Errorf("SGE %+v outside the MR", s)
		}
	}
	return &sgeBuf{h: h, sges: sges}, nil
}

func (h *memHost) postRecv(id uint64, off, n int) {
	b, err := h.buffer(h.sges(off, n))
	if err != nil {
		panic(err)
	}
	h.mu.Lock()
	h.recvs = append(h.recvs, rc.Recv{ID: id, Len: uint32(n), Buf: b})
	h.mu.Unlock()
}

// sgeBuf is local memory over SGEs of the host's MR (rc.Buffer,
// rc.Describer).
type sgeBuf struct {
	h    *memHost
	sges []rc.SGEState
}

func (b *sgeBuf) walk(off uint32, p []byte, into bool) error {
	skip := uint64(off)
	for _, s := range b.sges {
		if len(p) == 0 {
			break
		}
		if skip >= uint64(s.Length) {
			skip -= uint64(s.Length)
			continue
		}
		o := s.Addr - b.h.mr.Addr + skip
		k := min(uint64(len(p)), uint64(s.Length)-skip)
		if into {
			copy(b.h.mr.Buf[o:o+k], p[:k])
		} else {
			copy(p[:k], b.h.mr.Buf[o:o+k])
		}
		p, skip = p[k:], 0
	}
	if len(p) > 0 {
		return errors.New("beyond the SGEs")
	}
	return nil
}

func (b *sgeBuf) Gather(off uint32, dst []byte) error  { return b.walk(off, dst, false) }
func (b *sgeBuf) Scatter(off uint32, src []byte) error { return b.walk(off, src, true) }
func (b *sgeBuf) Describe() rc.LocalState {
	return rc.LocalState{SGEs: append([]rc.SGEState(nil), b.sges...)}
}

func (h *memHost) Resolve(rkey uint32, va uint64, length uint32, access rc.Access) (rc.Region, bool) {
	if length == 0 {
		return nil, true
	}
	if rkey != h.key || va < h.mr.Addr || va-h.mr.Addr+uint64(length) > uint64(len(h.mr.Buf)) {
		return nil, false
	}
	return h.mr, true
}

func (h *memHost) TakeRecv() (rc.Recv, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.recvs) == 0 {
		return rc.Recv{}, false
	}
	r := h.recvs[0]
	h.recvs = h.recvs[1:]
	h.taken[r.ID] = r.Buf
	return r, true
}

func (h *memHost) RecvDone(c rc.RecvCompletion) {
	h.mu.Lock()
	h.recvd = append(h.recvd, c)
	h.mu.Unlock()
	h.notify()
}

func (h *memHost) SendDone(c rc.Completion) {
	h.mu.Lock()
	h.sends = append(h.sends, c)
	h.mu.Unlock()
	h.notify()
}

func (h *memHost) Invalidate(uint32, bool) bool { return false }

func (h *memHost) Failed(bool) {
	h.mu.Lock()
	h.failed = true
	h.mu.Unlock()
}

func (h *memHost) SendBuffer(w *rc.WQEState) (rc.Buffer, error) {
	if w.Local == nil {
		return nil, errors.New("no description")
	}
	return h.buffer(w.Local.SGEs)
}

func (h *memHost) RecvBuffer(r *rc.RecvState) (rc.Buffer, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.taken[r.ID]
	if b == nil {
		return nil, fmt.Errorf("receive %#x was not taken", r.ID)
	}
	return b, nil
}

func (h *memHost) notify() {
	select {
	case h.changed <- struct{}{}:
	default:
	}
}

// waitFor waits until cond (called with h.mu held) holds.
func (h *memHost) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		h.mu.Lock()
		ok := cond()
		h.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within 20 s", what)
		case <-h.changed:
		case <-time.After(time.Millisecond):
		}
	}
}

var (
	_ rc.Rebuilder = (*memHost)(nil)
	_ rc.Failer    = (*memHost)(nil)
	_ rc.Describer = (*sgeBuf)(nil)
)

// TestConnHandover runs a stream of WRITEs and SENDs, verified byte for
// byte, from x (network A) to y (network B), and SENDs from y to x; it
// freezes network A and x while x's requester has work in flight (a SEND
// stalled on RNR NAKs, since y has too few receives, and what follows it),
// takes the state out as JSON, and restores x on a new network that
// adopted A's sockets, with a new host over the same memory. Every
// message arrives once and in order, x's PSNs continue, y sees no error,
// and the restored x takes new work both ways.
func TestConnHandover(t *testing.T) {
	const (
		msg    = 8 << 10 // 8 packets of 1024
		nMsgs  = 64      // x→y: WRITE, SEND, WRITE, SEND …
		nSends = nMsgs / 2
		early  = 16 // the receives y posts before the handover
		nBack  = 16 // y→x SENDs
		sqpsn  = 0xfffff0
		rqpsn  = 0x7ffff8
	)
	aAddr, bAddr := netip.MustParseAddr("127.77.5.1"), netip.MustParseAddr("127.77.5.2")
	netA, netB := newNet(t, 4791), newNet(t, 4791)
	listenOn(t, netA, aAddr.String())
	listenOn(t, netB, bAddr.String())
	hx := newMemHost(0x11, 4<<20, 0x100000)
	hy := newMemHost(0x22, 4<<20, 0x900000)
	cfg := rc.Config{PMTU: roce.MTU1024, SQSize: 128, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 1, Timeout: 20 * time.Millisecond}
	connect := func(n *Network, src, dst netip.Addr, qpn, dqpn uint32, sq, rq roce.PSN, h rc.Host) rc.Conn {
		c := cfg
		c.QPN, c.DestQPN, c.RQPSN = qpn, dqpn, rq
		conn, err := n.Connect(udp.GID(src), udp.GID(dst), nil, 1, c, h)
		if err != nil {
			t.Fatal(err)
		}
		c.SQPSN = sq
		if err := conn.Start(c); err != nil {
			t.Fatal(err)
		}
		return conn
	}
	x := connect(netA, aAddr, bAddr, 0x101, 0x202, sqpsn, rqpsn, hx)
	y := connect(netB, bAddr, aAddr, 0x202, 0x101, rqpsn, sqpsn, hy)

	// x's data at [0, nMsgs*msg) of its MR; y's WRITE targets at
	// [0, nSends*msg), its receives after them. x's receives after its
	// data, y's data for them after those.
	src := make([]byte, nMsgs*msg)
	for i := range src {
		src[i] = byte(i*7 + i>>13)
	}
	hx.mr.Store(0, src)
	backSrc := bytes.Repeat([]byte("vrdma-handover-"), nBack*msg/15+1)[:nBack*msg]
	hy.mr.Store(2*nSends*msg, backSrc)
	recvOff := nSends * msg
	for i := range early {
		hy.postRecv(uint64(i), recvOff+i*msg, msg)
	}
	for i := range nBack {
		hx.postRecv(uint64(i), nMsgs*msg+i*msg, msg)
	}
	post := func(c rc.Conn, h *memHost, id uint64, op rc.WROpcode, off, raddr int) {
		t.Helper()
		b, err := h.buffer(h.sges(off, msg))
		if err != nil {
			t.Fatal(err)
		}
		wr := rc.SendWR{ID: id, Opcode: op, Length: msg, Local: b, Imm: uint32(id)}
		if op == rc.WRRDMAWrite {
			wr.RemoteAddr, wr.RKey = uint64(raddr), hy.key
		}
		if err := c.Post(wr); err != nil {
			t.Fatalf("post %d: %v", id, err)
		}
	}
	for i := range nMsgs {
		if i%2 == 0 {
			post(x, hx, uint64(i), rc.WRRDMAWrite, i*msg, int(hy.mr.Addr)+(i/2)*msg)
		} else {
			post(x, hx, uint64(i), rc.WRSendWithImm, i*msg, 0)
		}
	}
	for i := range nBack {
		post(y, hy, uint64(i), rc.WRSend, 2*nSends*msg+i*msg, 0)
	}
	// x stalls at SEND number early (WQE 2*early+1): y has no receive.
	stall := 2*early + 1
	hx.waitFor(t, "x's completions before the stall", func() bool { return len(hx.sends) == stall && len(hx.recvd) == nBack })
	xq := x.(*udp.Conn)
	waitUntil(t, func() bool { return xq.Counters().RNRNAKsRecv > 0 })

	// The old process freezes the network, then the connection.
	stA, fds, err := netA.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	st, err := FreezeConn(x)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := json.Marshal(struct {
		N *NetworkState `json:"network"`
		C *rc.ConnState `json:"conn"`
	}{stA, st})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("state: %d bytes of JSON; requester %+v", len(doc), st.Requester.WQEs[0])
	var got struct {
		N *NetworkState `json:"network"`
		C *rc.ConnState `json:"conn"`
	}
	if err := json.Unmarshal(doc, &got); err != nil {
		t.Fatal(err)
	}
	if n := len(got.C.Requester.WQEs); n != nMsgs-stall || got.C.Requester.WQEs[0].ID != uint64(stall) || !got.C.Requester.WQEs[0].Started {
		t.Fatalf("frozen requester holds %d work requests from %+v, want %d from %d, started", n, got.C.Requester.WQEs[0], nMsgs-stall, stall)
	}
	if got.C.Local != "127.77.5.1:4791" || got.C.Peer != "127.77.5.2:4791" || got.C.PeerSourcePort != 4791 {
		t.Fatalf("addresses %q → %q (source port %d)", got.C.Local, got.C.Peer, got.C.PeerSourcePort)
	}

	// The new process: adopt, restore, and thaw once committed.
	netA2 := newNet(t, 4791)
	if err := netA2.Adopt(got.N, fds); err != nil {
		t.Fatal(err)
	}
	hx2 := hx.handover()
	x2, err := netA2.Restore(got.C, hx2)
	if err != nil {
		t.Fatal(err)
	}
	for i := early; i < nSends; i++ {
		hy.postRecv(uint64(i), recvOff+i*msg, msg)
	}
	netA2.Thaw()

	hx2.waitFor(t, "x's completions after the handover", func() bool { return len(hx2.sends) == nMsgs-stall })
	hy.waitFor(t, "y's receives", func() bool { return len(hy.recvd) == nSends && len(hy.sends) == nBack })
	for i, c := range append(hx.sends, hx2.sends...) {
		if c.ID != uint64(i) || c.Status != abi.WCSuccess {
			t.Fatalf("x's completion %d: %+v", i, c)
		}
	}
	for i, c := range hy.recvd {
		if c.ID != uint64(i) || c.Status != abi.WCSuccess || c.ByteLen != msg || !c.WithImm || c.Imm != uint32(2*i+1) {
			t.Fatalf("y's receive %d: %+v", i, c)
		}
	}
	for i := range nSends {
		w, s := 2*i, 2*i+1
		if !bytes.Equal(hy.mr.Copy(i*msg, msg), src[w*msg:(w+1)*msg]) {
			t.Fatalf("WRITE %d: data differs", w)
		}
		if !bytes.Equal(hy.mr.Copy(recvOff+i*msg, msg), src[s*msg:(s+1)*msg]) {
			t.Fatalf("SEND %d: data differs", s)
		}
	}
	if !bytes.Equal(hx.mr.Copy(nMsgs*msg, nBack*msg), backSrc) {
		t.Fatal("y→x SENDs: data differs")
	}
	yq := y.(*udp.Conn)
	if yq.Err() || hy.failed || hx2.failed {
		t.Fatal("a QP failed")
	}
	// PSNs continue across the handover (8 packets a message; the SQPSN
	// wraps).
	want := roce.PSN(sqpsn).Add(nMsgs * msg / 1024)
	if r := x2.(rc.Reporter).Report(); roce.PSN(r.SQPSN) != want || roce.PSN(yq.Report().RQPSN) != want {
		t.Fatalf("x sends PSN %#x, y expects %#x, want %#x", r.SQPSN, yq.Report().RQPSN, want)
	}
	if c := yq.Counters(); c.NAKsSent != 0 {
		t.Fatalf("y NAKed: %+v", c)
	}

	// The restored x takes new work both ways.
	hx2.postRecv(100, nMsgs*msg, msg)
	post(y, hy, 100, rc.WRSend, 0, 0)
	post(x2, hx2, 100, rc.WRRDMAWrite, 0, int(hy.mr.Addr)+3*nSends*msg)
	hx2.waitFor(t, "new work on x", func() bool { return len(hx2.recvd) == 1 && len(hx2.sends) == nMsgs-stall+1 })
	hy.waitFor(t, "new work on y", func() bool { return len(hy.sends) == nBack+1 })
	if c := hx2.sends[len(hx2.sends)-1]; c.ID != 100 || c.Status != abi.WCSuccess || hx2.recvd[0].Status != abi.WCSuccess {
		t.Fatalf("new work: %+v, %+v", c, hx2.recvd[0])
	}
	if !bytes.Equal(hy.mr.Copy(3*nSends*msg, msg), src[:msg]) || !bytes.Equal(hx.mr.Copy(nMsgs*msg, msg), hy.mr.Copy(0, msg)) {
		t.Fatal("new work: data differs")
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 20 s")
		}
		time.Sleep(time.Millisecond)
	}
}
