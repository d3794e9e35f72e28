package udp

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc/rctest"
)

// TestPlanRuns: which queued packets share a super-datagram.
func TestPlanRuns(t *testing.T) {
	p := netip.MustParseAddrPort("[fd00::1]:4791")
	q := netip.MustParseAddrPort("[fd00::2]:4791")
	rep := func(n, l int) []int { return slices.Repeat([]int{l}, n) }
	cat := func(xs ...[]int) []int { return slices.Concat(xs...) }
	same := func(n int) []netip.AddrPort { return slices.Repeat([]netip.AddrPort{p}, n) }
	for _, tc := range []struct {
		name string
		lens []int
		dsts []netip.AddrPort
		gso  bool
		want []run
	}{
		{"empty", nil, nil, true, nil},
		{"one", []int{1040}, same(1), true, []run{{0, 1, 1040}}},
		{"gso off", rep(3, 1040), same(3), false, []run{{0, 1, 1040}, {1, 1, 1040}, {2, 1, 1040}}},
		// A WRITE at PMTU 1024: FIRST carries a RETH (1056), then the
		// MIDDLEs and a LAST, the last shorter. The first MIDDLE is a
		// short last segment after the FIRST.
		{"write", cat([]int{1056}, rep(5, 1040), []int{532}), same(7), true, []run{{0, 2, 1056}, {2, 5, 1040}}},
		{"short ends the run", cat(rep(2, 1040), []int{100}, rep(2, 1040)), same(5), true, []run{{0, 3, 1040}, {3, 2, 1040}}},
		{"longer starts a new run", cat(rep(2, 100), rep(2, 1040)), same(4), true, []run{{0, 2, 100}, {2, 2, 1040}}},
		{"destination change", rep(4, 1040), []netip.AddrPort{p, p, q, q}, true, []run{{0, 2, 1040}, {2, 2, 1040}}},
		{"interleaved destinations", rep(4, 1040), []netip.AddrPort{p, q, p, q}, true,
			[]run{{0, 1, 1040}, {1, 1, 1040}, {2, 1, 1040}, {3, 1, 1040}}},
		// 62 × 1040 = 64480 fits maxGSOBytes, 63 do not.
		{"byte limit", rep(64, 1040), same(64), true, []run{{0, 62, 1040}, {62, 2, 1040}}},
		{"segment limit", rep(70, 64), same(70), true, []run{{0, 64, 64}, {64, 6, 64}}},
		{"one big", []int{maxGSOBytes}, same(1), true, []run{{0, 1, maxGSOBytes}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planRuns(tc.lens, tc.dsts, tc.gso, make([]run, 0, len(tc.lens)))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			// Every packet in exactly one run, in order, within limits.
			next := 0
			for _, r := range got {
				bytes := 0
				for k := range r.n {
					l := tc.lens[r.first+k]
					bytes += l
					if l > r.seg || (l < r.seg && k != r.n-1) || tc.dsts[r.first+k] != tc.dsts[r.first] {
						t.Fatalf("run %+v: packet %d of %d bytes", r, k, l)
					}
				}
				if r.first != next || r.n > maxGSOSegs || (r.n > 1 && bytes > maxGSOBytes) {
					t.Fatalf("run %+v after packet %d (%d bytes)", r, next, bytes)
				}
				next += r.n
			}
			if next != len(tc.lens) {
				t.Fatalf("runs cover %d of %d packets", next, len(tc.lens))
			}
		})
	}
}

func TestGROSegments(t *testing.T) {
	for _, tc := range []struct{ n, seg, count, size int }{
		{1040, 0, 1, 1040},
		{1040, -1, 1, 1040},
		{1040, 1040, 1, 1040},    // a seg not below n: one datagram
		{1040, 1 << 30, 1, 1040}, // garbage
		{2080, 1040, 2, 1040},
		{2081, 1040, 3, 1040}, // a 1-byte last datagram
		{3000, 1040, 3, 1040}, // a short last one
		{65536, 1, 65536, 1},  // bounded by n; handle does not loop over these
		{0, 0, 1, 0},
	} {
		if c, s := groSegments(tc.n, tc.seg); c != tc.count || s != tc.size {
			t.Errorf("groSegments(%d, %d) = %d, %d; want %d, %d", tc.n, tc.seg, c, s, tc.count, tc.size)
		}
	}
}

// TestGROSize: the UDP_GRO control message is found among others, and
// malformed control data yields nothing rather than a panic.
func TestGROSize(t *testing.T) {
	mk := func() []byte { return unsafeAligned(rxCtlSpace) }
	ctl := mk()
	n := putGROSize(ctl, 1040)
	if seg, ok := groSize(ctl[:n]); !ok || seg != 1040 {
		t.Fatalf("groSize = %d, %v; want 1040", seg, ok)
	}
	// Another message first (IP_TOS, one byte of data), then UDP_GRO.
	ctl = mk()
	other := putCmsg(ctl, unix.IPPROTO_IP, unix.IP_TOS, 1)
	n = putGROSize(ctl[other:], 1500)
	if seg, ok := groSize(ctl[:other+n]); !ok || seg != 1500 {
		t.Fatalf("after another message: %d, %v", seg, ok)
	}
	for name, c := range map[string][]byte{
		"empty":          nil,
		"short header":   mk()[:unix.SizeofCmsghdr-1],
		"length 0":       func() []byte { c := mk(); putCmsg(c, unix.SOL_UDP, unix.UDP_GRO, 4); setCmsgLen(c, 0); return c }(),
		"length too big": func() []byte { c := mk(); putGROSize(c, 1040); setCmsgLen(c, rxCtlSpace+1); return c }(),
		"data too short": func() []byte { c := mk(); putCmsg(c, unix.SOL_UDP, unix.UDP_GRO, 2); return c }(),
		"other level":    func() []byte { c := mk(); putCmsg(c, unix.SOL_IP, unix.UDP_GRO, 4); return c }(),
	} {
		if seg, ok := groSize(c); ok {
			t.Errorf("%s: groSize = %d, true", name, seg)
		}
	}
}

// groEndpoint is an endpoint without a socket whose receive batch has one
// 64 KiB buffer with control space, and a QP 7 with an MR for WRITEs from
// peer.
func groEndpoint(t testing.TB, local, peer netip.Addr) (*Endpoint, *rctest.MR) {
	e := &Endpoint{
		cfg:     Config{Addr: local, Port: roce.UDPPort},
		local:   netip.AddrPortFrom(local, roce.UDPPort),
		rx:      newBatch(1, groBufSize, rxCtlSpace),
		touched: make([]*qpEntry, 0, 1),
	}
	h := rctest.NewHost()
	mr := &rctest.MR{Buf: make([]byte, 1<<20), Addr: testMRAddr, RKey: testRKey, Access: rc.AccessRemoteWrite}
	h.AddMR(mr)
	qp, err := rc.New(rc.Config{QPN: 7, DestQPN: 9, PMTU: roce.MTU1024}, h, &nopPort{})
	if err != nil {
		t.Fatal(err)
	}
	table := map[uint32]*qpEntry{7: {qp: qp, peer: peer}}
	e.table.Store(&table)
	return e, mr
}

// writePackets returns the packets of one WRITE of n bytes from PSN psn at
// PMTU 1024, sealed from peer:50000 to local: FIRST (with a RETH),
// MIDDLEs, LAST, each its own slice.
func writePackets(t testing.TB, peer, local netip.Addr, psn roce.PSN, off uint64, n int, fill byte) [][]byte {
	var out [][]byte
	for done := 0; done < n; {
		l := min(1024, n-done)
		op := roce.OpWriteMiddle
		switch {
		case done == 0 && l == n:
			op = roce.OpWriteOnly
		case done == 0:
			op = roce.OpWriteFirst
		case done+l == n:
			op = roce.OpWriteLast
		}
		p := roce.Packet{BTH: roce.BTH{Opcode: op, PKey: 0xffff, DestQP: 7, PSN: psn, AckReq: done+l == n},
			Payload: slices.Repeat([]byte{fill}, l)}
		if done == 0 {
			p.RETH = roce.RETH{VA: testMRAddr + off, RKey: testRKey, DMALen: uint32(n)}
		}
		b, err := p.Append(nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := roce.Seal(roce.IPHeader{Src: peer, Dst: local, FlagsFragment: roce.IPv4DF}, 50000, roce.UDPPort, b); err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
		psn = psn.Add(1)
		done += l
	}
	return out
}

// coalesce puts pkts (all of the first's size but the last) into buffer 0
// of e's receive batch as the kernel's UDP_GRO does, with gso_size seg.
func coalesce(e *Endpoint, src netip.AddrPort, seg int32, pkts ...[]byte) {
	n := 0
	for _, p := range pkts {
		n += copy(e.rx.bufs[0][n:], p)
	}
	e.rx.resetRecv(0)
	e.rx.setSend(0, n, src)
	e.rx.hdrs[0].Len = uint32(n)
	e.rx.hdrs[0].Hdr.SetControllen(putGROSize(e.rx.ctls[0], seg))
}

// TestHandleGRO: a coalesced buffer is split into its datagrams, at the
// gso_size boundaries (a short last one included), each checked and
// delivered on its own; a gso_size that is not the packets' makes no
// datagram deliverable, and a nonsensical one is counted, not looped over.
func TestHandleGRO(t *testing.T) {
	local, peer := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	src := netip.AddrPortFrom(peer, 50000)
	settled := func(c Counters) bool {
		return c.RxDatagrams == c.RxDelivered+c.RxTruncated+c.RxMalformed+c.RxICRC+c.RxUnknownQP+c.RxWrongPeer
	}
	t.Run("split", func(t *testing.T) {
		e, mr := groEndpoint(t, local, peer)
		// 3000 bytes: a FIRST of 1056, then MIDDLE 1040, LAST 968.
		// The FIRST alone, the other two coalesced, the LAST short.
		pkts := writePackets(t, peer, local, 0, 0, 3000, 0xab)
		coalesce(e, src, 0, pkts[0])
		e.handle(0, 1)
		coalesce(e, src, int32(len(pkts[1])), pkts[1:]...)
		e.handle(0, 2)
		c := e.Counters()
		if c.RxDatagrams != 3 || c.RxDelivered != 3 || c.RxGRO != 1 || !settled(c) {
			t.Fatalf("counters %+v", c)
		}
		if got := mr.Copy(0, 3001); !slices.Equal(got[:3000], slices.Repeat([]byte{0xab}, 3000)) || got[3000] != 0 {
			t.Fatal("WRITE data not placed")
		}
	})
	t.Run("odd boundaries", func(t *testing.T) {
		// Four MIDDLE-sized packets coalesced: split at every gso_size
		// but the right one, no packet survives; at the right one, all.
		pkts := writePackets(t, peer, local, 0, 0, 6*1024, 0x5c)[1:5]
		for _, seg := range []int32{1, 7, 15, 16, 17, 520, 1039, 1041, 2080, 4159, 4160} {
			e, _ := groEndpoint(t, local, peer)
			coalesce(e, src, seg, pkts...)
			e.handle(0, 1)
			c := e.Counters()
			count, _ := groSegments(4*1040, int(seg))
			if c.RxDatagrams != uint64(count) || c.RxDelivered != 0 || !settled(c) {
				t.Errorf("gso_size %d: counters %+v, want %d datagrams none delivered", seg, c, count)
			}
		}
	})
	t.Run("hostile gso_size", func(t *testing.T) {
		pkts := writePackets(t, peer, local, 0, 0, 2048, 0x11)
		for _, seg := range []int32{0, -1, -1 << 31, 1 << 30, int32(len(pkts[0]) + len(pkts[1]))} {
			// A gso_size that is no split: the buffer is one datagram
			// (two packets' bytes: malformed or a bad ICRC).
			e, _ := groEndpoint(t, local, peer)
			coalesce(e, src, seg, pkts...)
			e.handle(0, 1)
			if c := e.Counters(); c.RxDatagrams != 1 || c.RxDelivered != 0 || c.RxGRO != 0 || !settled(c) {
				t.Errorf("gso_size %d: counters %+v", seg, c)
			}
		}
		// A split into datagrams longer than any packet: each truncated.
		e, _ := groEndpoint(t, local, peer)
		big := make([]byte, 3*(bufSize+1))
		coalesce(e, src, int32(bufSize+1), big)
		e.handle(0, 1)
		if c := e.Counters(); c.RxDatagrams != 3 || c.RxTruncated != 3 || !settled(c) {
			t.Errorf("oversized segments: counters %+v", c)
		}
		// A control message cut off: the buffer cannot be split.
		e, _ = groEndpoint(t, local, peer)
		coalesce(e, src, 1040, pkts...)
		e.rx.hdrs[0].Hdr.SetControllen(0)
		e.rx.hdrs[0].Hdr.Flags |= unix.MSG_CTRUNC
		e.handle(0, 1)
		if c := e.Counters(); c.RxDatagrams != 1 || c.RxTruncated != 1 || !settled(c) {
			t.Errorf("MSG_CTRUNC: counters %+v", c)
		}
	})
}

// TestHandleGRONoAllocations: splitting a coalesced buffer and delivering
// its datagrams to a QP does not allocate.
func TestHandleGRONoAllocations(t *testing.T) {
	local, peer := netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
	src := netip.AddrPortFrom(peer, 50000)
	e, _ := groEndpoint(t, local, peer)
	psn := roce.PSN(0)
	var msgs [][][]byte
	for range 64 {
		pkts := writePackets(t, peer, local, psn, 0, 8*1024, 1)
		psn = psn.Add(uint32(len(pkts)))
		msgs = append(msgs, pkts)
	}
	i, gen := 0, uint64(0)
	n := testing.AllocsPerRun(50, func() {
		pkts := msgs[i%len(msgs)]
		i++
		coalesce(e, src, 0, pkts[0])
		gen++
		e.handle(0, gen)
		coalesce(e, src, int32(len(pkts[1])), pkts[1:]...)
		gen++
		e.handle(0, gen)
		for _, ent := range e.touched {
			ent.qp.Flush()
		}
		e.touched = e.touched[:0]
	})
	if n != 0 {
		t.Errorf("%v allocations per coalesced WRITE", n)
	}
	if c := e.Counters(); c.RxDelivered != c.RxDatagrams || c.RxGRO == 0 {
		t.Fatalf("counters %+v", c)
	}
}

// TestFlushGSONoAllocations: queueing a burst of full-size packets to one
// peer and flushing it as super-datagrams (IPv6 loopback) does not
// allocate, and the burst does leave as super-datagrams, which the peer's
// endpoint receives coalesced.
func TestFlushGSONoAllocations(t *testing.T) {
	lo := netip.MustParseAddr("::1")
	a := listen(t, Config{Addr: lo, Port: 47913})
	b := listen(t, Config{Addr: lo, Port: 47914})
	if gso, gro := a.Offload(); !gso || !gro {
		t.Skipf("offload unavailable on this kernel: GSO %v, GRO %v", gso, gro)
	}
	r, err := a.Route(b.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	pkts := writePackets(t, lo, lo, 0, 0, 62*1024, 3)
	n := testing.AllocsPerRun(100, func() {
		for _, p := range pkts {
			r.Send(p)
		}
		r.Flush()
	})
	if n != 0 {
		t.Errorf("%v allocations per burst", n)
	}
	ca := a.Counters()
	if ca.TxErrors != 0 || ca.TxGSO < 100 || ca.TxDatagrams != 101*uint64(len(pkts)) {
		t.Fatalf("sender counters %+v", ca)
	}
	waitFor(t, func() bool { return b.Counters().RxGRO > 0 })
	t.Logf("sender %+v\nreceiver %+v", ca, b.Counters())
}

// putCmsg writes a control message header for datalen bytes at the start
// of c and returns its space.
func putCmsg(c []byte, level, typ int32, datalen int) int {
	h := cmsgAt(c)
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(datalen))
	return unix.CmsgSpace(datalen)
}

func setCmsgLen(c []byte, l int) { cmsgAt(c).SetLen(l) }

// TestGSOFallback: a socket the kernel refuses super-datagrams on
// (UDP_NO_CHECK6_TX: GSO needs the checksum, EINVAL) turns GSO off at the
// first refusal and sends the same burst a datagram at a time: nothing is
// lost.
func TestGSOFallback(t *testing.T) {
	lo := netip.MustParseAddr("::1")
	a := listen(t, Config{Addr: lo, Port: 47915})
	b := listen(t, Config{Addr: lo, Port: 47916})
	if gso, _ := a.Offload(); !gso {
		t.Skip("no GSO on this kernel")
	}
	var serr error
	a.raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_NO_CHECK6_TX, 1) })
	b.raw.Control(func(fd uintptr) {
		if serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_NO_CHECK6_RX, 1)
		}
	})
	if serr != nil {
		t.Fatal(serr)
	}
	r, err := a.Route(b.LocalAddr())
	if err != nil {
		t.Fatal(err)
	}
	pkts := writePackets(t, lo, lo, 0, 0, 16*1024, 3)
	for _, p := range pkts {
		r.Send(p)
	}
	r.Flush()
	ca := a.Counters()
	if gso, _ := a.Offload(); gso || ca.TxErrors != 0 || ca.TxDatagrams != uint64(len(pkts)) || ca.TxGSO != 0 {
		t.Fatalf("GSO %v after a refusal; counters %+v", gso, ca)
	}
	waitFor(t, func() bool { return b.Counters().RxDatagrams == uint64(len(pkts)) })
	if err := a.SetOffload(true, true); err != nil {
		t.Fatal(err)
	}
	if err := listen(t, Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: 47917}).SetOffload(true, true); !errors.Is(err, ErrOffload) {
		t.Fatalf("GSO on IPv4: %v, want ErrOffload", err)
	}
}
