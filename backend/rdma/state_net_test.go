package rdma

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The live-upgrade tests of QPs connected over the network: two devices on
// two fabrics ("hosts"), each with a RoCEv2 network (package hostnet) on a
// loopback address of its own, an RC QP pair between them. Device a is
// handed over to a third fabric whose network adopted a's sockets, as the
// new vrdmad does (hostnet Freeze, Adopt, Restore, Thaw).

// netHost is one host of these tests: a fabric with a network.
type netHost struct {
	f    *engine.Fabric
	n    *hostnet.Network
	addr netip.Addr
}

func newNetHost(t *testing.T, addr netip.Addr, listen bool) *netHost {
	t.Helper()
	n, err := hostnet.New(udp.Config{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if listen {
		if _, err := n.Listen(addr); err != nil {
			t.Skipf("cannot listen on %v: %v", addr, err)
		}
	}
	h := &netHost{f: engine.NewFabric(), n: n, addr: addr}
	h.f.SetNetwork(n, [][16]byte{udp.GID(addr)})
	return h
}

// netSetup is the objects of the network handover tests.
type netSetup struct {
	ha, hb     *netHost
	a, b       *guestOf
	cfgA       Config
	sa, ra, sb *verbs.CQ
	rb         *verbs.CQ
	qa, qb     *verbs.QP
	mra, mrb   *verbs.MR
}

const (
	netMsg  = 8 << 10 // 8 packets at MTU 1024
	netMsgs = 24      // a→b: WRITE, SEND, WRITE, SEND …
)

func newNetSetup(t *testing.T, paths uint32) *netSetup {
	t.Helper()
	s := &netSetup{
		ha: newNetHost(t, netip.MustParseAddr("127.77.29.1"), true),
		hb: newNetHost(t, netip.MustParseAddr("127.77.29.2"), true),
	}
	s.cfgA = handConfig("a", uuid.New(), s.ha.f)
	s.cfgA.Limits.MaxQPWR = 32
	cfgB := handConfig("b", uuid.New(), s.hb.f)
	cfgB.Limits.MaxQPWR = 32
	s.a, s.b = newGuest(t, s.cfgA), newGuest(t, cfgB)
	pa, err := s.a.ctx.AllocPD()
	must(t, err)
	pb, err := s.b.ctx.AllocPD()
	must(t, err)
	ba, err := s.a.ctx.AllocBuffer(1 << 20)
	must(t, err)
	bb, err := s.b.ctx.AllocBuffer(1 << 20)
	must(t, err)
	all := abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead
	s.mra, err = pa.RegMR(ba, 0, 1<<20, all)
	must(t, err)
	s.mrb, err = pb.RegMR(bb, 0, 1<<20, all)
	must(t, err)
	for _, c := range []struct {
		ctx *verbs.Context
		cq  **verbs.CQ
	}{{s.a.ctx, &s.sa}, {s.a.ctx, &s.ra}, {s.b.ctx, &s.sb}, {s.b.ctx, &s.rb}} {
		*c.cq, err = c.ctx.CreateCQ(128)
		must(t, err)
	}
	qcap := verbs.QPCap{MaxSendWR: 32, MaxRecvWR: 32, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}
	s.qa, err = pa.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeRC, SendCQ: s.sa, RecvCQ: s.ra, Cap: qcap})
	must(t, err)
	s.qb, err = pb.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeRC, SendCQ: s.sb, RecvCQ: s.rb, Cap: qcap})
	must(t, err)
	// Entry 1 of each GID table is its host's address.
	ga, err := s.a.ctx.QueryGIDAt(1)
	must(t, err)
	gb, err := s.b.ctx.QueryGIDAt(1)
	must(t, err)
	if ga != udp.GID(s.ha.addr) || gb != udp.GID(s.hb.addr) {
		t.Fatalf("network GIDs %x, %x", ga, gb)
	}
	opts := verbs.ConnectOpts{SGIDIndex: 1, PathMTU: abi.MTU1024, Paths: paths}
	must(t, s.qa.ConnectRCOpts(gb, s.qb.Num(), s.qb.PSN(), all, opts))
	must(t, s.qb.ConnectRCOpts(ga, s.qa.Num(), s.qa.PSN(), all, opts))
	return s
}

// poke runs one engine pass on every doorbell queue of devs (the
// transports run by themselves).
func poke(devs ...*Device) {
	for _, d := range devs {
		tbl := d.memory.Acquire()
		for dbq := range d.cfg.DoorbellQueues {
			_, _ = d.eng.Poll(dbq, tbl)
		}
		tbl.Release()
	}
}

// collect polls cq, running devs' engines, until it has n completions
// (bounded by 20 s), and fails on more.
func collect(t *testing.T, cq *verbs.CQ, n int, devs func() []*Device) []verbs.WC {
	t.Helper()
	var got []verbs.WC
	wc := make([]verbs.WC, 64)
	deadline := time.Now().Add(20 * time.Second)
	for len(got) < n {
		poke(devs()...)
		k, err := cq.Poll(wc)
		must(t, err)
		got = append(got, wc[:k]...)
		if time.Now().After(deadline) {
			t.Fatalf("got %d completions, want %d: %+v", len(got), n, got)
		}
		if k == 0 {
			time.Sleep(200 * time.Microsecond)
		}
	}
	if len(got) > n {
		t.Fatalf("got %d completions, want %d: %+v", len(got), n, got)
	}
	return got
}

// Receives b posts before a's stream stalls (startStalled), and where
// b's receive i lands.
const early = 4

func recvAt(i int) int { return 512<<10 + i*netMsg }

// startStalled fills a's MR with a pattern, src (netMsgs × netMsg
// bytes), and streams it to b: WRITE, SEND, WRITE, … of two SGEs each, b
// holding early receives, so that a stalls at SEND number early (WQE
// 2*early+1, returned as stall): b has no receive, the SEND is NAKed and
// retried, the messages after it are posted to the transport.
func (s *netSetup) startStalled(t *testing.T, devs func() []*Device) (src []byte, stall int) {
	t.Helper()
	src = make([]byte, netMsgs*netMsg)
	for i := range src {
		src[i] = byte(i*7 + i>>13)
	}
	copy(s.mra.Bytes(), src)
	for i := range early {
		must(t, s.qb.PostRecv(verbs.RecvWR{WRID: uint64(100 + i), SGL: []abi.SGE{s.mrb.SGE(recvAt(i), netMsg)}}))
	}
	for i := range netMsgs {
		wr := verbs.SendWR{WRID: uint64(i), Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{s.mra.SGE(i*netMsg, netMsg/2), s.mra.SGE(i*netMsg+netMsg/2, netMsg/2)}}
		if i%2 == 0 {
			wr.Opcode, wr.RemoteAddr, wr.RKey = abi.WROpRDMAWrite, s.mrb.Addr+uint64(i/2*netMsg), s.mrb.RKey
		}
		must(t, s.qa.PostSend(wr))
	}
	stall = 2*early + 1
	for i, w := range collect(t, s.sa, stall, devs) {
		if w.WRID != uint64(i) || w.Status != abi.WCSuccess {
			t.Fatalf("completion %d before the stall: %+v", i, w)
		}
	}
	collect(t, s.rb, early, devs)
	time.Sleep(20 * time.Millisecond) // the stalled SEND is NAKed and retried meanwhile
	return src, stall
}

// finishStalled posts b's other receives and checks that a's stream
// (startStalled) completes from the stall on, once and in order, every
// byte of src where it belongs in b.
func (s *netSetup) finishStalled(t *testing.T, src []byte, stall int, devs func() []*Device) {
	t.Helper()
	for i := early; i < netMsgs/2; i++ {
		must(t, s.qb.PostRecv(verbs.RecvWR{WRID: uint64(100 + i), SGL: []abi.SGE{s.mrb.SGE(recvAt(i), netMsg)}}))
	}
	for i, w := range collect(t, s.sa, netMsgs-stall, devs) {
		if w.WRID != uint64(stall+i) || w.Status != abi.WCSuccess || w.ByteLen != netMsg {
			t.Fatalf("completion %d after the stall: %+v", stall+i, w)
		}
	}
	for i, w := range collect(t, s.rb, netMsgs/2-early, devs) {
		if w.WRID != uint64(100+early+i) || w.Status != abi.WCSuccess || w.ByteLen != netMsg {
			t.Fatalf("receive %d after the stall: %+v", early+i, w)
		}
	}
	for i := range netMsgs {
		off := i / 2 * netMsg
		if i%2 == 1 {
			off = recvAt(i / 2)
		}
		if !bytes.Equal(s.mrb.Bytes()[off:off+netMsg], src[i*netMsg:(i+1)*netMsg]) {
			t.Fatalf("message %d: b holds other bytes", i)
		}
	}
}

// TestHandoverNetwork: a stream of WRITEs and SENDs of 8 KiB from a to b
// over RoCEv2, verified byte for byte, with b short of receives so that
// a's requester has work in flight (a SEND retried on RNR NAKs, the
// messages after it posted to the transport) when a is handed over: its
// network frozen, its state exported through JSON, imported on a third
// fabric whose network adopted the sockets, thawed. Every message then
// arrives once and in order, a's PSNs continue from where they stood, b
// sees no error and no event, the QP numbers and attributes are the same,
// and the restored QP carries new work both ways (a READ, b's SENDs).
func TestHandoverNetwork(t *testing.T) {
	s := newNetSetup(t, 0)
	a, b := s.a, s.b
	cur := []*Device{a.dev, b.dev}
	devs := func() []*Device { return cur }
	src, stall := s.startStalled(t, devs)
	before := map[string]abi.QPAttr{}
	for name, qp := range map[string]*verbs.QP{"qa": s.qa, "qb": s.qb} {
		attr, err := qp.Query()
		must(t, err)
		before[name] = attr
	}

	// The old process: freeze the device, then the network, export.
	must(t, a.dev.Quiesce())
	if _, err := a.dev.ExportState(); err == nil || !strings.Contains(err.Error(), "not frozen") {
		t.Fatalf("ExportState with the network running: got %v, want a refusal", err)
	}
	nst, fds, err := s.ha.n.Freeze()
	must(t, err)
	st := exportJSON(t, a.dev)
	var ns *engine.NetQPState
	for _, q := range st.QPs {
		if q.Num == s.qa.Num() {
			ns = q.State.Net
		}
	}
	if ns == nil || ns.Conn == nil {
		t.Fatalf("QP %d exported without its network state", s.qa.Num())
	}
	if n := len(ns.Sends); n != netMsgs-stall || ns.Done != uint64(stall) || ns.Sends[0].WRID != uint64(stall) {
		t.Fatalf("exported sends: %d from %d (%+v), want %d from %d", n, ns.Done, ns.Sends, netMsgs-stall, stall)
	}
	if w := ns.Conn.Requester.WQEs; !w[0].Started || w[0].Local == nil || len(w[0].Local.SGEs) != 2 {
		t.Fatalf("the stalled SEND was exported as %+v, want started, with its two SGEs", w[0])
	}
	// Every PSN of the completed messages was acknowledged: the oldest
	// unacknowledged one is the stalled SEND's first.
	wantPSN := roce.PSN(s.qa.PSN()).Add(uint32(stall * netMsg / 1024))
	if got := roce.PSN(ns.Conn.Requester.UnackedPSN); got != wantPSN {
		t.Fatalf("exported oldest unacknowledged PSN %#x, want %#x", got, wantPSN)
	}

	// The new process: a network adopting the sockets, frozen; a device
	// importing the state; then commit and thaw.
	hc := newNetHost(t, s.ha.addr, false)
	must(t, hc.n.Adopt(nst, fds))
	cfg := s.cfgA
	cfg.Fabric = hc.f
	na := a.takeOver(cfg, st)
	must(t, FinishImport([]*Device{na}))
	a.tr.mu.Lock()
	a.tr.dev = na
	a.tr.mu.Unlock()
	cur = []*Device{na, b.dev}
	hc.n.Thaw()

	for name, qp := range map[string]*verbs.QP{"qa": s.qa, "qb": s.qb} {
		attr, err := qp.Query()
		must(t, err)
		if attr != before[name] {
			t.Errorf("%s attributes after the handover: got %+v, want %+v", name, attr, before[name])
		}
	}
	// b posts the rest of the receives: the stream completes.
	s.finishStalled(t, src, stall, devs)

	// New work both ways: a READs back what it wrote first; b SENDs to a.
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 500, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(768<<10, netMsg)}, RemoteAddr: s.mrb.Addr, RKey: s.mrb.RKey}))
	if w := collect(t, s.sa, 1, devs)[0]; w.WRID != 500 || w.Status != abi.WCSuccess ||
		!bytes.Equal(s.mra.Bytes()[768<<10:768<<10+netMsg], src[:netMsg]) {
		t.Fatalf("READ after the handover: %+v", w)
	}
	must(t, s.qa.PostRecv(verbs.RecvWR{WRID: 600, SGL: []abi.SGE{s.mra.SGE(896<<10, netMsg)}}))
	must(t, s.qb.PostSend(verbs.SendWR{WRID: 700, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mrb.SGE(0, netMsg)}}))
	if w := collect(t, s.sb, 1, devs)[0]; w.WRID != 700 || w.Status != abi.WCSuccess {
		t.Fatalf("b's SEND after the handover: %+v", w)
	}
	if w := collect(t, s.ra, 1, devs)[0]; w.WRID != 600 || w.Status != abi.WCSuccess ||
		!bytes.Equal(s.mra.Bytes()[896<<10:896<<10+netMsg], src[:netMsg]) {
		t.Fatalf("a's receive after the handover: %+v", w)
	}
	if ev := append(a.eventList(), b.eventList()...); len(ev) != 0 {
		t.Fatalf("events: %+v", ev)
	}
}

// TestHandoverNetworkRefused: a refused handover (the new process never
// came) leaves the old one serving: the export read the connection and let
// it go, and once the network thaws the stream goes on.
func TestHandoverNetworkRefused(t *testing.T) {
	s := newNetSetup(t, 0)
	devs := func() []*Device { return []*Device{s.a.dev, s.b.dev} }
	copy(s.mra.Bytes(), bytes.Repeat([]byte{0x3c}, netMsg))
	send := func(id uint64) {
		t.Helper()
		must(t, s.qa.PostSend(verbs.SendWR{WRID: id, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{s.mra.SGE(0, netMsg)}}))
	}
	send(1) // no receive: retried on RNR NAKs
	must(t, s.a.dev.Quiesce())
	_, fds, err := s.ha.n.Freeze()
	must(t, err)
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
	exportJSON(t, s.a.dev)
	s.ha.n.Thaw()
	s.a.dev.Unquiesce()
	must(t, s.qb.PostRecv(verbs.RecvWR{WRID: 1, SGL: []abi.SGE{s.mrb.SGE(0, netMsg)}}))
	must(t, s.qb.PostRecv(verbs.RecvWR{WRID: 2, SGL: []abi.SGE{s.mrb.SGE(netMsg, netMsg)}}))
	send(2)
	if wc := collect(t, s.sa, 2, devs); wc[0].Status != abi.WCSuccess || wc[1].Status != abi.WCSuccess {
		t.Fatalf("sends after a refused handover: %+v", wc)
	}
	collect(t, s.rb, 2, devs)
}

// TestExportStateRefusesSpray: a QP connected by multipath (spray) is not
// handed over: ErrNotTransferable naming the QP.
func TestExportStateRefusesSpray(t *testing.T) {
	s := newNetSetup(t, 4)
	must(t, s.a.dev.Quiesce())
	_, err := s.a.dev.ExportState()
	if !errors.Is(err, ErrNotTransferable) || !strings.Contains(err.Error(), "spray") {
		t.Fatalf("got %v, want ErrNotTransferable naming spray", err)
	}
}

// TestImportStateRejectsNetwork: hostile network states are refused
// (ErrInvalidState) before anything is claimed or registered: the same
// device then takes the valid state, whose remote QP, QP number and
// connection would be taken otherwise.
func TestImportStateRejectsNetwork(t *testing.T) {
	s := newNetSetup(t, 0)
	devs := func() []*Device { return []*Device{s.a.dev, s.b.dev} }
	for i := range 3 {
		must(t, s.qa.PostSend(verbs.SendWR{WRID: uint64(i), Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{s.mra.SGE(i*netMsg, netMsg)}}))
	}
	poke(devs()...)
	time.Sleep(10 * time.Millisecond) // the first SEND is NAKed (RNR) meanwhile
	must(t, s.a.dev.Quiesce())
	nst, fds, err := s.ha.n.Freeze()
	must(t, err)
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	valid := exportJSON(t, s.a.dev)
	qi := -1
	for i := range valid.QPs {
		if valid.QPs[i].State.Net != nil {
			qi = i
		}
	}
	if qi < 0 || len(valid.QPs[qi].State.Net.Sends) != 3 {
		t.Fatalf("exported network state: %+v", valid.QPs)
	}
	// importOn imports st on a device of a new host whose network adopted
	// duplicates of a's sockets.
	importOn := func(t *testing.T, st *DeviceState) (*Device, error) {
		t.Helper()
		dups := make([]int, len(fds))
		for i, fd := range fds {
			if dups[i], err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0); err != nil {
				t.Fatal(err)
			}
		}
		h := newNetHost(t, s.ha.addr, false)
		must(t, h.n.Adopt(nst, dups))
		cfg := s.cfgA
		cfg.Fabric = h.f
		g := &guestOf{t: t}
		d := g.attachDev(cfg, mapMemory(t, s.a.file))
		return d, d.ImportState(st)
	}
	for _, c := range []struct {
		name string
		mod  func(n *engine.NetQPState)
	}{
		{"remote QP", func(n *engine.NetQPState) { n.RemoteQPN ^= 1 }},
		{"remote QP beyond 24 bits", func(n *engine.NetQPState) { n.RemoteQPN |= 1 << 24 }},
		{"remote GID zero", func(n *engine.NetQPState) { n.RemoteGID = [16]byte{} }},
		{"remote GID a device's", func(n *engine.NetQPState) { n.RemoteGID = valid.GIDs[0].GID }}, // its port GID
		{"no connection", func(n *engine.NetQPState) { n.Conn = nil }},
		{"closed with a connection", func(n *engine.NetQPState) { n.Closed = true }},
		{"a send too many", func(n *engine.NetQPState) { n.Sends = append(n.Sends, n.Sends[0]) }},
		{"tail", func(n *engine.NetQPState) { n.Tail++ }},
		{"more sends than the queue", func(n *engine.NetQPState) { n.Done = n.Tail - 40 }},
		{"send opcode", func(n *engine.NetQPState) { n.Sends[0].Opcode = abi.WROpRDMAWrite }},
		{"send opcode unknown", func(n *engine.NetQPState) { n.Sends[0].Opcode = 99 }},
		{"receives", func(n *engine.NetQPState) { n.Recvs = []engine.NetRecvState{{WRID: 1}, {WRID: 2}} }},
		{"receive not in progress", func(n *engine.NetQPState) { n.Recvs = []engine.NetRecvState{{WRID: 1}} }},
		{"connection of another QP", func(n *engine.NetQPState) { n.Conn.QPN ^= 1 }},
		{"connection's queue", func(n *engine.NetQPState) { n.Conn.SQSize = 64 }},
		{"connection's MTU", func(n *engine.NetQPState) { n.Conn.PMTU = 4096 }},
		{"connection not started", func(n *engine.NetQPState) { n.Conn.Started = false }},
		{"PSN beyond 24 bits", func(n *engine.NetQPState) { n.Conn.Requester.UnackedPSN = 1 << 24 }},
		{"work request not a send", func(n *engine.NetQPState) { n.Conn.Requester.WQEs[1].ID += 7 }},
		{"lkey", func(n *engine.NetQPState) { n.Conn.Requester.WQEs[0].Local.SGEs[0].LKey ^= 0xffff00 }},
		{"SGE outside the MR", func(n *engine.NetQPState) { n.Conn.Requester.WQEs[0].Local.SGEs[0].Addr += 1 << 30 }},
		{"no description", func(n *engine.NetQPState) { n.Conn.Requester.WQEs[0].Local = nil }},
		{"local address", func(n *engine.NetQPState) { n.Conn.Local = "127.77.29.9:4791" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			st := cloneState(t, valid)
			c.mod(st.QPs[qi].State.Net)
			d, err := importOn(t, st)
			if !errors.Is(err, ErrInvalidState) {
				t.Fatalf("got %v, want an error wrapping ErrInvalidState", err)
			}
			if s := d.Stats(); s.PDs+s.MRs+s.CQs+s.QPs != 0 || s.Pin.PinnedBytes != 0 {
				t.Fatalf("after a refused import: %+v", s)
			}
			if err := d.ImportState(cloneState(t, valid)); err != nil {
				t.Fatalf("the valid state after a refused one: %v", err)
			}
		})
	}
}

// cloneState returns a deep copy of st.
func cloneState(t *testing.T, st *DeviceState) *DeviceState {
	t.Helper()
	raw, err := json.Marshal(st)
	must(t, err)
	var out DeviceState
	must(t, json.Unmarshal(raw, &out))
	return &out
}
