package engine

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/ud"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// gsiNode is a device with its own network GIDs (a per-device roce_bind)
// and a GSI QP in RTS.
type gsiNode struct {
	*node
	gsi *QP
}

func newGSINode(t *testing.T, f *Fabric, gid byte, netGIDs [][16]byte) *gsiNode {
	t.Helper()
	n := &node{g: newGuest(t, "guest", 4<<20)}
	n.d = NewRNIC(f, [16]byte{0xfe, 0x80, 15: gid}, nil)
	n.d.SetNetGIDs(netGIDs)
	if err := f.Register(n.d); err != nil {
		t.Fatal(err)
	}
	n.d.Attach(n.g.mem, nil, nil)
	n.scq = newCQ(t, n.g, n.d, 0x11, cqDepth)
	n.rcq = newCQ(t, n.g, n.d, 0x12, cqDepth)
	n.mr = n.g.newMR(t, mrKey, testPD, abi.AccessAll, mrIOVA, mrLen, true)
	addMR(n.d, n.mr)
	q := newQP(t, n.g, n.d, uint32(gid)<<8|0xa0, n.scq, n.rcq, qpOpts{sqDepth: qpDepth, rqDepth: qpDepth, maxSGE: qpSGE, inl: qpInl, gsi: true})
	udReady(t, q, abi.GSIQKey)
	return &gsiNode{node: n, gsi: q}
}

// pollAll runs the devices' engines until the test ends.
func pollAll(t *testing.T, ns ...*gsiNode) {
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
			worked := false
			for _, n := range ns {
				w, _ := n.d.Poll(0, n.g.tbl)
				worked = worked || w
			}
			if !worked {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
}

// TestGSINetwork: a GSI datagram crosses RoCEv2 as BTH destination QP 1
// and DETH source QP 1 with the GSI Q_Key (the receiving device's GSI QP
// takes it, src_qp 1, the GRH from the IP header); on a host with two
// devices of their own addresses, QP 1 at each address is that device's
// GSI QP and no other's.
func TestGSINetwork(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 31))
	addrA := netip.AddrFrom4([4]byte{127, byte(1 + rng.IntN(250)), byte(rng.IntN(256)), byte(1 + rng.IntN(240))})
	addrB1, addrB2 := addrA.Next(), addrA.Next().Next()
	gidA, gidB1, gidB2 := udp.GID(addrA), udp.GID(addrB1), udp.GID(addrB2)
	listen := func(addrs ...netip.Addr) *hostnet.Network {
		n, err := hostnet.New(udp.Config{RecoverIPv4ID: true}, 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		for _, a := range addrs {
			if _, err := n.Listen(a); err != nil {
				t.Skipf("RoCE endpoint on %v: %v", a, err)
			}
		}
		return n
	}
	na, nb := listen(addrA), listen(addrB1, addrB2)
	fa, fb := NewFabric(), NewFabric()
	fa.SetNetwork(na, [][16]byte{gidA})
	fb.SetNetwork(nb, nil)
	a := newGSINode(t, fa, 1, nil)
	b1 := newGSINode(t, fb, 2, [][16]byte{gidB1})
	b2 := newGSINode(t, fb, 3, [][16]byte{gidB2})
	pollAll(t, a, b1, b2)

	data := pattern(200, 4)
	a.g.mrWrite(t, a.mr, mrIOVA, data)
	for i, to := range []struct {
		gid       [16]byte
		dst, idle *gsiNode
	}{{gidB1, b1, b2}, {gidB2, b2, b1}} {
		wrID := uint64(i + 1)
		postRecvOn(t, to.dst.g, to.dst.gsi, wrID, []abi.SGE{to.dst.sge(0, 40+200)})
		postRecvOn(t, to.idle.g, to.idle.gsi, 99, []abi.SGE{to.idle.sge(0, 40+200)})
		postSendAV(t, a.g, a.gsi, abi.SendWQE{WRID: wrID, Opcode: abi.WROpSend, RemoteQPN: abi.GSIQPN, RemoteQKey: abi.QKeyUseQP},
			abi.AV{DGID: to.gid, SGIDIndex: 1}, []abi.SGE{a.sge(0, 200)}, nil)
		want1(t, "send", a.waitCQEs(t, a.scq, 1), abi.CQE{WRID: wrID, Status: abi.WCSuccess, Opcode: abi.WCOpSend, QPNum: a.gsi.Num, ByteLen: 200})
		want1(t, "receive", to.dst.waitCQEs(t, to.dst.rcq, 1), abi.CQE{WRID: wrID, Status: abi.WCSuccess, Opcode: abi.WCOpRecv,
			WCFlags: abi.WCFlagGRH, QPNum: to.dst.gsi.Num, ByteLen: 40 + 200, SrcQP: abi.GSIQPN})
		grh := to.dst.g.mrRead(t, to.dst.mr, mrIOVA, 40)
		if src, dst := grh[32:36], grh[36:40]; string(src) != string(gidA[12:]) || string(dst) != string(to.gid[12:]) {
			t.Fatalf("GRH addresses % x → % x, want %v → %v", src, dst, addrA, netip.AddrFrom16(to.gid).Unmap())
		}
		// The other device's GSI QP got nothing (its receive still posted).
		time.Sleep(20 * time.Millisecond)
		if got := to.idle.cqes(t, to.idle.rcq); len(got) != 0 {
			t.Fatalf("QP 1 at %v reached another device: %+v", netip.AddrFrom16(to.gid).Unmap(), got)
		}
		// Reset the idle receive for the next round.
		if st := to.idle.gsi.Modify(abi.QPAttr{QPN: to.idle.gsi.Num, QPState: abi.QPSReset, AttrMask: abi.QPAttrState}); st != abi.StatusOK {
			t.Fatal(st)
		}
		udReady(t, to.idle.gsi, abi.GSIQKey)
	}

	// A datagram to QP 1 with another Q_Key is dropped, counted.
	before := b1.d.Stats().UDDropped
	postRecvOn(t, b1.g, b1.gsi, 7, []abi.SGE{b1.sge(0, 400)})
	if st := a.gsi.Modify(abi.QPAttr{QPN: a.gsi.Num, QPState: abi.QPSRTS, AttrMask: abi.QPAttrState | abi.QPAttrQKey, QKey: 0x1234}); st != abi.StatusOK {
		t.Fatal(st)
	}
	postSendAV(t, a.g, a.gsi, abi.SendWQE{WRID: 9, Opcode: abi.WROpSend, RemoteQPN: abi.GSIQPN, RemoteQKey: abi.QKeyUseQP},
		abi.AV{DGID: gidB1, SGIDIndex: 1}, []abi.SGE{a.sge(0, 8)}, nil)
	a.waitCQEs(t, a.scq, 1)
	deadline := time.Now().Add(5 * time.Second)
	for b1.d.Stats().UDDropped != before+1 {
		if time.Now().After(deadline) {
			t.Fatalf("GSI datagram with another Q_Key: dropped %d, want %d", b1.d.Stats().UDDropped, before+1)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

type nopHost struct{ n int }

func (h *nopHost) Receive(*ud.Arrival) { h.n++ }

// TestGSIAttachShared: QP 1 at a host address devices share belongs to
// the first GSI QP attached there; a later one is attached only at its
// addresses where QP 1 is free (so it neither receives nor sends at the
// shared one), and fails where none is; other QP numbers in use still fail.
func TestGSIAttachShared(t *testing.T) {
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 37))
	shared := netip.AddrFrom4([4]byte{127, byte(1 + rng.IntN(250)), byte(rng.IntN(256)), byte(1 + rng.IntN(240))})
	own := shared.Next()
	n, err := hostnet.New(udp.Config{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	for _, a := range []netip.Addr{shared, own} {
		if _, err := n.Listen(a); err != nil {
			t.Skipf("RoCE endpoint on %v: %v", a, err)
		}
	}
	gs, gown := udp.GID(shared), udp.GID(own)
	h1, h2, h3 := &nopHost{}, &nopHost{}, &nopHost{}
	c1, err := n.OpenUD(abi.GSIQPN, [][16]byte{gs}, h1)
	if err != nil {
		t.Fatalf("first GSI QP: %v", err)
	}
	defer c1.Close()
	if _, err := n.OpenUD(abi.GSIQPN, [][16]byte{gs}, h2); !errors.Is(err, udp.ErrQPN) {
		t.Fatalf("second GSI QP at the shared address only: got %v, want ErrQPN", err)
	}
	c2, err := n.OpenUD(abi.GSIQPN, [][16]byte{gs, gown}, h2)
	if err != nil {
		t.Fatalf("second GSI QP with an address of its own: %v", err)
	}
	if err := c2.Send(gs, udp.GID(own.Next()), &ud.Datagram{SrcQPN: 1, DestQPN: 1}); !errors.Is(err, hostnet.ErrNoEndpoint) {
		t.Fatalf("send from the address QP 1 is another's at: got %v, want ErrNoEndpoint", err)
	}
	c2.Close()
	// Closing the second leaves the first's registration.
	if _, err := n.OpenUD(abi.GSIQPN, [][16]byte{gs}, h3); !errors.Is(err, udp.ErrQPN) {
		t.Fatalf("after the second closed: got %v, want ErrQPN (the first holds it)", err)
	}
	c4, err := n.OpenUD(0x123456, [][16]byte{gs, gown}, h1)
	if err != nil {
		t.Fatal(err)
	}
	defer c4.Close()
	if _, err := n.OpenUD(0x123456, [][16]byte{gs, gown}, h2); !errors.Is(err, udp.ErrQPN) {
		t.Fatalf("a UD QP number in use: got %v, want ErrQPN", err)
	}
}
