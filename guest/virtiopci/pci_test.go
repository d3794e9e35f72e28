package virtiopci

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// capSpec describes one capability for buildConfig.
type capSpec struct {
	id          uint8 // capability ID (0x09 virtio)
	typ, bar    uint8
	off, length uint32
	mul         uint32
	capLen      uint8 // 0: 16, or 20 for notify
}

// buildConfig returns a 256-byte config space of a 1af4:106a function
// with the capabilities chained from 0x40 in order.
func buildConfig(caps ...capSpec) []byte {
	cfg := make([]byte, 256)
	binary.LittleEndian.PutUint16(cfg[cfgVendorID:], VendorVirtio)
	binary.LittleEndian.PutUint16(cfg[cfgDeviceID:], DeviceRDMA)
	binary.LittleEndian.PutUint16(cfg[cfgStatus:], statusCapabilitiesList)
	p := 0x40
	cfg[cfgCapPointer] = byte(p)
	for i, c := range caps {
		n := int(c.capLen)
		if n == 0 {
			n = capHeaderLen
			if c.typ == CapNotifyCfg {
				n = notifyCapLen
			}
		}
		cfg[p], cfg[p+2], cfg[p+3], cfg[p+4] = c.id, byte(n), c.typ, c.bar
		binary.LittleEndian.PutUint32(cfg[p+8:], c.off)
		binary.LittleEndian.PutUint32(cfg[p+12:], c.length)
		if n >= notifyCapLen {
			binary.LittleEndian.PutUint32(cfg[p+16:], c.mul)
		}
		next := (p + n + 3) &^ 3
		if i < len(caps)-1 {
			cfg[p+1] = byte(next)
		}
		p = next
	}
	return cfg
}

// qemuCaps is the layout QEMU gives a modern virtio-pci device: BAR 4
// with common, ISR, device and notify structures, plus PCI_CFG and an
// MSI-X capability in between.
var qemuCaps = []capSpec{
	{id: 0x11}, // MSI-X, not virtio
	{id: capIDVendor, typ: CapCommonCfg, bar: 4, off: 0, length: 0x1000},
	{id: capIDVendor, typ: CapISRCfg, bar: 4, off: 0x1000, length: 0x1000},
	{id: capIDVendor, typ: CapDeviceCfg, bar: 4, off: 0x2000, length: 0x1000},
	{id: capIDVendor, typ: CapNotifyCfg, bar: 4, off: 0x3000, length: 0x1000, mul: 4},
	{id: capIDVendor, typ: CapPCICfg, bar: 0, capLen: 20},
}

func TestParseCaps(t *testing.T) {
	l, err := ParseCaps(buildConfig(qemuCaps...))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Cap{
		"common": {Offset: 0x50, Type: CapCommonCfg, BAR: 4, Length: 0x1000},
		"isr":    {Offset: 0x60, Type: CapISRCfg, BAR: 4, BAROffset: 0x1000, Length: 0x1000},
		"device": {Offset: 0x70, Type: CapDeviceCfg, BAR: 4, BAROffset: 0x2000, Length: 0x1000},
		"notify": {Offset: 0x80, Type: CapNotifyCfg, BAR: 4, BAROffset: 0x3000, Length: 0x1000, NotifyOffMultiplier: 4},
	}
	got := map[string]*Cap{"common": l.Common, "isr": l.ISR, "device": l.Device, "notify": l.Notify}
	for k, w := range want {
		if got[k] == nil || *got[k] != w {
			t.Errorf("%s: got %+v, want %+v", k, got[k], w)
		}
	}
	if l.PCICfg == nil || len(l.All) != 5 {
		t.Errorf("got PCI_CFG %v and %d capabilities, want one and 5", l.PCICfg, len(l.All))
	}

	loop := buildConfig(qemuCaps...)
	loop[0x94+1] = 0x40 // the last one points back at the first
	loop[0x90+1] = 0x40
	bad := []struct {
		name string
		cfg  []byte
	}{
		{"short", make([]byte, 0x20)},
		{"no capability list", func() []byte { c := buildConfig(qemuCaps...); c[cfgStatus] = 0; return c }()},
		{"loop", loop},
		{"no common", buildConfig(qemuCaps[2:]...)},
		{"no notify", buildConfig(qemuCaps[:4]...)},
		{"no device", buildConfig(append(append([]capSpec{}, qemuCaps[:3]...), qemuCaps[4])...)},
		{"small common", buildConfig(capSpec{id: capIDVendor, typ: CapCommonCfg, bar: 4, length: 0x20}, qemuCaps[3], qemuCaps[4])},
		{"short notify cap", buildConfig(qemuCaps[1], qemuCaps[3], capSpec{id: capIDVendor, typ: CapNotifyCfg, bar: 4, length: 4, capLen: 16})},
		{"cap_len too small", buildConfig(capSpec{id: capIDVendor, typ: CapCommonCfg, capLen: 8})},
		{"pointer into header", func() []byte { c := buildConfig(qemuCaps...); c[cfgCapPointer] = 0x10; return c }()},
		{"overflowing range", buildConfig(capSpec{id: capIDVendor, typ: CapCommonCfg, off: 0xffffff00, length: 0x1000}, qemuCaps[3], qemuCaps[4])},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			l, err := ParseCaps(tt.cfg)
			if !errors.Is(err, ErrCapability) {
				t.Errorf("got error %v, want ErrCapability", err)
			}
			var ce *CapError
			if !errors.As(err, &ce) {
				t.Errorf("got %T, want *CapError", err)
			}
			if !reflect.DeepEqual(l, Layout{}) {
				t.Errorf("error with result %+v", l)
			}
		})
	}

	// Reserved types and BARs are ignored, and the first of a type wins.
	ign := buildConfig(
		capSpec{id: capIDVendor, typ: 9, bar: 4},
		capSpec{id: capIDVendor, typ: CapCommonCfg, bar: 6, length: 0x100},
		capSpec{id: capIDVendor, typ: CapCommonCfg, bar: 2, length: 0x100},
		capSpec{id: capIDVendor, typ: CapCommonCfg, bar: 4, length: 0x100},
		qemuCaps[3], qemuCaps[4])
	l, err = ParseCaps(ign)
	if err != nil {
		t.Fatal(err)
	}
	if l.Common.BAR != 2 || len(l.All) != 4 {
		t.Errorf("got common in BAR %d and %d capabilities, want BAR 2 and 4", l.Common.BAR, len(l.All))
	}
}

func TestWindow(t *testing.T) {
	m := &memRegs{b: make([]byte, 64)}
	w, ok := newWindow(m, 16, 16)
	if !ok {
		t.Fatal("window refused")
	}
	w.Write32(12, 0xdeadbeef)
	if got := binary.LittleEndian.Uint32(m.b[28:]); got != 0xdeadbeef {
		t.Errorf("got %#x at 28, want 0xdeadbeef", got)
	}
	w.Write32(16, 1) // outside: dropped
	w.Write16(15, 1) // straddles: dropped
	w.Write8(3, 7)
	if got := w.Read32(16); got != 0xffffffff {
		t.Errorf("read outside: got %#x, want all ones", got)
	}
	if got := w.Read16(1); got != 0xffff {
		t.Errorf("unaligned read: got %#x, want all ones", got)
	}
	if m.b[32] != 0 || m.b[19] != 7 {
		t.Errorf("writes leaked: %v", m.b)
	}
	inner, ok := newWindow(w, 8, 8)
	if !ok || inner.Read32(4) != 0xdeadbeef {
		t.Errorf("nested window: got %v %#x", ok, inner.Read32(4))
	}
	if _, ok := newWindow(m, 60, 8); ok {
		t.Error("a window past the end was accepted")
	}
	if _, ok := newWindow(m, 0xffffffff, 2); ok {
		t.Error("an overflowing window was accepted")
	}
}

func quietOptions() options {
	o := defaults()
	l := logrus.New()
	l.SetOutput(bytes.NewBuffer(nil))
	o.log = logrus.NewEntry(l)
	o.timeout = time.Second
	return o
}

func openFake(t *testing.T, fd *fakeDevice, o options) (*Transport, error) {
	t.Helper()
	return newTransport(fd, fd.notifyRegs(), &memRegs{b: fd.cfg}, 4, newDMA(fd.src, 0), o)
}

func TestInit(t *testing.T) {
	src := newFakeSource(false)
	fd := newFakeDevice(src, 5)
	fd.queues[4].max = 32
	fd.status = virtio.StatusDriverOK // left over: must be reset
	d, err := openFake(t, fd, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	wantLog := []uint8{0, 1, 3, 11, 15}
	if !bytes.Equal(fd.statusLog, wantLog) {
		t.Errorf("status writes: got %v, want %v", fd.statusLog, wantLog)
	}
	if got, want := uint64(fd.driverF[1])<<32|uint64(fd.driverF[0]), virtio.FeatureVersion1|virtio.FeatureEventIdx; got != want {
		t.Errorf("driver features: got %#x, want %#x", got, want)
	}
	for i, want := range []uint16{64, 64, 1, 1, 1} {
		q := fd.queues[i]
		if q.size != want || q.enable != 1 || q.desc == 0 || q.driver <= q.desc || q.dev <= q.driver {
			t.Errorf("queue %d: got %+v, want size %d, enabled, rings set", i, q, want)
		}
		if d.QueueSize(i) != want {
			t.Errorf("QueueSize(%d): got %d, want %d", i, d.QueueSize(i), want)
		}
	}
	if len(fd.notified) != 1 || fd.notified[0] != abi.EventQueue {
		t.Errorf("notifications at init: got %v, want [1] (event queue stocked)", fd.notified)
	}
	// Event queue stocked: avail idx = queue size.
	eq := fd.queues[1]
	if got := binary.LittleEndian.Uint16(src.slice(eq.driver, 4)[2:]); got != 64 {
		t.Errorf("event queue avail idx: got %d, want 64", got)
	}

	// A command round trip through the fake's echoing control queue.
	req := []byte{1, 0, 0, 0, 0, 0, 0, 0, 0xaa, 0xbb}
	resp, err := d.Command(req, 32)
	if err != nil {
		t.Fatal(err)
	}
	if want := append(make([]byte, 8), req...); !bytes.Equal(resp, want) {
		t.Errorf("response: got %x, want %x", resp, want)
	}
	for range 200 { // more commands than descriptors: they are freed
		if _, err := d.Command(req, 16); err != nil {
			t.Fatal(err)
		}
	}

	// Notify and Polling on doorbell queues.
	if err := d.Notify(2); err != nil {
		t.Fatal(err)
	}
	if got := fd.notified[len(fd.notified)-1]; got != 4 {
		t.Errorf("Notify(2) notified queue %d, want 4", got)
	}
	if err := d.Notify(3); !errors.Is(err, verbs.ErrInvalid) {
		t.Errorf("Notify(3): got %v, want ErrInvalid", err)
	}
	used := src.slice(fd.queues[3].dev, 2)
	if d.Polling(1) {
		t.Error("Polling(1): got true with flags 0")
	}
	used[0] = 1
	if !d.Polling(1) || d.Polling(-1) || d.Polling(7) {
		t.Error("Polling: NO_NOTIFY not seen, or out-of-range index polling")
	}

	// Config space.
	copy(fd.cfg, []byte{1, 0, 0, 0, 3, 0, 0, 0, 9})
	c, err := d.ReadConfig(0, 9)
	if err != nil || !bytes.Equal(c, fd.cfg[:9]) {
		t.Errorf("ReadConfig: got %x, %v, want %x", c, err, fd.cfg[:9])
	}
	if _, err := d.ReadConfig(90, 8); err == nil {
		t.Error("ReadConfig past the end succeeded")
	}

	// DeviceStatus reads the register as it is, NEEDS_RESET included.
	want := virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK | virtio.StatusDriverOK
	if st, err := d.DeviceStatus(); err != nil || st != want {
		t.Errorf("DeviceStatus: got %#x, %v, want %#x", st, err, want)
	}
	fd.status |= virtio.StatusNeedsReset
	if st, err := d.DeviceStatus(); err != nil || st != want|virtio.StatusNeedsReset {
		t.Errorf("DeviceStatus with NEEDS_RESET: got %#x, %v, want %#x", st, err, want|virtio.StatusNeedsReset)
	}

	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.DeviceStatus(); !errors.Is(err, ErrClosed) {
		t.Errorf("DeviceStatus after Close: got %v, want ErrClosed", err)
	}
	if fd.status != 0 || len(src.mapped) != 0 {
		t.Errorf("after Close: status %#x, %d mappings left", fd.status, len(src.mapped))
	}
	if _, err := d.Command(req, 8); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Command after Close: got %v, want ErrClosed", err)
	}
}

func TestInitFailures(t *testing.T) {
	tests := []struct {
		name  string
		setup func(fd *fakeDevice)
		want  error
	}{
		{"no VERSION_1", func(fd *fakeDevice) { fd.features = virtio.FeatureEventIdx }, ErrFeatures},
		{"FEATURES_OK refused", func(fd *fakeDevice) { fd.refuseFOK = true }, ErrFeatures},
		{"too few queues", func(fd *fakeDevice) { fd.queues = fd.queues[:2] }, ErrQueue},
		{"queue unavailable", func(fd *fakeDevice) { fd.queues[2].max = 0 }, ErrQueue},
		{"no hugepages", func(fd *fakeDevice) { fd.src.fail = true }, ErrQueue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fd := newFakeDevice(newFakeSource(false), 3)
			tt.setup(fd)
			d, err := openFake(t, fd, quietOptions())
			if !errors.Is(err, tt.want) || d != nil {
				t.Fatalf("got %v, %v, want %v", d, err, tt.want)
			}
			if fd.status&virtio.StatusFailed == 0 {
				t.Errorf("status %#x: FAILED not set", fd.status)
			}
		})
	}
}

func TestCommandBrokenDevice(t *testing.T) {
	fd := newFakeDevice(newFakeSource(false), 3)
	o := quietOptions()
	d, err := openFake(t, fd, o)
	if err != nil {
		t.Fatal(err)
	}
	// A device that claims more bytes than the response buffer holds
	// breaks the control queue for good.
	fd.respond = func(req []byte, n int) []byte { return make([]byte, n) }
	q := &fd.queues[0]
	used := fd.src.slice(q.dev, 6+8*uint64(q.size))
	if _, err := d.Command([]byte{1}, 8); err != nil {
		t.Fatal(err)
	}
	// Corrupt: publish a used element for a chain not in flight.
	binary.LittleEndian.PutUint32(used[4+8*(q.usedIdx%q.size):], 5)
	q.usedIdx++
	binary.LittleEndian.PutUint16(used[2:], q.usedIdx)
	if _, err := d.Command([]byte{1}, 8); !errors.Is(err, virtio.ErrBroken) {
		t.Errorf("got %v, want ErrBroken", err)
	}
	if _, err := d.Command([]byte{1}, 8); err == nil {
		t.Error("a broken control queue accepted a command")
	}
	d.Close()
}

func TestCommandTimeout(t *testing.T) {
	fd := newFakeDevice(newFakeSource(false), 3)
	o := quietOptions()
	o.timeout = 20 * time.Millisecond
	d, err := openFake(t, fd, o)
	if err != nil {
		t.Fatal(err)
	}
	d.notify = &memRegs{b: make([]byte, 64)} // notifications go nowhere
	if _, err := d.Command([]byte{1}, 8); !errors.Is(err, verbs.ErrTimeout) {
		t.Fatalf("got %v, want ErrTimeout", err)
	}
	if _, err := d.Command([]byte{1}, 8); err == nil {
		t.Error("a command after a lost one succeeded")
	}
}

func TestEvents(t *testing.T) {
	src := newFakeSource(false)
	fd := newFakeDevice(src, 3)
	d, err := openFake(t, fd, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.WaitEvent(5 * time.Millisecond); !errors.Is(err, verbs.ErrTimeout) {
		t.Errorf("no event: got %v, want ErrTimeout", err)
	}
	// The device writes an event into the first posted buffer.
	eq := &fd.queues[1]
	avail := src.slice(eq.driver, 6+2*uint64(eq.size))
	desc := src.slice(eq.desc, 16*uint64(eq.size))
	used := src.slice(eq.dev, 6+8*uint64(eq.size))
	head := binary.LittleEndian.Uint16(avail[4:])
	buf := src.slice(binary.LittleEndian.Uint64(desc[16*head:]), abi.EventSize)
	want := abi.Event{Type: 1, Handle: 0x1234}
	copy(buf, abi.Marshal(&want))
	binary.LittleEndian.PutUint32(used[4:], uint32(head))
	binary.LittleEndian.PutUint32(used[8:], abi.EventSize)
	binary.LittleEndian.PutUint16(used[2:], 1)
	got, err := d.WaitEvent(time.Second)
	if err != nil || got != want {
		t.Errorf("got %+v, %v, want %+v", got, err, want)
	}
	// The buffer went back: avail idx advanced by one.
	if idx := binary.LittleEndian.Uint16(avail[2:]); idx != eq.size+1 {
		t.Errorf("avail idx %d, want %d", idx, eq.size+1)
	}
}

func TestDMA(t *testing.T) {
	src := newFakeSource(true)
	d := newDMA(src, 8)
	var bufs []verbs.DMABuf
	for i, tc := range []struct{ size, align uint64 }{
		{100, 8}, {4096, 4096}, {HugePageSize - 4096, 4096}, {1 << 20, 1 << 20}, {64, 64}, {HugePageSize, 4096},
	} {
		b, err := d.Alloc(tc.size, tc.align)
		if err != nil {
			t.Fatalf("alloc %d: %v", i, err)
		}
		if uint64(len(b.Buf)) != tc.size || uint64(b.Addr)%tc.align != 0 || b.Pages != nil {
			t.Errorf("alloc %d: got %d bytes at %#x (pages %v), want %d aligned %d", i, len(b.Buf), b.Addr, b.Pages != nil, tc.size, tc.align)
		}
		if uint64(b.Addr)/HugePageSize != (uint64(b.Addr)+tc.size-1)/HugePageSize {
			t.Errorf("alloc %d: [%#x, +%d) straddles a hugepage", i, b.Addr, tc.size)
		}
		for _, o := range bufs {
			if uint64(b.Addr) < uint64(o.Addr)+uint64(len(o.Buf)) && uint64(o.Addr) < uint64(b.Addr)+tc.size {
				t.Errorf("alloc %d at %#x overlaps one at %#x", i, b.Addr, o.Addr)
			}
		}
		for j := range b.Buf {
			if b.Buf[j] != 0 {
				t.Fatalf("alloc %d not zeroed", i)
			}
			b.Buf[j] = 0xee
		}
		bufs = append(bufs, b)
	}
	// Large and scattered: a page table.
	big, err := d.Alloc(3*HugePageSize-4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if len(big.Pages) != 3*512-1 || big.Pages[512] != big.Pages[511]+4096+HugePageSize {
		t.Errorf("page table: %d pages, [511]=%#x [512]=%#x", len(big.Pages), big.Pages[511], big.Pages[512])
	}
	if g, _ := big.GPA(HugePageSize); uint64(g) != big.Pages[512] {
		t.Errorf("GPA(2 MiB): got %#x, want %#x", g, big.Pages[512])
	}
	if _, err := d.Alloc(4*HugePageSize, 4096); !errors.Is(err, ErrHugepages) {
		t.Errorf("over the limit: got %v, want ErrHugepages", err)
	}
	d.Free(big)
	for _, b := range bufs {
		d.Free(b)
	}
	for _, s := range d.slabs {
		if len(s.free) != 1 || s.free[0] != (extent{0, HugePageSize}) {
			t.Errorf("slab not coalesced after freeing all: %v", s.free)
		}
	}
	// Re-allocation reuses freed memory and zeroes it.
	b, err := d.Alloc(4096, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b.Buf, make([]byte, 4096)) {
		t.Error("reused memory not zeroed")
	}
	for _, tc := range []struct{ size, align uint64 }{{0, 8}, {8, 3}, {8, 4 * HugePageSize}, {1 << 41, 8}} {
		if b, err := d.Alloc(tc.size, tc.align); !errors.Is(err, ErrDMA) || b.Buf != nil {
			t.Errorf("Alloc(%d, %d): got %v, want ErrDMA", tc.size, tc.align, err)
		}
	}
	d.Free(verbs.DMABuf{Addr: 0x1234, Buf: make([]byte, 1)}) // unknown: ignored
	if err := d.Close(); err != nil || len(src.mapped) != 0 {
		t.Errorf("Close: %v, %d mappings left", err, len(src.mapped))
	}
}

func TestParsePagemapEntry(t *testing.T) {
	le := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	tests := []struct {
		name string
		raw  []byte
		want uint64
		ok   bool
	}{
		{"present", le(1<<63 | 0x12345), 0x12345000, true},
		{"present with flags", le(1<<63 | 1<<61 | 1<<55 | 0x200), 0x200000, true},
		{"max pfn", le(1<<63 | (1<<40 - 1)), (1<<40 - 1) << 12, true},
		{"pfn beyond 52 bits", le(1<<63 | 1<<40), 0, false},
		{"not present", le(0x12345), 0, false},
		{"pfn hidden", le(1 << 63), 0, false},
		{"short", []byte{1, 2, 3}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParsePagemapEntry(tt.raw)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("got %#x, %v, want %#x, ok %v", got, err, tt.want, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrHugepages) {
				t.Errorf("got %v, want ErrHugepages", err)
			}
		})
	}
}

func TestFind(t *testing.T) {
	root := t.TempDir()
	for _, d := range []struct{ addr, vendor, device string }{
		{"0000:00:04.0", "0x1af4\n", "0x106a\n"},
		{"0000:00:03.0", "0x1af4\n", "0x106a\n"},
		{"0000:00:02.0", "0x1af4\n", "0x1041\n"},
		{"0000:00:01.0", "0x8086\n", "0x106a\n"},
	} {
		dir := filepath.Join(root, d.addr)
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "vendor"), []byte(d.vendor), 0o644)
		os.WriteFile(filepath.Join(dir, "device"), []byte(d.device), 0o644)
	}
	got, err := findIn(root, VendorVirtio, DeviceRDMA)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:00:03.0", "0000:00:04.0"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := findIn(filepath.Join(root, "nope"), 1, 2); err == nil {
		t.Error("missing sysfs: no error")
	}
}

// fakeConfig is a config space in memory.
type fakeConfig struct{ b []byte }

func (f *fakeConfig) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(f.b)) {
		return 0, os.ErrInvalid
	}
	return copy(p, f.b[off:]), nil
}

func (f *fakeConfig) WriteAt(p []byte, off int64) (int, error) {
	return copy(f.b[off:], p), nil
}

func TestEnableDevice(t *testing.T) {
	cs := &fakeConfig{b: buildConfig(qemuCaps...)}
	cs.b[cfgCommand] = 0x01 // I/O space only
	if err := enableDevice(cs); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint16(cs.b[cfgCommand:]); got != 0x07 {
		t.Errorf("command register: got %#x, want 0x7", got)
	}
	if cfg, err := readConfig(cs); err != nil || len(cfg) != 256 {
		t.Errorf("readConfig: %d bytes, %v", len(cfg), err)
	}
}

func TestOpenRejects(t *testing.T) {
	for _, a := range []string{"", "../x", "a/b", ".."} {
		if _, err := Open(a); !errors.Is(err, ErrNoDevice) {
			t.Errorf("Open(%q): got %v, want ErrNoDevice", a, err)
		}
	}
	if _, err := Open("0000:ff:1f.7"); !errors.Is(err, ErrNoDevice) {
		t.Errorf("Open of a missing device: got %v, want ErrNoDevice", err)
	}
}
