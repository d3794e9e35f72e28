package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// udNetPair is a UD QP on each of two fabrics (hosts) whose networks are
// package hostnet's on two loopback addresses, the engines polling.
type udNetPair struct {
	a, b       *node
	ua, ub     *QP
	na, nb     *hostnet.Network
	gidA, gidB [16]byte
}

func newUDNetPair(t *testing.T) *udNetPair {
	t.Helper()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 29))
	addrA := netip.AddrFrom4([4]byte{127, byte(1 + rng.IntN(250)), byte(rng.IntN(256)), byte(1 + rng.IntN(250))})
	in := func(f func() error) error { return f() }
	return newUDNetPairIn(t, addrA, addrA.Next(), in, in)
}

// newUDNetPairIn is newUDNetPair with A's network listening on addrA from
// within inA (a network namespace's Do), B's likewise.
func newUDNetPairIn(t *testing.T, addrA, addrB netip.Addr, inA, inB func(func() error) error) *udNetPair {
	t.Helper()
	p := &udNetPair{gidA: udp.GID(addrA), gidB: udp.GID(addrB)}
	for _, x := range []struct {
		n    **hostnet.Network
		addr netip.Addr
		in   func(func() error) error
	}{{&p.na, addrA, inA}, {&p.nb, addrB, inB}} {
		n, err := hostnet.New(udp.Config{RecoverIPv4ID: true}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := x.in(func() error { _, err := n.Listen(x.addr); return err }); err != nil {
			t.Skipf("RoCE endpoint on %v: %v", x.addr, err)
		}
		t.Cleanup(func() { n.Close() })
		*x.n = n
	}
	fa, fb := NewFabric(), NewFabric()
	fa.SetNetwork(p.na, [][16]byte{p.gidA})
	fb.SetNetwork(p.nb, [][16]byte{p.gidB})
	p.a, p.b = newNode(t, fa, 1, 0x100, qpOpts{}), newNode(t, fb, 2, 0x200, qpOpts{})
	o := qpOpts{sqDepth: qpDepth, rqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, ud: true}
	p.ua = newQP(t, p.a.g, p.a.d, 0x110, p.a.scq, p.a.rcq, o)
	p.ub = newQP(t, p.b.g, p.b.d, 0x210, p.b.scq, p.b.rcq, o)
	udReady(t, p.ua, udQKey)
	udReady(t, p.ub, udQKey)
	sgid, err := p.a.d.ResolveAH(1, p.gidB)
	if err != nil || sgid != p.gidA {
		t.Fatalf("ResolveAH(1, B): got %x, %v, want %x", sgid, err, p.gidA)
	}
	if err := p.a.d.AddAH(&AH{Num: udAH, PD: testPD, DGID: p.gidB, SGID: sgid}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			wa, _ := p.a.d.Poll(0, p.a.g.tbl)
			wb, _ := p.b.d.Poll(0, p.b.g.tbl)
			if !wa && !wb {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
	return p
}

func (p *udNetPair) send(t *testing.T, w abi.SendWQE, data []byte) {
	t.Helper()
	p.a.g.mrWrite(t, p.a.mr, mrIOVA, data)
	w.Flags |= abi.WRFlagSignaled
	w.AH = udAH
	postSendOn(t, p.a.g, p.ua, w, []abi.SGE{p.a.sge(0, uint32(len(data)))}, nil)
	want1(t, "send", p.a.waitCQEs(t, p.a.scq, 1), abi.CQE{WRID: w.WRID, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: p.ua.Num, ByteLen: uint32(len(data))})
}

// waitStat waits until cond holds for b's device statistics.
func (p *udNetPair) waitDropped(t *testing.T, want uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.b.d.Stats().UDDropped != want {
		if time.Now().After(deadline) {
			t.Fatalf("UD dropped on B: got %d, want %d", p.b.d.Stats().UDDropped, want)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestUDNetwork: a datagram to a UD QP on another host travels as RoCEv2
// (hostnet, udp) and lands behind 20 zero bytes and the IPv4 header it
// arrived with (DF, a valid checksum), with src_qp and the immediate; a
// wrong Q_Key and an empty receive queue drop and count it on the
// receiving device; a receive too small for the GRH and the payload is
// LOC_LEN_ERR and moves the QP to ERR; after RESET the QP is detached
// from the network (its endpoint no longer knows the QP number).
func TestUDNetwork(t *testing.T) {
	p := newUDNetPair(t)
	b := p.b
	data := pattern(300, 7)
	postRecvOn(t, b.g, p.ub, 9, []abi.SGE{b.sge(0, 40), b.sge(1000, 400)})
	p.send(t, abi.SendWQE{WRID: 1, Opcode: abi.WROpSendWithImm, ImmData: 0xdeadbeef, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, data)
	want1(t, "receive", b.waitCQEs(t, b.rcq, 1), abi.CQE{WRID: 9, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH | abi.WCFlagWithImm, QPNum: p.ub.Num, ByteLen: 340, ImmData: 0xdeadbeef, SrcQP: p.ua.Num})
	grh := b.g.mrRead(t, b.mr, mrIOVA, 40)
	if !bytes.Equal(grh[:20], make([]byte, 20)) {
		t.Fatalf("first 20 bytes: % x, want zero", grh[:20])
	}
	h := grh[20:]
	want := []byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0}
	binary.BigEndian.PutUint16(want[2:], 20+8+12+8+4+300+4) // with the ImmDt
	want = append(append(want, p.gidA[12:]...), p.gidB[12:]...)
	got := append([]byte(nil), h...)
	got[10], got[11] = 0, 0
	if !bytes.Equal(got, want) {
		t.Fatalf("IPv4 header:\n got % x\nwant % x (checksum aside)", got, want)
	}
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	if sum != 0xffff {
		t.Fatalf("IPv4 header checksum: ones' complement sum %#x, want 0xffff", sum)
	}
	if got := b.g.mrRead(t, b.mr, mrIOVA+1000, 300); !bytes.Equal(got, data) {
		t.Fatal("payload after the GRH differs")
	}

	// Drops: another Q_Key (a receive posted), then no receive at all.
	postRecvOn(t, b.g, p.ub, 10, []abi.SGE{b.sge(0, 100)})
	p.send(t, abi.SendWQE{WRID: 2, RemoteQPN: p.ub.Num, RemoteQKey: udQKey + 1}, data[:8])
	p.waitDropped(t, 1)
	p.send(t, abi.SendWQE{WRID: 3, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, data[:8])
	want1(t, "receive after a drop", b.waitCQEs(t, b.rcq, 1), abi.CQE{WRID: 10, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
		WCFlags: abi.WCFlagGRH, QPNum: p.ub.Num, ByteLen: 48, SrcQP: p.ua.Num})
	p.send(t, abi.SendWQE{WRID: 4, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, data[:8])
	p.waitDropped(t, 2)

	// Too small: LOC_LEN_ERR, the QP in ERR.
	postRecvOn(t, b.g, p.ub, 11, []abi.SGE{b.sge(0, 40+7)})
	p.send(t, abi.SendWQE{WRID: 5, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, data[:8])
	want1(t, "receive too small", b.waitCQEs(t, b.rcq, 1), abi.CQE{WRID: 11, Status: abi.WCLocLenErr, Opcode: abi.WCOpRecv,
		QPNum: p.ub.Num, SrcQP: p.ua.Num})
	if st := p.ub.State(); st != abi.QPSErr {
		t.Fatalf("after LOC_LEN_ERR: state %d, want ERR", st)
	}

	// RESET detaches: the endpoint counts the next one as to an unknown QP.
	if st := p.ub.Modify(abi.QPAttr{QPN: p.ub.Num, QPState: abi.QPSReset, AttrMask: abi.QPAttrState}); st != abi.StatusOK {
		t.Fatal(st)
	}
	ep := p.nb.Endpoints()[0]
	before := ep.Counters().RxUnknownQP
	p.send(t, abi.SendWQE{WRID: 6, RemoteQPN: p.ub.Num, RemoteQKey: udQKey}, data[:8])
	deadline := time.Now().Add(5 * time.Second)
	for ep.Counters().RxUnknownQP != before+1 {
		if time.Now().After(deadline) {
			t.Fatalf("after RESET: counters %+v, want one more to an unknown QP", ep.Counters())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// TestResolveAHRemote: CREATE_AH's rules for a dgid on another host: from
// a network GID it is accepted where the network carries UD, refused
// across address families, and ErrRemoteAH where the network does not
// carry UD (memNet); from the port GID it is accepted as before.
func TestResolveAHRemote(t *testing.T) {
	p := newUDNetPair(t)
	v6 := netip.MustParseAddr("fd00::9").As16()
	if _, err := p.a.d.ResolveAH(1, v6); !errors.Is(err, ErrAHFamily) {
		t.Errorf("IPv4 network GID to an IPv6 host: got %v, want ErrAHFamily", err)
	}
	if _, err := p.a.d.ResolveAH(0, v6); err != nil {
		t.Errorf("port GID to an unknown GID: %v", err)
	}
	np := newNetPairIdle(t, pairOpts{})
	if _, err := np.a.d.ResolveAH(1, hostB); !errors.Is(err, ErrRemoteAH) {
		t.Errorf("network without UD: got %v, want ErrRemoteAH", err)
	}
}

// TestUDNetns: UD datagrams between two hosts in network namespaces (A and
// B, routed through M), over IPv4 and IPv6, both directions: each lands
// with its GRH built from the IP header it arrived with (for IPv6 the
// header itself: version 6, payload length with the ImmDt, next header
// UDP, the addresses), src_qp and the immediate, the payload verified.
func TestUDNetns(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			l := netlab.NewT(t)
			mp, err := l.NewMultiPath(1)
			if err != nil {
				t.Fatal(err)
			}
			path := mp.Paths[0]
			aAddr, bAddr := path.A, path.B
			if v6 {
				aAddr, bAddr = path.A6, path.B6
			}
			p := newUDNetPairIn(t, aAddr, bAddr, mp.A.Do, mp.B.Do)
			if err := p.b.d.AddAH(&AH{Num: udAH, PD: testPD, DGID: p.gidA, SGID: p.gidB}); err != nil {
				t.Fatal(err)
			}
			for i, dir := range []struct {
				from, to *node
				qf, qt   *QP
				sg, dg   [16]byte
			}{{p.a, p.b, p.ua, p.ub, p.gidA, p.gidB}, {p.b, p.a, p.ub, p.ua, p.gidB, p.gidA}} {
				n := 1000 + 24*i
				data := pattern(n, byte(3+i))
				postRecvOn(t, dir.to.g, dir.qt, 40+uint64(i), []abi.SGE{dir.to.sge(0, 2048)})
				dir.from.g.mrWrite(t, dir.from.mr, mrIOVA+8192, data)
				postSendOn(t, dir.from.g, dir.qf, abi.SendWQE{WRID: uint64(i), Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled,
					ImmData: 0x01020304, AH: udAH, RemoteQPN: dir.qt.Num, RemoteQKey: udQKey}, []abi.SGE{dir.from.sge(8192, uint32(n))}, nil)
				want1(t, "send", dir.from.waitCQEs(t, dir.from.scq, 1), abi.CQE{WRID: uint64(i), Status: abi.WCSuccess, Opcode: abi.WCOpSend,
					QPNum: dir.qf.Num, ByteLen: uint32(n)})
				want1(t, "receive", dir.to.waitCQEs(t, dir.to.rcq, 1), abi.CQE{WRID: 40 + uint64(i), Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
					WCFlags: abi.WCFlagGRH | abi.WCFlagWithImm, QPNum: dir.qt.Num, ByteLen: uint32(40 + n), ImmData: 0x01020304, SrcQP: dir.qf.Num})
				grh := dir.to.g.mrRead(t, dir.to.mr, mrIOVA, 40)
				roce := 8 + 12 + 8 + 4 + n + 4
				if v6 {
					if grh[0] != 0x60 || int(binary.BigEndian.Uint16(grh[4:])) != roce || grh[6] != 17 ||
						!bytes.Equal(grh[8:24], dir.sg[:]) || !bytes.Equal(grh[24:40], dir.dg[:]) {
						t.Fatalf("IPv6 GRH: % x", grh)
					}
				} else if !bytes.Equal(grh[:20], make([]byte, 20)) || grh[20] != 0x45 || int(binary.BigEndian.Uint16(grh[22:])) != 20+roce ||
					grh[29] != 17 || !bytes.Equal(grh[32:36], dir.sg[12:]) || !bytes.Equal(grh[36:40], dir.dg[12:]) {
					t.Fatalf("IPv4 GRH: % x", grh)
				}
				if got := dir.to.g.mrRead(t, dir.to.mr, mrIOVA+40, uint64(n)); !bytes.Equal(got, data) {
					t.Fatal("payload differs")
				}
			}
		})
	}
}

// TestUDNetworkSRQ: a UD QP on an SRQ takes a datagram from another host
// from the SRQ's WQEs, in ring order, the GRH in front of each payload.
func TestUDNetworkSRQ(t *testing.T) {
	p := newUDNetPair(t)
	b := p.b
	srq := newSRQ(t, b.g, b.d, 0x5503, 4, 1)
	o := qpOpts{sqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, ud: true, srq: srq}
	us := newQP(t, b.g, b.d, 0x211, b.scq, b.rcq, o)
	udReady(t, us, udQKey)
	postSRQ(t, b.g, srq, 71, []abi.SGE{b.sge(0, 40+100)}, -1)
	postSRQ(t, b.g, srq, 72, []abi.SGE{b.sge(4096, 40+100)}, -1)
	for i, n := range []int{100, 7} {
		p.send(t, abi.SendWQE{WRID: uint64(i), RemoteQPN: us.Num, RemoteQKey: udQKey}, pattern(n, byte(i)))
	}
	got := b.waitCQEs(t, b.rcq, 2)
	for i, w := range []abi.CQE{
		{WRID: 71, Opcode: abi.WCOpRecv, WCFlags: abi.WCFlagGRH, QPNum: us.Num, SrcQP: p.ua.Num, ByteLen: 140},
		{WRID: 72, Opcode: abi.WCOpRecv, WCFlags: abi.WCFlagGRH, QPNum: us.Num, SrcQP: p.ua.Num, ByteLen: 47},
	} {
		if got[i] != w {
			t.Fatalf("receive %d: got %+v, want %+v", i, got[i], w)
		}
	}
	if !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA+40, 100), pattern(100, 0)) || !bytes.Equal(b.g.mrRead(t, b.mr, mrIOVA+4096+40, 7), pattern(7, 1)) {
		t.Fatal("payloads not behind the GRHs in the SRQ's WQEs")
	}
}
