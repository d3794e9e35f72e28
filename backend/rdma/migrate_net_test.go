package rdma

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// logDirty gives d's guest memory a dirty log, as QEMU's SET_LOG_BASE
// does when a migration starts, and returns it.
func logDirty(t *testing.T, d *Device) *memmap.DirtyLog {
	t.Helper()
	size := uint64(handGuestSize / 4096 / 8)
	fd, err := memmap.NewMemfd("log", size)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	l, err := memmap.MapDirtyLog(fd, size, 0)
	if err != nil {
		t.Fatal(err)
	}
	d.memory.SetLog(l)
	return l
}

// TestNetworkDirtyLog: while QEMU migrates, every guest page the network
// transport writes is in the dirty log (engine/dirty.go): a WRITE's and a
// SEND's data and the receive's CQE on the responder, a READ response's
// data and an atomic's original value on the requester, the atomic's
// target on the responder. A page that changed and is not marked would
// reach the destination stale. Pages are compared before and after.
func TestNetworkDirtyLog(t *testing.T) {
	s := newNetSetup(t, 0)
	devs := func() []*Device { return []*Device{s.a.dev, s.b.dev} }
	logs := map[*guestOf]*memmap.DirtyLog{s.a: logDirty(t, s.a.dev), s.b: logDirty(t, s.b.dev)}
	before := map[*guestOf][]byte{s.a: bytes.Clone(s.a.tr.view), s.b: bytes.Clone(s.b.tr.view)}
	for i := range 3 * netMsg {
		s.mra.Bytes()[i] = byte(i*3 + 1)
	}
	// The driver's own writes (the source data above, its WQEs and
	// doorbells) are QEMU's to see: snapshot after them, per operation.
	snap := func() {
		before[s.a], before[s.b] = bytes.Clone(s.a.tr.view), bytes.Clone(s.b.tr.view)
	}
	check := func(what string) {
		t.Helper()
		for g, name := range map[*guestOf]string{s.a: "a", s.b: "b"} {
			now := g.tr.view
			for p := 0; p < len(now); p += 4096 {
				if !bytes.Equal(now[p:p+4096], before[g][p:p+4096]) && !logs[g].Test(abi.GPA(p)) {
					var offs []int
					for i := p; i < p+4096; i++ {
						if now[i] != before[g][i] {
							offs = append(offs, i-p)
						}
					}
					t.Errorf("%s: %s's page %#x changed and is not in the dirty log (bytes %v)", what, name, p, offs)
				}
			}
		}
	}
	// wait runs the engines until the device wrote n more CQEs into cq
	// (its view, not a poll through verbs: that stores the driver's ci,
	// a write QEMU sees as the guest's, not the device's).
	written := func(g *guestOf, cq *verbs.CQ) uint64 {
		for _, v := range g.dev.eng.CQViews(0, 64) {
			if v.CQN == cq.Num() {
				return v.Written
			}
		}
		return 0
	}
	wait := func(g *guestOf, cq *verbs.CQ, want uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for written(g, cq) < want {
			poke(s.a.dev, s.b.dev)
			if time.Now().After(deadline) {
				t.Fatalf("%d CQEs, want %d: %+v", written(g, cq), want, g.dev.eng.CQViews(0, 64))
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	// Posting runs nothing (the engines run in poke): the snapshot
	// after it holds the driver's writes.
	must(t, s.qb.PostRecv(verbs.RecvWR{WRID: 1, SGL: []abi.SGE{s.mrb.SGE(256<<10, netMsg)}}))
	wa, wb := written(s.a, s.sa), written(s.b, s.rb)
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 2, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(0, netMsg)}, RemoteAddr: s.mrb.Addr + 128<<10, RKey: s.mrb.RKey}))
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 3, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(netMsg, netMsg)}}))
	snap()
	wait(s.a, s.sa, wa+2)
	wait(s.b, s.rb, wb+1)
	check("WRITE and SEND")
	collect(t, s.sa, 2, devs)
	collect(t, s.rb, 1, devs)
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 4, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(512<<10, netMsg)}, RemoteAddr: s.mrb.Addr + 128<<10, RKey: s.mrb.RKey}))
	wa = written(s.a, s.sa)
	snap()
	wait(s.a, s.sa, wa+1)
	check("READ")
	collect(t, s.sa, 1, devs)
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 5, Opcode: abi.WROpAtomicFetchAdd, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(768<<10, 8)}, RemoteAddr: s.mrb.Addr + 900<<10, RKey: s.mrb.RKey, CompareAdd: 5}))
	wa = written(s.a, s.sa)
	snap()
	wait(s.a, s.sa, wa+1)
	check("atomic")
	collect(t, s.sa, 1, devs)
	if !bytes.Equal(s.mra.Bytes()[512<<10:512<<10+netMsg], s.mra.Bytes()[:netMsg]) {
		t.Fatal("the READ brought other bytes")
	}
}

// TestMigrateNetwork: a live migration of a device whose RC QP is
// connected over RoCEv2 to a device on another host (issue 29, --across).
// a streams WRITEs and SENDs to b with b short of receives, so that a's
// transport holds work (a SEND retried on RNR NAKs, the messages after
// it) when a's VM stops. A pause (no dirty log) leaves the QP running and
// the save refuses it; a migration's stop (dirty log on) holds it: b's
// WRITE into a, posted then, is not taken. The state is saved, the
// source host's network goes (the address leaves it) and a device of a
// third fabric listening on the same address loads the state, the
// connection restored frozen until the destination's rings start. Then
// every message arrives once and in order, b's WRITE lands (its
// retransmissions covered the blackout), new work runs both ways, and
// neither guest sees an event.
func TestMigrateNetwork(t *testing.T) {
	s := newNetSetup(t, 0)
	a, b := s.a, s.b
	cur := []*Device{a.dev, b.dev}
	devs := func() []*Device { return cur }
	src, stall := s.startStalled(t, devs)

	// A pause: the network QP runs on, and cannot be saved.
	a.dev.Suspend(true)
	var doc bytes.Buffer
	if err := a.dev.SaveState(&doc); err == nil || !strings.Contains(err.Error(), "not frozen") {
		t.Fatalf("SaveState of a paused device with a network QP: got %v, want a refusal", err)
	}
	a.dev.Suspend(false)

	// The migration's stop: QEMU logs dirty pages, then stops the VM.
	logDirty(t, a.dev)
	a.dev.Suspend(true)
	copy(s.mrb.Bytes()[1000<<10:1000<<10+64], bytes.Repeat([]byte{0xe7}, 64))
	must(t, s.qb.PostSend(verbs.SendWR{WRID: 800, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mrb.SGE(1000<<10, 64)}, RemoteAddr: s.mra.Addr + 960<<10, RKey: s.mra.RKey}))
	poke(b.dev)
	time.Sleep(30 * time.Millisecond) // b sends; the held QP drops it
	if bytes.Equal(s.mra.Bytes()[960<<10:960<<10+64], bytes.Repeat([]byte{0xe7}, 64)) {
		t.Fatal("a WRITE reached the held source's memory")
	}
	doc.Reset()
	must(t, a.dev.SaveState(&doc))
	st, err := DecodeMigrationState(bytes.NewReader(doc.Bytes()))
	must(t, err)
	var ns *engine.NetQPState
	for _, q := range st.QPs {
		if q.Num == s.qa.Num() {
			ns = q.State.Net
		}
	}
	if ns == nil || ns.Conn == nil || !ns.Conn.Frozen || len(ns.Sends) != netMsgs-stall {
		t.Fatalf("QP %d saved without its frozen connection and %d sends: %+v", s.qa.Num(), netMsgs-stall, ns)
	}

	// The source's front-end quits (its objects go, completing
	// nothing: this test's source and destination share the memory
	// file), the address moves: the source host's network goes, a third
	// host listens on it.
	a.dev.Detach()
	s.ha.n.Close()
	hc := newNetHost(t, s.ha.addr, true)
	cfg := s.cfgA
	cfg.Fabric, cfg.Incoming = hc.f, true
	d := a.attachDev(cfg, mapMemory(t, a.file))
	must(t, d.LoadState(bytes.NewReader(doc.Bytes())))
	a.tr.mu.Lock()
	a.tr.dev = d
	a.tr.mu.Unlock()
	cur = []*Device{d, b.dev}
	time.Sleep(20 * time.Millisecond)
	for _, e := range hc.n.Endpoints() {
		if c := e.Counters(); c.TxDatagrams != 0 {
			t.Fatalf("the destination sent %d datagrams before its rings started", c.TxDatagrams)
		}
	}
	d.Suspend(false) // the destination's first ring start

	s.finishStalled(t, src, stall, devs)
	if w := collect(t, s.sb, 1, devs)[0]; w.WRID != 800 || w.Status != abi.WCSuccess ||
		!bytes.Equal(s.mra.Bytes()[960<<10:960<<10+64], bytes.Repeat([]byte{0xe7}, 64)) {
		t.Fatalf("b's WRITE across the blackout: %+v", w)
	}
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 500, Opcode: abi.WROpRDMARead, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(768<<10, netMsg)}, RemoteAddr: s.mrb.Addr, RKey: s.mrb.RKey}))
	if w := collect(t, s.sa, 1, devs)[0]; w.WRID != 500 || w.Status != abi.WCSuccess ||
		!bytes.Equal(s.mra.Bytes()[768<<10:768<<10+netMsg], src[:netMsg]) {
		t.Fatalf("READ after the migration: %+v", w)
	}
	if ev := append(a.eventList(), b.eventList()...); len(ev) != 0 {
		t.Fatalf("events: %+v", ev)
	}
	if got := d.Migration(); got != MigrationIn {
		t.Fatalf("the destination's migration state: %q, want %q", got, MigrationIn)
	}
}

// TestMigrateNetworkOneDaemon: a migration between two devices of one
// vrdmad does not carry a network QP (the source holds its connection
// until its front-end goes): the load is refused, the source resumes.
func TestMigrateNetworkOneDaemon(t *testing.T) {
	s := newNetSetup(t, 0)
	logDirty(t, s.a.dev)
	s.a.dev.Suspend(true)
	var doc bytes.Buffer
	must(t, s.a.dev.SaveState(&doc))
	cfg := s.cfgA
	cfg.ID, cfg.Incoming = "a-dst", true
	d := s.a.attachDev(cfg, mapMemory(t, s.a.file))
	if err := d.LoadState(bytes.NewReader(doc.Bytes())); !errors.Is(err, ErrNotTransferable) {
		t.Fatalf("LoadState on the source's vrdmad: got %v, want ErrNotTransferable", err)
	}
	s.a.dev.Suspend(false)
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(0, 64)}, RemoteAddr: s.mrb.Addr, RKey: s.mrb.RKey}))
	devs := func() []*Device { return []*Device{s.a.dev, s.b.dev} }
	if w := collect(t, s.sa, 1, devs)[0]; w.Status != abi.WCSuccess {
		t.Fatalf("a WRITE after the refused load: %+v", w)
	}
}
