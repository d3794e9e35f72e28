package rdma

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The live-upgrade tests: a guest's verbs library (guest/verbs) drives two
// devices through a transport that runs its commands on whichever Device
// serves it now; the devices' guest memory is a memfd, which the "new
// process" (a second fabric and devices) maps anew. The doorbell queues'
// engine is run by the test (pump), so that WQEs can be left posted and
// not run across the handover.

// handTransport is a verbs.Transport over a Device that the test swaps.
type handTransport struct {
	mu   sync.Mutex
	dev  *Device
	view []byte // the front-end's mapping of the guest memory (GPA 0…)
	next uint64
}

func (h *handTransport) device() *Device {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dev
}

func (h *handTransport) ReadConfig(off, n int) ([]byte, error) {
	b := make([]byte, n)
	return b, h.device().ReadConfig(off, b)
}

func (h *handTransport) Command(req []byte, respLen int) ([]byte, error) {
	d := h.device()
	var hdr abi.CmdHeader
	if len(req) < abi.CmdHeaderSize {
		return nil, errors.New("short command")
	}
	_ = abi.Unmarshal(req[:abi.CmdHeaderSize], &hdr)
	d.mu.Lock()
	mem := d.memory
	d.mu.Unlock()
	t := mem.Acquire()
	defer t.Release()
	payload, st := d.command(abi.Opcode(hdr.Opcode), req[abi.CmdHeaderSize:], t)
	d.commands.Add(1)
	if st != abi.StatusOK {
		d.errors.Add(1)
		payload = nil
	}
	resp := make([]byte, abi.RespHeaderSize+len(payload))
	binary.LittleEndian.PutUint32(resp, uint32(st))
	copy(resp[abi.RespHeaderSize:], payload)
	if len(resp) > respLen {
		return nil, errors.New("response too long")
	}
	return resp, nil
}

func (h *handTransport) AllocDMA(size, align uint64) (verbs.DMABuf, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if align < abi.PageSize {
		align = abi.PageSize
	}
	a := (h.next + align - 1) &^ (align - 1)
	if a+size > uint64(len(h.view)) {
		return verbs.DMABuf{}, errors.New("guest memory exhausted")
	}
	h.next = a + size
	b := h.view[a : a+size]
	clear(b)
	return verbs.DMABuf{Addr: abi.GPA(a), Buf: b}, nil
}

func (h *handTransport) FreeDMA(verbs.DMABuf) {}
func (h *handTransport) Notify(int) error     { return nil }
func (h *handTransport) Polling(int) bool     { return false }
func (h *handTransport) Close() error         { return nil }
func (h *handTransport) WaitEvent(time.Duration) (abi.Event, error) {
	return abi.Event{}, errors.New("no events")
}

// guestOf is one side of the test: a device on a memfd, the verbs
// context driving it, and the events its engine raised.
type guestOf struct {
	t    *testing.T
	file int // the memfd
	tr   *handTransport
	ctx  *verbs.Context
	mem  *memmap.Memory // the serving device's mapping
	dev  *Device

	evMu   sync.Mutex
	events []abi.Event
}

const handGuestSize = 4 << 20

func handConfig(id string, u uuid.UUID, f *engine.Fabric) Config {
	return Config{ID: id, UUID: u, Fabric: f, DoorbellQueues: 2, Pin: memmap.PinConfig{},
		Limits: Limits{MaxQP: 8, MaxQPWR: 64, MaxSGE: 4, MaxCQ: 8, MaxCQE: 256, MaxMR: 8, MaxPD: 4, MaxAH: 4,
			MaxMRSize: handGuestSize, MaxInlineData: 64, MaxQPRdAtom: 4, MaxSRQ: 2}}
}

// mapMemory maps the memfd as a device's guest memory (GPA 0), through a
// duplicate of file (the region takes it).
func mapMemory(t *testing.T, file int) *memmap.Memory {
	t.Helper()
	dup, err := unix.FcntlInt(uintptr(file), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	r, err := memmap.MapRegion(dup, memmap.RegionSpec{Size: handGuestSize, UserAddr: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := memmap.NewTable([]*memmap.Region{r})
	r.Release()
	if err != nil {
		t.Fatal(err)
	}
	mem := memmap.NewMemory()
	mem.Swap(tbl)
	return mem
}

// attachDev creates a device with cfg attached to mem, its engine's events
// recorded in g.
func (g *guestOf) attachDev(cfg Config, mem *memmap.Memory) *Device {
	g.t.Helper()
	d, err := New(cfg)
	if err != nil {
		g.t.Fatal(err)
	}
	d.Attach(&fakeHost{mem: mem})
	d.eng.Attach(mem, func(ev abi.Event) {
		g.evMu.Lock()
		g.events = append(g.events, ev)
		g.evMu.Unlock()
	}, nil)
	g.t.Cleanup(func() {
		d.Reset()
		d.Detach()
		d.Close()
		mem.Close()
	})
	return d
}

func newGuest(t *testing.T, cfg Config) *guestOf {
	t.Helper()
	fd, err := memmap.NewMemfd("guest", handGuestSize)
	if err != nil {
		t.Fatal(err)
	}
	view, err := unix.Mmap(fd, 0, handGuestSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	g := &guestOf{t: t, file: fd}
	t.Cleanup(func() {
		unix.Munmap(view)
		unix.Close(fd)
	})
	g.mem = mapMemory(t, fd)
	g.dev = g.attachDev(cfg, g.mem)
	g.tr = &handTransport{dev: g.dev, view: view, next: abi.PageSize}
	if g.ctx, err = verbs.Open(g.tr); err != nil {
		t.Fatal(err)
	}
	return g
}

// takeOver is the new process's side for g: a device with cfg (another
// fabric) on a new mapping of the same memory, importing st.
func (g *guestOf) takeOver(cfg Config, st *DeviceState) *Device {
	g.t.Helper()
	mem := mapMemory(g.t, g.file)
	d := g.attachDev(cfg, mem)
	if err := d.ImportState(st); err != nil {
		g.t.Fatalf("ImportState: %v", err)
	}
	return d
}

func (g *guestOf) eventList() []abi.Event {
	g.evMu.Lock()
	defer g.evMu.Unlock()
	return append([]abi.Event(nil), g.events...)
}

// pump runs the engines of devs' doorbell queues until none finds work.
func pump(t *testing.T, devs ...*Device) {
	t.Helper()
	for range 100 {
		worked := false
		for _, d := range devs {
			tbl := d.memory.Acquire()
			for dbq := range d.cfg.DoorbellQueues {
				w, _ := d.eng.Poll(dbq, tbl)
				worked = worked || w
			}
			tbl.Release()
		}
		if !worked {
			return
		}
	}
	t.Fatal("the engines never went idle")
}

// pollN polls cq for exactly n completions (after pump).
func pollN(t *testing.T, cq *verbs.CQ, n int) []verbs.WC {
	t.Helper()
	wc := make([]verbs.WC, n+4)
	got, err := cq.Poll(wc)
	if err != nil {
		t.Fatal(err)
	}
	if got != n {
		t.Fatalf("got %d completions, want %d: %+v", got, n, wc[:got])
	}
	return wc[:n]
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// handoverSetup is the objects of TestHandover on both sides.
type handoverSetup struct {
	a, b           *guestOf
	sa, ra, sb, rb *verbs.CQ // a's and b's send and receive CQs
	udCQ           *verbs.CQ // b's UD receive CQ
	srq            *verbs.SRQ
	qa, qb, ua, ub *verbs.QP
	mra, mrb       *verbs.MR
	ah             *verbs.AH
	pa, pb         *verbs.PD
	cfgA, cfgB     Config
}

func newHandoverSetup(t *testing.T) *handoverSetup {
	f := engine.NewFabric()
	s := &handoverSetup{cfgA: handConfig("a", uuid.New(), f), cfgB: handConfig("b", uuid.New(), f)}
	s.a, s.b = newGuest(t, s.cfgA), newGuest(t, s.cfgB)
	pa, err := s.a.ctx.AllocPD()
	must(t, err)
	pb, err := s.b.ctx.AllocPD()
	must(t, err)
	ba, err := s.a.ctx.AllocBuffer(64 << 10)
	must(t, err)
	bb, err := s.b.ctx.AllocBuffer(64 << 10)
	must(t, err)
	all := abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead
	s.mra, err = pa.RegMR(ba, 0, 64<<10, all)
	must(t, err)
	s.mrb, err = pb.RegMR(bb, 0, 64<<10, all)
	must(t, err)
	for _, c := range []struct {
		ctx *verbs.Context
		cq  **verbs.CQ
	}{{s.a.ctx, &s.sa}, {s.a.ctx, &s.ra}, {s.b.ctx, &s.sb}, {s.b.ctx, &s.rb}, {s.b.ctx, &s.udCQ}} {
		*c.cq, err = c.ctx.CreateCQ(32)
		must(t, err)
	}
	s.srq, err = pb.CreateSRQ(verbs.SRQInitAttr{MaxWR: 16, MaxSGE: 1})
	must(t, err)
	qcap := verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}
	s.qa, err = pa.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeRC, SendCQ: s.sa, RecvCQ: s.ra, Cap: qcap})
	must(t, err)
	s.qb, err = pb.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeRC, SendCQ: s.sb, RecvCQ: s.rb, SRQ: s.srq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxSendSGE: 1}})
	must(t, err)
	s.ua, err = pa.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeUD, SendCQ: s.sa, RecvCQ: s.ra, Cap: qcap})
	must(t, err)
	s.ub, err = pb.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeUD, SendCQ: s.sb, RecvCQ: s.udCQ, Cap: qcap})
	must(t, err)
	ga, err := s.a.ctx.QueryGID()
	must(t, err)
	gb, err := s.b.ctx.QueryGID()
	must(t, err)
	must(t, s.qa.ConnectRC(gb, s.qb.Num(), s.qb.PSN(), all))
	must(t, s.qb.ConnectRC(ga, s.qa.Num(), s.qa.PSN(), all))
	must(t, s.ua.ReadyUD(0x1234))
	must(t, s.ub.ReadyUD(0x1234))
	s.ah, err = pa.CreateAH(verbs.AHAttr{DGID: gb})
	must(t, err)
	s.pa, s.pb = pa, pb
	return s
}

// TestHandover: two devices with an RC pair (the responder on an SRQ), a
// UD pair, MRs and CQs run some work, leave some posted and not run
// (sends, receives, an armed CQ), and are handed over to devices of a
// second fabric that map the guest memory anew. The posted work then
// completes there with the right data, the handles, keys, QP numbers and
// PSNs are the same, the CQs go on without a lost or repeated entry, the
// armed CQ fires once, and no other event is raised.
func TestHandover(t *testing.T) {
	s := newHandoverSetup(t)
	a, b := s.a, s.b
	send := func(qp *verbs.QP, id uint64, off int, fill byte, ud bool) {
		t.Helper()
		copy(s.mra.Bytes()[off:off+64], bytes.Repeat([]byte{fill}, 64))
		wr := verbs.SendWR{WRID: id, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{s.mra.SGE(off, 64)}}
		if ud {
			wr.AH, wr.RemoteQPN, wr.RemoteQKey = s.ah, s.ub.Num(), 0x1234
		}
		must(t, qp.PostSend(wr))
	}
	// Phase 1, run: two SENDs into the SRQ and an RDMA WRITE.
	for i := range 4 {
		must(t, s.srq.PostRecv(verbs.RecvWR{WRID: uint64(100 + i), SGL: []abi.SGE{s.mrb.SGE(4096*(i+1), 64)}}))
	}
	send(s.qa, 1, 0, 0xa1, false)
	send(s.qa, 2, 64, 0xa2, false)
	copy(s.mra.Bytes()[512:576], bytes.Repeat([]byte{0xee}, 64))
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 3, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mra.SGE(512, 64)}, RemoteAddr: s.mrb.Addr + 32768, RKey: s.mrb.RKey}))
	pump(t, a.dev, b.dev)
	if wc := pollN(t, s.sa, 3); wc[0].WRID != 1 || wc[1].WRID != 2 || wc[2].WRID != 3 || wc[2].Status != abi.WCSuccess {
		t.Fatalf("send completions before the handover: %+v", wc)
	}
	if wc := pollN(t, s.rb, 2); wc[0].WRID != 100 || wc[1].WRID != 101 {
		t.Fatalf("receive completions before the handover: %+v", wc)
	}
	// Phase 2, posted and not run: two SENDs (the SRQ holds two
	// receives), a UD datagram (ub has a receive), b's receive CQ armed.
	send(s.qa, 4, 128, 0xa4, false)
	send(s.qa, 5, 192, 0xa5, false)
	must(t, s.ub.PostRecv(verbs.RecvWR{WRID: 200, SGL: []abi.SGE{s.mrb.SGE(49152, 64+40)}}))
	send(s.ua, 6, 256, 0xa6, true)
	must(t, s.rb.ReqNotify(false))
	before := map[string]abi.QPAttr{}
	for name, qp := range map[string]*verbs.QP{"qa": s.qa, "qb": s.qb, "ua": s.ua, "ub": s.ub} {
		attr, err := qp.Query()
		must(t, err)
		before[name] = attr
	}
	pinsA, pinsB := a.dev.Stats().Pin, b.dev.Stats().Pin

	// The handover: quiesce both, export, through JSON, import in a
	// second "process".
	if ev := append(a.eventList(), b.eventList()...); len(ev) != 0 {
		t.Fatalf("events before the handover: %+v", ev)
	}
	na, nb, _, _ := s.handOver(t)

	for name, qp := range map[string]*verbs.QP{"qa": s.qa, "qb": s.qb, "ua": s.ua, "ub": s.ub} {
		attr, err := qp.Query()
		must(t, err)
		if attr != before[name] {
			t.Errorf("%s attributes after the handover: got %+v, want %+v", name, attr, before[name])
		}
	}
	if got := na.Stats().Pin; got.PinnedBytes != pinsA.PinnedBytes {
		t.Errorf("a pins %d bytes after the handover, %d before", got.PinnedBytes, pinsA.PinnedBytes)
	}
	if got := nb.Stats().Pin; got.PinnedBytes != pinsB.PinnedBytes {
		t.Errorf("b pins %d bytes after the handover, %d before", got.PinnedBytes, pinsB.PinnedBytes)
	}

	// The posted work runs in the new process.
	pump(t, na, nb)
	if wc := pollN(t, s.sa, 3); wc[0].WRID != 4 || wc[1].WRID != 5 || wc[2].WRID != 6 {
		t.Fatalf("send completions after the handover: %+v", wc)
	}
	wc := pollN(t, s.rb, 2)
	for i, w := range wc {
		want := byte(0xa4 + i)
		got := s.mrb.Bytes()[4096*(i+3) : 4096*(i+3)+64]
		if w.WRID != uint64(102+i) || w.Status != abi.WCSuccess || !bytes.Equal(got, bytes.Repeat([]byte{want}, 64)) {
			t.Fatalf("receive %d after the handover: %+v, data %x", i, w, got[:4])
		}
	}
	if w := pollN(t, s.udCQ, 1)[0]; w.WRID != 200 || w.Status != abi.WCSuccess ||
		!bytes.Equal(s.mrb.Bytes()[49152+40:49152+104], bytes.Repeat([]byte{0xa6}, 64)) {
		t.Fatalf("UD receive after the handover: %+v", w)
	}
	if !bytes.Equal(s.mrb.Bytes()[32768:32832], bytes.Repeat([]byte{0xee}, 64)) {
		t.Fatal("the RDMA WRITE's bytes are gone")
	}
	// The armed CQ fired once; nothing else.
	if ev := b.eventList(); len(ev) != 1 || ev[0].Type != abi.EventCQCompletion || ev[0].Handle != s.rb.Num() {
		t.Fatalf("b's events after the handover: %+v, want one CQ_COMPLETION of CQ %d", ev, s.rb.Num())
	}
	if ev := a.eventList(); len(ev) != 0 {
		t.Fatalf("a's events after the handover: %+v", ev)
	}

	// New work on the new devices, and new objects get fresh handles.
	must(t, s.srq.PostRecv(verbs.RecvWR{WRID: 104, SGL: []abi.SGE{s.mrb.SGE(4096*5, 64)}}))
	send(s.qa, 7, 320, 0xa7, false)
	pump(t, na, nb)
	if wc := pollN(t, s.sa, 1); wc[0].WRID != 7 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("a send after the handover: %+v", wc)
	}
	if wc := pollN(t, s.rb, 1); wc[0].WRID != 104 {
		t.Fatalf("a receive after the handover: %+v", wc)
	}
	if _, err := a.ctx.CreateCQ(8); err != nil {
		t.Fatalf("CREATE_CQ after the handover: %v", err)
	}
}

// handOver quiesces and exports s's devices and imports them into devices
// of a new fabric that map the guest memories anew; the verbs contexts
// then drive those.
func (s *handoverSetup) handOver(t *testing.T) (na, nb *Device, sta, stb *DeviceState) {
	t.Helper()
	must(t, s.a.dev.Quiesce())
	must(t, s.b.dev.Quiesce())
	sta, stb = exportJSON(t, s.a.dev), exportJSON(t, s.b.dev)
	f2 := engine.NewFabric()
	cfgA, cfgB := s.cfgA, s.cfgB
	cfgA.Fabric, cfgB.Fabric = f2, f2
	na, nb = s.a.takeOver(cfgA, sta), s.b.takeOver(cfgB, stb)
	must(t, FinishImport([]*Device{na, nb}))
	for _, g := range []struct {
		g *guestOf
		d *Device
	}{{s.a, na}, {s.b, nb}} {
		g.g.tr.mu.Lock()
		g.g.tr.dev = g.d
		g.g.tr.mu.Unlock()
	}
	return na, nb, sta, stb
}

// TestHandoverRNR: a SEND waiting for a receive (RNR) when the devices are
// handed over is retried by the new process and completes once the
// receive is posted there; its RNR retries are carried.
func TestHandoverRNR(t *testing.T) {
	s := newHandoverSetup(t)
	copy(s.mra.Bytes()[:64], bytes.Repeat([]byte{0x5a}, 64))
	must(t, s.qa.PostSend(verbs.SendWR{WRID: 9, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{s.mra.SGE(0, 64)}}))
	pump(t, s.a.dev, s.b.dev)
	pollN(t, s.sa, 0) // the SRQ is empty: the SEND waits
	na, nb, sta, _ := s.handOver(t)
	tries := uint32(0)
	for _, q := range sta.QPs {
		if q.Num == s.qa.Num() {
			tries = q.State.RNRTries
		}
	}
	if tries == 0 {
		t.Fatal("the exported requester has no RNR retry")
	}
	must(t, s.srq.PostRecv(verbs.RecvWR{WRID: 300, SGL: []abi.SGE{s.mrb.SGE(0, 64)}}))
	pump(t, na, nb)
	if wc := pollN(t, s.sa, 1); wc[0].WRID != 9 || wc[0].Status != abi.WCSuccess {
		t.Fatalf("the waiting SEND after the handover: %+v", wc)
	}
	if wc := pollN(t, s.rb, 1); wc[0].WRID != 300 || !bytes.Equal(s.mrb.Bytes()[:64], bytes.Repeat([]byte{0x5a}, 64)) {
		t.Fatalf("its receive: %+v", wc)
	}
}

// exportJSON exports d and returns the state as the new process decodes
// it.
func exportJSON(t *testing.T, d *Device) *DeviceState {
	t.Helper()
	st, err := d.ExportState()
	if err != nil {
		t.Fatalf("ExportState: %v", err)
	}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var out DeviceState
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// assertEmpty fails unless d holds no object, no pin, its GID table is as
// after a reset, and QP number qpn is free on its fabric.
func assertEmpty(t *testing.T, d *Device, qpns []uint32) {
	t.Helper()
	s := d.Stats()
	if s.PDs+s.MRs+s.CQs+s.QPs+s.AHs+s.SRQs != 0 || s.Pin.PinnedBytes != 0 {
		t.Fatalf("after a refused import: %+v", s)
	}
	if g := d.GIDs(); len(g) != 1 || g[0].Index != 0 {
		t.Fatalf("GID table after a refused import: %+v", g)
	}
	for _, n := range qpns {
		if !d.eng.ClaimHandle(engine.KindQP, n, qpnBits) {
			t.Fatalf("QP number %#x still registered after a refused import", n)
		}
		d.eng.ReleaseQPN(n)
	}
}

// TestImportStateRejects: hostile states are refused, and the device is
// left with nothing made, pinned or registered.
func TestImportStateRejects(t *testing.T) {
	s := newHandoverSetup(t)
	must(t, s.b.dev.Quiesce())
	valid := exportJSON(t, s.b.dev)
	var qpns []uint32
	for _, q := range valid.QPs {
		qpns = append(qpns, q.Num)
	}
	for _, c := range []struct {
		name string
		mod  func(st *DeviceState)
	}{
		{"another device", func(st *DeviceState) { st.NodeGUID++ }},
		{"key reused", func(st *DeviceState) { st.MRs = append(st.MRs, st.MRs[0]) }},
		{"MR outside memory", func(st *DeviceState) { st.MRs[0].Extents[0].GPA = handGuestSize }},
		{"MR extents not its pages", func(st *DeviceState) {
			e := st.MRs[0].Extents[0]
			st.MRs[0].Extents = []ExtentState{{GPA: e.GPA, Len: 4096}, {GPA: e.GPA + 8192, Len: e.Len - 4096}}
		}},
		{"MR extents short", func(st *DeviceState) { st.MRs[0].Extents[0].Len-- }},
		{"MR in a missing PD", func(st *DeviceState) { st.MRs[0].PD ^= 0xffff00 }},
		{"QP names a missing CQ", func(st *DeviceState) { st.QPs[len(st.QPs)-1].SendCQ ^= 0xffff00 }},
		{"QP names a missing SRQ", func(st *DeviceState) {
			for i := range st.QPs {
				if st.QPs[i].SRQ != 0 {
					st.QPs[i].SRQ ^= 0xffff00
				}
			}
		}},
		{"QP number reused", func(st *DeviceState) { st.QPs[1].Num = st.QPs[0].Num }},
		{"QP number 1", func(st *DeviceState) { st.QPs[0].Num = 1 }},
		{"QP state", func(st *DeviceState) { st.QPs[0].State.Attr.State = 9 }},
		{"PSN", func(st *DeviceState) { st.QPs[0].State.Attr.SQPSN = 1 << 24 }},
		{"rd_atomic", func(st *DeviceState) { st.QPs[0].State.Attr.MaxRdAtomic = 99 }},
		{"rnr_tries", func(st *DeviceState) { st.QPs[0].State.RNRTries = 8 }},
		{"sgid not the device's", func(st *DeviceState) {
			for i := range st.QPs {
				if st.QPs[i].State.Peer {
					st.QPs[i].State.SGID[15] ^= 1
				}
			}
		}},
		{"doorbell queue", func(st *DeviceState) { st.QPs[0].DoorbellQueue = 2 }},
		{"QP pages", func(st *DeviceState) { st.QPs[0].Pages = append(st.QPs[0].Pages, st.QPs[0].Pages[0]) }},
		{"QP send pages", func(st *DeviceState) { st.QPs[0].SQNPages = uint32(len(st.QPs[0].Pages)) + 1 }},
		{"page unaligned", func(st *DeviceState) { st.CQs[0].Pages[0] += 8 }},
		{"CQ depth over the limit", func(st *DeviceState) { st.CQs[0].Depth = 1 << 20 }},
		{"CQ record outside memory", func(st *DeviceState) { st.CQs[0].Record = 1 << 40 }},
		{"CQ armed in overrun", func(st *DeviceState) { st.CQs[0].State.Armed, st.CQs[0].State.Overrun = true, true }},
		{"SRQ limit", func(st *DeviceState) { st.SRQs[0].State.Limit = st.SRQs[0].MaxWR + 1 }},
		{"too many PDs", func(st *DeviceState) {
			for i := range 10 {
				st.PDs = append(st.PDs, uint32(i+1)<<8)
			}
		}},
		{"PD handle 0", func(st *DeviceState) { st.PDs[0] = 0 }},
		{"GID not allowed", func(st *DeviceState) { st.GIDs = append(st.GIDs, GIDState{Index: 3, GID: [16]byte{0x20, 1, 15: 1}}) }},
		{"GID index", func(st *DeviceState) { st.GIDs[0].Index = abi.GIDTableLen }},
		{"AH source GID", func(st *DeviceState) {
			st.AHs = append(st.AHs, AHState{Handle: 0x4200, PD: st.PDs[0], SGID: [16]byte{1}})
		}},
		{"counter status", func(st *DeviceState) { st.Counters.Engine.WCErrors = map[uint32]uint64{99: 1} }},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw, _ := json.Marshal(valid)
			var st DeviceState
			must(t, json.Unmarshal(raw, &st))
			c.mod(&st)
			mem := mapMemory(t, s.b.file)
			g := &guestOf{t: t}
			cfg := s.cfgB
			cfg.Fabric = engine.NewFabric()
			d := g.attachDev(cfg, mem)
			err := d.ImportState(&st)
			if err == nil {
				t.Fatal("ImportState accepted the state")
			}
			if !errors.Is(err, ErrInvalidState) {
				t.Fatalf("got %v, want an error wrapping ErrInvalidState", err)
			}
			assertEmpty(t, d, qpns)
			// The same device then takes the valid state.
			raw, _ = json.Marshal(valid)
			var ok DeviceState
			must(t, json.Unmarshal(raw, &ok))
			if err := d.ImportState(&ok); err != nil {
				t.Fatalf("the valid state after a refused one: %v", err)
			}
		})
	}
}

// TestExportStateRefuses: a memory window, an ALLOC_MR MR and a host NIC
// are not handed over by this version: ErrNotTransferable, saying what.
func TestExportStateRefuses(t *testing.T) {
	for _, c := range []struct {
		name, want string
		op         abi.Opcode
		req        func(pdn uint32) []byte
	}{
		{"memory window", "memory window", abi.CmdAllocMW, func(pdn uint32) []byte {
			return abi.Marshal(&abi.AllocMW{PDN: pdn, Type: abi.MWType2})
		}},
		{"ALLOC_MR", "ALLOC_MR", abi.CmdAllocMR, func(pdn uint32) []byte {
			return abi.Marshal(&abi.AllocMR{PDN: pdn, MaxPages: 4})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, tbl, done := attached(t)
			defer done()
			pdn := handleOf(t, mustCmd(t, d, tbl, abi.CmdCreatePD, nil))
			if _, err := d.ExportState(); err != nil {
				t.Fatalf("ExportState of a PD: %v", err)
			}
			mustCmd(t, d, tbl, c.op, c.req(pdn))
			_, err := d.ExportState()
			if !errors.Is(err, ErrNotTransferable) || !bytes.Contains([]byte(err.Error()), []byte(c.want)) {
				t.Fatalf("got %v, want ErrNotTransferable naming %q", err, c.want)
			}
		})
	}
	t.Run("host NIC", func(t *testing.T) {
		d, err := New(Config{ID: "nic", NIC: stubNIC{}})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		mem := memmap.NewMemory()
		defer mem.Close()
		d.Attach(&fakeHost{mem: mem})
		defer d.Detach()
		if _, err := d.ExportState(); !errors.Is(err, ErrNotTransferable) {
			t.Fatalf("got %v, want ErrNotTransferable", err)
		}
	})
}

// FuzzImportState feeds arbitrary JSON states to ImportState: it must
// never panic, and a refused state leaves nothing made, pinned or
// registered; an accepted one is undone by Reset.
func FuzzImportState(f *testing.F) {
	// The seed: a valid state of a device with every kind of object.
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"node_guid":1,"pds":[256]}`))
	f.Add(fuzzSeed(f))
	f.Fuzz(func(t *testing.T, data []byte) {
		var st DeviceState
		if json.Unmarshal(data, &st) != nil {
			return
		}
		fd, err := memmap.NewMemfd("guest", handGuestSize)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		mem := mapMemory(t, fd)
		g := &guestOf{t: t}
		cfg := handConfig("fuzz", fuzzUUID, engine.NewFabric())
		d := g.attachDev(cfg, mem)
		if st.NodeGUID == 1 {
			st.NodeGUID = d.conf.NodeGUID // reach past the first check
		}
		if err := d.ImportState(&st); err != nil {
			assertEmpty(t, d, nil)
			return
		}
		d.Reset()
		if s := d.Stats(); s.PDs+s.MRs+s.CQs+s.QPs+s.AHs+s.SRQs != 0 || s.Pin.PinnedBytes != 0 {
			t.Fatalf("after Reset: %+v", s)
		}
	})
}

var fuzzUUID = uuid.MustParse("2b1c0d62-6f7e-4d59-9b7a-3c1f2e4d5a60")

// fuzzSeed is the exported state of a device with a PD, an MR, CQs, an
// SRQ, an RC QP on it, a UD QP and an AH, with node_guid 1 (FuzzImportState
// substitutes its device's).
func fuzzSeed(tb testing.TB) []byte {
	fd, err := memmap.NewMemfd("guest", handGuestSize)
	if err != nil {
		tb.Fatal(err)
	}
	r, err := memmap.MapRegion(fd, memmap.RegionSpec{Size: handGuestSize, UserAddr: 1 << 40})
	if err != nil {
		tb.Fatal(err)
	}
	tbl, err := memmap.NewTable([]*memmap.Region{r})
	r.Release()
	if err != nil {
		tb.Fatal(err)
	}
	mem := memmap.NewMemory()
	mem.Swap(tbl)
	defer mem.Close()
	d, err := New(handConfig("seed", fuzzUUID, engine.NewFabric()))
	if err != nil {
		tb.Fatal(err)
	}
	defer d.Close()
	d.Attach(&fakeHost{mem: mem})
	defer d.Detach()
	tt := mem.Acquire()
	defer tt.Release()
	cmd := func(op abi.Opcode, req []byte) uint32 {
		out, st := d.command(op, req, tt)
		if st != abi.StatusOK {
			tb.Fatalf("seed command %v: %v", op, st)
		}
		if len(out) < 4 {
			return 0
		}
		return binary.LittleEndian.Uint32(out)
	}
	pdn := cmd(abi.CmdCreatePD, nil)
	cmd(abi.CmdRegMR, regMRReq(pdn, 0x10000, 3*4096, 12, 0x10000, 0x11000, 0x20000))
	cq := cmd(abi.CmdCreateCQ, append(abi.Marshal(&abi.CreateCQ{CQE: 64, NPages: 1, Record: 8192}), inlinePages(12288)...))
	srq := cmd(abi.CmdCreateSRQ, srqReq(pdn, nil))
	cmd(abi.CmdCreateQP, qpReq(pdn, cq, srq, nil))
	cmd(abi.CmdCreateQP, qpReq(pdn, cq, 0, func(c *abi.CreateQP) { c.QPType = abi.QPTypeUD; c.Record = 40960 }))
	cmd(abi.CmdCreateAH, abi.Marshal(&abi.CreateAH{PDN: pdn, PortNum: 1, DGID: d.conf.PortGID}))
	st, err := d.ExportState()
	if err != nil {
		tb.Fatal(err)
	}
	st.NodeGUID = 1
	raw, err := json.Marshal(st)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}
