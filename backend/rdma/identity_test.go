package rdma

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The same-host migration tests: device a (the source) and device b (its
// peer, "C" in docs/state.md) on one fabric; a's destination is a second
// device of a's UUID on the same fabric, created incoming, on a new
// mapping of a's guest memory.

// incomingFor creates the destination of g's device on its fabric: an
// incoming device of the same UUID.
func incomingFor(t *testing.T, s *handoverSetup) *Device {
	t.Helper()
	cfg := s.cfgA
	cfg.ID, cfg.Incoming = "a-dst", true
	d := s.a.attachDev(cfg, mapMemory(t, s.a.file))
	if got := d.Migration(); got != MigrationIncoming {
		t.Fatalf("a new incoming device's migration: got %q, want %q", got, MigrationIncoming)
	}
	if g := d.GIDs(); len(g) != 0 {
		t.Fatalf("an incoming device holds GIDs before a load: %+v", g)
	}
	return d
}

// saveSuspended suspends g's device as QEMU's stop does (its session calls
// Suspend(true) when the last ring stops) and saves its state.
func saveSuspended(t *testing.T, d *Device) []byte {
	t.Helper()
	d.Suspend(true)
	var b bytes.Buffer
	must(t, d.SaveState(&b))
	return b.Bytes()
}

// TestSameHostMigration: a and its destination share one fabric. While a
// is suspended, b's RDMA WRITE into a is held (a's memory unchanged, no
// completion, no retry consumed) and b's UD datagram to a is dropped;
// the load into the destination moves a's GIDs and QP numbers to it, the
// held WRITE then lands through the destination (a's engine detached:
// it cannot be a's), the traffic goes on both ways with the same QP
// numbers and keys, and a's teardown flushes nothing of b's.
func TestSameHostMigration(t *testing.T) {
	s := newHandoverSetup(t)
	a, b := s.a, s.b
	// Traffic before: a SEND a→b.
	must(t, s.srq.PostRecv(verbs.RecvWR{WRID: 100, SGL: []abi.SGE{s.mrb.SGE(4096, 64)}}))
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(0, 64)}}))
	pump(t, a.dev, b.dev)
	pollN(t, s.sa, 1)
	pollN(t, s.rb, 1)
	before, err := s.qa.Query()
	must(t, err)

	doc := saveSuspended(t, a.dev)
	// b writes into a while a is suspended: held.
	const off = 16384
	copy(s.mrb.Bytes()[0:64], bytes.Repeat([]byte{0xd4}, 64))
	must(t, s.qb.PostSend(verbs.SendWR{WRID: 7, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mrb.SGE(0, 64)}, RemoteAddr: s.mra.Addr + off, RKey: s.mra.RKey}))
	// And sends a datagram to a's UD QP: dropped.
	pb := s.pb
	ga, err := a.ctx.QueryGID()
	must(t, err)
	ahToA, err := pb.CreateAH(verbs.AHAttr{DGID: ga})
	must(t, err)
	must(t, s.ua.PostRecv(verbs.RecvWR{WRID: 300, SGL: []abi.SGE{s.mra.SGE(32768, 256)}}))
	must(t, s.ub.PostSend(verbs.SendWR{WRID: 8, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mrb.SGE(0, 64)}, AH: ahToA, RemoteQPN: s.ua.Num(), RemoteQKey: 0x1234}))
	pump(t, b.dev)
	if wc := pollN(t, s.sb, 1); wc[0].WRID != 8 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("the UD send to the suspended device: %+v (want it sent and dropped)", wc)
	}
	if n := a.dev.Stats().Engine.UDDropped; n != 1 {
		t.Fatalf("datagrams dropped by the suspended device: got %d, want 1", n)
	}
	if !bytes.Equal(s.mra.Bytes()[off:off+64], make([]byte, 64)) {
		t.Fatal("b's WRITE landed in the suspended device's memory")
	}
	if n := b.dev.Stats().Engine.FenceHeld; n == 0 {
		t.Fatal("b's WRITE was not counted as held by the fence")
	}
	attrB, err := s.qb.Query()
	must(t, err)
	if attrB.QPState != abi.QPSRTS {
		t.Fatalf("b's QP while its peer is suspended: state %d, want RTS", attrB.QPState)
	}

	// The destination takes the state and the identity.
	dst := incomingFor(t, s)
	must(t, dst.LoadState(bytes.NewReader(doc)))
	if got := a.dev.Migration(); got != MigrationOut {
		t.Fatalf("the source's migration: got %q, want %q", got, MigrationOut)
	}
	if got := dst.Migration(); got != MigrationIn {
		t.Fatalf("the destination's migration: got %q, want %q", got, MigrationIn)
	}
	if g := a.dev.GIDs(); len(g) != 0 {
		t.Fatalf("the source still holds GIDs: %+v", g)
	}
	if g := dst.GIDs(); len(g) == 0 || g[0].GID != dst.ConfigSpace().PortGID {
		t.Fatalf("the destination's GID table: %+v", g)
	}
	// The source's front-end goes (QEMU quits): its reset and detach
	// leave b alone, and its engine can place nothing any more.
	a.dev.Reset()
	a.dev.Detach()
	a.tr.mu.Lock()
	a.tr.dev = dst
	a.tr.mu.Unlock()

	pump(t, dst, b.dev)
	if wc := pollN(t, s.sb, 1); wc[0].WRID != 7 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("the held WRITE after the handoff: %+v", wc)
	}
	if !bytes.Equal(s.mra.Bytes()[off:off+64], bytes.Repeat([]byte{0xd4}, 64)) {
		t.Fatal("the held WRITE did not land in the destination's memory")
	}
	after, err := s.qa.Query()
	must(t, err)
	if after != before {
		t.Fatalf("a's QP on the destination: got %+v, want %+v", after, before)
	}
	// Both ways on, with the same numbers and keys.
	must(t, s.srq.PostRecv(verbs.RecvWR{WRID: 101, SGL: []abi.SGE{s.mrb.SGE(8192, 64)}}))
	copy(s.mra.Bytes()[64:128], bytes.Repeat([]byte{0xe5}, 64))
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 2, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(64, 64)}}))
	must(t, s.qb.PostSend(verbs.SendWR{WRID: 9, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mrb.SGE(0, 64)}, RemoteAddr: s.mra.Addr + off + 64, RKey: s.mra.RKey}))
	pump(t, dst, b.dev)
	if wc := pollN(t, s.sa, 1); wc[0].WRID != 2 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("a's SEND from the destination: %+v", wc)
	}
	if wc := pollN(t, s.rb, 1); wc[0].WRID != 101 || !bytes.Equal(s.mrb.Bytes()[8192:8256], bytes.Repeat([]byte{0xe5}, 64)) {
		t.Fatalf("its receive: %+v", wc)
	}
	if wc := pollN(t, s.sb, 1); wc[0].WRID != 9 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("b's second WRITE: %+v", wc)
	}
	if ev := b.eventList(); len(ev) != 0 {
		t.Fatalf("b's events (the source's teardown must not flush b): %+v", ev)
	}
	attrB, err = s.qb.Query()
	must(t, err)
	if attrB.QPState != abi.QPSRTS {
		t.Fatalf("b's QP after the source's teardown: state %d, want RTS", attrB.QPState)
	}
}

// TestSameHostMigrationLoadFails: a load that fails after the identity
// moved (a hostile state: its last QP's page list is bad, so objects were
// built and torn down) gives everything back: the source holds its GIDs
// and QP numbers and is not migrated out, the destination holds nothing
// and stays incoming; when the source's rings start again, b's held WRITE
// lands in it.
func TestSameHostMigrationLoadFails(t *testing.T) {
	s := newHandoverSetup(t)
	a, b := s.a, s.b
	doc := saveSuspended(t, a.dev)
	gidsBefore := a.dev.GIDs()
	var m MigrationState
	must(t, json.Unmarshal(doc, &m))
	qps := m.Device.QPs
	qps[len(qps)-1].Pages[0] = 1 // not page-aligned
	bad, err := json.Marshal(&m)
	must(t, err)

	const off = 20480
	copy(s.mrb.Bytes()[0:64], bytes.Repeat([]byte{0xa7}, 64))
	must(t, s.qb.PostSend(verbs.SendWR{WRID: 5, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mrb.SGE(0, 64)}, RemoteAddr: s.mra.Addr + off, RKey: s.mra.RKey}))
	pump(t, b.dev)

	dst := incomingFor(t, s)
	if err := dst.LoadState(bytes.NewReader(bad)); !errors.Is(err, ErrInvalidState) {
		t.Fatalf("the hostile load: got %v, want ErrInvalidState", err)
	}
	if got := a.dev.Migration(); got != "" {
		t.Fatalf("the source after a failed load: migration %q, want none", got)
	}
	if got := dst.Migration(); got != MigrationIncoming {
		t.Fatalf("the destination after a failed load: migration %q, want %q", got, MigrationIncoming)
	}
	if g := a.dev.GIDs(); len(g) != len(gidsBefore) || g[0] != gidsBefore[0] {
		t.Fatalf("the source's GIDs after a failed load: got %+v, want %+v", g, gidsBefore)
	}
	if g := dst.GIDs(); len(g) != 0 {
		t.Fatalf("the destination holds GIDs after a failed load: %+v", g)
	}
	if st := dst.Stats(); st.QPs+st.MRs+st.CQs+st.PDs != 0 || st.Pin.PinnedBytes != 0 {
		t.Fatalf("the destination holds objects after a failed load: %+v", st)
	}
	for _, q := range qps {
		if a.dev.cfg.Fabric.QPNOwner(q.Num) != a.dev.eng {
			t.Fatalf("QP number %#x is not the source's after a failed load", q.Num)
		}
	}
	if !bytes.Equal(s.mra.Bytes()[off:off+64], make([]byte, 64)) {
		t.Fatal("b's WRITE landed while the source is suspended")
	}
	// The migration is cancelled: the source's rings start again.
	a.dev.Suspend(false)
	pump(t, a.dev, b.dev)
	if wc := pollN(t, s.sb, 1); wc[0].WRID != 5 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("the held WRITE once the source resumed: %+v", wc)
	}
	if !bytes.Equal(s.mra.Bytes()[off:off+64], bytes.Repeat([]byte{0xa7}, 64)) {
		t.Fatal("the held WRITE did not land in the resumed source")
	}
	// The good document still loads.
	a.dev.Suspend(true)
	must(t, dst.LoadState(bytes.NewReader(doc)))
}

// TestIncomingWithoutState: an incoming device whose driver starts it
// without a migration state while the source holds its identity takes
// nothing (its control queue refuses: ErrIdentityHeld); once the source
// is gone it takes the identity and serves. A running source is never
// handed off, and a migrated-out device whose rings start again owes its
// driver DEVICE_FATAL.
func TestIncomingWithoutState(t *testing.T) {
	s := newHandoverSetup(t)
	dst := incomingFor(t, s)
	dst.Suspend(false) // its rings start
	if err := dst.serving(); !errors.Is(err, ErrIdentityHeld) {
		t.Fatalf("commands on an incoming device whose source runs: got %v, want ErrIdentityHeld", err)
	}
	if g := dst.GIDs(); len(g) != 0 || dst.Migration() != MigrationIncoming {
		t.Fatalf("the refused incoming device: GIDs %+v, migration %q", g, dst.Migration())
	}
	// A load while the source runs (not suspended) is refused too.
	var b bytes.Buffer
	must(t, s.a.dev.SaveState(&b))
	if err := dst.LoadState(bytes.NewReader(b.Bytes())); err == nil {
		t.Fatal("a load took the identity of a running source")
	}
	if s.a.dev.Migration() != "" || len(s.a.dev.GIDs()) == 0 {
		t.Fatal("a refused load changed the source")
	}

	// A second destination, loaded; then the source's rings start again.
	doc := saveSuspended(t, s.a.dev)
	must(t, dst.LoadState(bytes.NewReader(doc)))
	s.a.dev.Suspend(false)
	if !s.a.dev.fatalPending.Load() {
		t.Fatal("a migrated-out device restarted without DEVICE_FATAL pending")
	}
	if err := s.a.dev.serving(); !errors.Is(err, ErrMigratedOut) {
		t.Fatalf("commands on a migrated-out device: got %v, want ErrMigratedOut", err)
	}
	if !s.a.dev.eng.Fenced() {
		t.Fatal("a migrated-out device is not fenced after its rings started")
	}

	// An incoming device with nobody holding its identity serves.
	f2 := s.cfgB
	f2.ID, f2.Incoming = "b-dst", true
	other := s.b.attachDev(f2, mapMemory(t, s.b.file))
	s.b.dev.Close() // b's device leaves the fabric: its identity is free
	must(t, other.serving())
	if other.Migration() != "" || len(other.GIDs()) == 0 || other.eng.Fenced() {
		t.Fatalf("an incoming device whose identity was free: migration %q, GIDs %+v, fenced %v",
			other.Migration(), other.GIDs(), other.eng.Fenced())
	}
}
