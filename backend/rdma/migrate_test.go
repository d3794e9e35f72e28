package rdma

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The migration tests: devices save their state (SaveState) and devices
// of another fabric — another daemon, the destination host — with the
// same UUIDs load it (LoadState) on a new mapping of the same guest
// memory, as a migration's destination QEMU gives its back-end the memory
// it copied.

// migrate saves g's device and loads the state into a device with cfg on
// a new mapping of g's memory; the verbs context drives that one after.
func migrate(t *testing.T, g *guestOf, cfg Config) (*Device, []byte) {
	t.Helper()
	return migrateInto(t, g, g.attachDev(cfg, mapMemory(t, g.file)))
}

// migrateInto is migrate into d, a destination device made beforehand
// on a new mapping of g's memory (destinationOf).
func migrateInto(t *testing.T, g *guestOf, d *Device) (*Device, []byte) {
	t.Helper()
	var b bytes.Buffer
	if err := g.dev.SaveState(&b); err != nil {
		t.Fatalf("SaveState: %v", err)
	}
	if err := d.LoadState(bytes.NewReader(b.Bytes())); err != nil {
		t.Fatalf("LoadState: %v", err)
	}
	g.tr.mu.Lock()
	g.tr.dev = d
	g.tr.mu.Unlock()
	return d, b.Bytes()
}

// TestMigrate: two devices with an RC pair, MRs, CQs and an SRQ run work,
// leave some posted and not run, and migrate (both VMs) to devices of
// another fabric, made there beforehand, one after the other: the posted
// work completes there, QP numbers, keys and attributes are the same, and
// new work runs both ways. A device that arrives where its peer has no
// device is refused (TestMigrateAwayFromPeer).
func TestMigrate(t *testing.T) {
	s := newHandoverSetup(t)
	for i := range 4 {
		must(t, s.srq.PostRecv(verbs.RecvWR{WRID: uint64(100 + i), SGL: []abi.SGE{s.mrb.SGE(4096*(i+1), 64)}}))
	}
	send := func(id uint64, off int, fill byte) {
		t.Helper()
		copy(s.mra.Bytes()[off:off+64], bytes.Repeat([]byte{fill}, 64))
		must(t, s.qa.PostSend(verbs.SendWR{WRID: id, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{s.mra.SGE(off, 64)}}))
	}
	send(1, 0, 0xb1)
	pump(t, s.a.dev, s.b.dev)
	pollN(t, s.sa, 1)
	pollN(t, s.rb, 1)
	send(2, 64, 0xb2) // posted, not run: the destination runs it
	before := map[string]abi.QPAttr{}
	for name, qp := range map[string]*verbs.QP{"qa": s.qa, "qb": s.qb} {
		attr, err := qp.Query()
		must(t, err)
		before[name] = attr
	}

	f2 := engine.NewFabric()
	cfgA, cfgB := s.cfgA, s.cfgB
	cfgA.Fabric, cfgB.Fabric = f2, f2
	nb := s.b.attachDev(cfgB, mapMemory(t, s.b.file))
	na, doc := migrate(t, s.a, cfgA)
	migrateInto(t, s.b, nb)
	var head struct {
		Format  string `json:"format"`
		Version int    `json:"version"`
	}
	must(t, json.Unmarshal(doc, &head))
	if head.Format != MigrationFormat || head.Version != MigrationVersion {
		t.Fatalf("document head: got %+v, want %q version %d", head, MigrationFormat, MigrationVersion)
	}
	for name, qp := range map[string]*verbs.QP{"qa": s.qa, "qb": s.qb} {
		attr, err := qp.Query()
		must(t, err)
		if attr != before[name] {
			t.Errorf("%s after the migration: got %+v, want %+v", name, attr, before[name])
		}
	}
	pump(t, na, nb)
	if wc := pollN(t, s.sa, 1); wc[0].WRID != 2 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("the posted SEND after the migration: %+v", wc)
	}
	if wc := pollN(t, s.rb, 1); wc[0].WRID != 101 ||
		!bytes.Equal(s.mrb.Bytes()[8192:8256], bytes.Repeat([]byte{0xb2}, 64)) {
		t.Fatalf("its receive: %+v", wc)
	}
	// b writes into a's MR with the key a had before: the peer resolved
	// on the destination, both ways.
	copy(s.mrb.Bytes()[0:64], bytes.Repeat([]byte{0xc3}, 64))
	must(t, s.qb.PostSend(verbs.SendWR{WRID: 7, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mrb.SGE(0, 64)}, RemoteAddr: s.mra.Addr + 16384, RKey: s.mra.RKey}))
	pump(t, na, nb)
	if wc := pollN(t, s.sb, 1); wc[0].WRID != 7 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("b's WRITE after the migration: %+v", wc)
	}
	if !bytes.Equal(s.mra.Bytes()[16384:16448], bytes.Repeat([]byte{0xc3}, 64)) {
		t.Fatal("b's WRITE did not land in a's MR")
	}
	if ev := append(s.a.eventList(), s.b.eventList()...); len(ev) != 0 {
		t.Fatalf("events: %+v", ev)
	}
}

// TestLoadStateRejects: hostile documents are refused, and the device is
// left with nothing made, pinned or registered.
func TestLoadStateRejects(t *testing.T) {
	s := newHandoverSetup(t)
	var b bytes.Buffer
	must(t, s.b.dev.SaveState(&b))
	valid := b.Bytes()
	var doc map[string]any
	must(t, json.Unmarshal(valid, &doc))
	with := func(k string, v any) []byte {
		m := map[string]any{}
		for kk, vv := range doc {
			m[kk] = vv
		}
		m[k] = v
		out, err := json.Marshal(m)
		must(t, err)
		return out
	}
	st, err := DecodeMigrationState(bytes.NewReader(valid))
	must(t, err)
	var qpns []uint32
	for _, q := range st.QPs {
		qpns = append(qpns, q.Num)
	}
	f2 := engine.NewFabric()
	cfg, cfgA := s.cfgB, s.cfgA
	cfg.Fabric, cfgA.Fabric = f2, f2
	s.a.attachDev(cfgA, mapMemory(t, s.a.file)) // the peer's destination: its QP's dgid resolves
	d := s.b.attachDev(cfg, mapMemory(t, s.b.file))
	for _, c := range []struct {
		name string
		doc  []byte
	}{
		{"empty", nil},
		{"truncated", valid[:len(valid)/2]},
		{"garbage", []byte("\x00\x01not json")},
		{"too big", append(append([]byte(nil), valid...), bytes.Repeat([]byte(" "), MaxMigrationState)...)},
		{"wrong version", with("version", 2)},
		{"version 0", with("version", 0)},
		{"wrong format", with("format", "vrdmad-handover")},
		{"unknown key", with("extra", 1)},
		{"no device", with("device", nil)},
		{"trailing data", append(append([]byte(nil), valid...), []byte(`{}`)...)},
		{"another device", func() []byte {
			var m MigrationState
			must(t, json.Unmarshal(valid, &m))
			m.Device.NodeGUID++
			out, err := json.Marshal(&m)
			must(t, err)
			return out
		}()},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := d.LoadState(bytes.NewReader(c.doc))
			if !errors.Is(err, ErrInvalidState) {
				t.Fatalf("got %v, want an error matching ErrInvalidState", err)
			}
			if c.name == "wrong version" && !strings.Contains(err.Error(), ErrMigrationVersion.Error()) {
				t.Errorf("got %v, want it to say %q", err, ErrMigrationVersion)
			}
			assertEmpty(t, d, qpns)
		})
	}
	// The valid document still loads into the same device.
	must(t, d.LoadState(bytes.NewReader(valid)))
}

// TestSaveStateRefuses: a device holding what cannot migrate refuses the
// save with ErrNotTransferable, writes nothing, and runs on.
func TestSaveStateRefuses(t *testing.T) {
	s := newHandoverSetup(t)
	pa, err := s.a.ctx.AllocPD()
	must(t, err)
	tbl := s.a.dev.memory.Acquire()
	mustCmd(t, s.a.dev, tbl, abi.CmdAllocMW, abi.Marshal(&abi.AllocMW{PDN: pa.Num(), Type: abi.MWType2}))
	tbl.Release()
	var b bytes.Buffer
	if err := s.a.dev.SaveState(&b); !errors.Is(err, ErrNotTransferable) {
		t.Fatalf("got %v, want ErrNotTransferable", err)
	}
	if b.Len() != 0 {
		t.Fatalf("%d bytes written by a refused save", b.Len())
	}
	// The device was not left quiesced: its engine still runs work.
	must(t, s.srq.PostRecv(verbs.RecvWR{WRID: 1, SGL: []abi.SGE{s.mrb.SGE(0, 64)}}))
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 2, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(0, 64)}}))
	pumpVisits(t, s.a.dev)
	pump(t, s.a.dev, s.b.dev)
	if wc := pollN(t, s.sa, 1); wc[0].WRID != 2 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("a SEND after the refused save: %+v", wc)
	}
}

// pumpVisits fails if d is quiesced (its doorbell visits would do
// nothing).
func pumpVisits(t *testing.T, d *Device) {
	t.Helper()
	if d.quiesced.Load() {
		t.Fatal("the device is still quiesced")
	}
}

// TestMigrateAwayFromPeer: a device whose RC QP is connected to a device
// of its own daemon migrates to another daemon, where nothing holds the
// peer's GID: the load is refused with ErrNotTransferable (a same-host
// connection does not become a RoCEv2 one), the destination is left with
// nothing, and the source runs on with its peer.
func TestMigrateAwayFromPeer(t *testing.T) {
	s := newHandoverSetup(t)
	var b bytes.Buffer
	must(t, s.a.dev.SaveState(&b))
	cfgA := s.cfgA
	cfgA.Fabric = engine.NewFabric()
	d := s.a.attachDev(cfgA, mapMemory(t, s.a.file))
	err := d.LoadState(bytes.NewReader(b.Bytes()))
	if !errors.Is(err, ErrNotTransferable) || !strings.Contains(err.Error(), "not on this host") {
		t.Fatalf("LoadState: got %v, want ErrNotTransferable naming the peer not on this host", err)
	}
	if c := d.Census(); c.QPs != 0 || c.MRs != 0 || c.CQs != 0 || c.PDs != 0 {
		t.Fatalf("the refused destination holds %+v, want nothing", c)
	}
	copy(s.mrb.Bytes()[0:64], bytes.Repeat([]byte{0xd4}, 64))
	must(t, s.qb.PostSend(verbs.SendWR{WRID: 9, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mrb.SGE(0, 64)}, RemoteAddr: s.mra.Addr + 8192, RKey: s.mra.RKey}))
	pump(t, s.a.dev, s.b.dev)
	if wc := pollN(t, s.sb, 1); wc[0].WRID != 9 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("b's WRITE into the source after the refusal: %+v", wc)
	}
	if !bytes.Equal(s.mra.Bytes()[8192:8256], bytes.Repeat([]byte{0xd4}, 64)) {
		t.Fatal("b's WRITE did not land in the source's MR")
	}
}

// FuzzLoadState: a migration document is input from another host (QEMU
// carries it): LoadState never panics, and a refused document leaves the
// device with nothing made, pinned or registered beyond its own port GID.
func FuzzLoadState(f *testing.F) {
	seed := fuzzSeed(f)
	doc := func(body string) []byte {
		return []byte(`{"format":"` + MigrationFormat + `","version":1,"device":` + body + `}`)
	}
	f.Add(doc(string(seed)))
	f.Add(doc(`{"node_guid":1,"pds":[256]}`))
	f.Add(doc(`{}`))
	f.Add([]byte(`{"format":"vrdma-device-state","version":2}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<20 {
			return // the bound is MaxMigrationState; TestLoadStateRejects covers it
		}
		fd, err := memmap.NewMemfd("guest", handGuestSize)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		g := &guestOf{t: t}
		d := g.attachDev(handConfig("fuzz", fuzzUUID, engine.NewFabric()), mapMemory(t, fd))
		// Reach past the first check: the seed's node_guid is 1.
		data = bytes.Replace(data, []byte(`"node_guid":1,`), fmt.Appendf(nil, `"node_guid":%d,`, d.conf.NodeGUID), 1)
		if err := d.LoadState(bytes.NewReader(data)); err != nil {
			assertEmpty(t, d, nil)
			return
		}
		d.Reset()
		if s := d.Stats(); s.PDs+s.MRs+s.CQs+s.QPs+s.AHs+s.SRQs != 0 || s.Pin.PinnedBytes != 0 {
			t.Fatalf("after Reset: %+v", s)
		}
	})
}
