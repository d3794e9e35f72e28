package virtiopci

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/vrdma/vrdma/virtio"
)

// fakeSource hands out heap "hugepages" at made-up guest-physical
// addresses; scatter makes consecutive pages non-adjacent.
type fakeSource struct {
	mu      sync.Mutex
	next    uint64
	scatter bool
	mapped  map[*byte]int
	byGPA   map[uint64][]byte // hugepage base → its memory
	fail    bool
}

func newFakeSource(scatter bool) *fakeSource {
	return &fakeSource{next: 0x4000_0000, scatter: scatter, mapped: map[*byte]int{}, byGPA: map[uint64][]byte{}}
}

func (f *fakeSource) Map(n int) ([]byte, []uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return nil, nil, fmt.Errorf("fake: %w", ErrHugepages)
	}
	mem := make([]byte, n*HugePageSize)
	gpas := make([]uint64, n)
	for i := range gpas {
		gpas[i] = f.next
		f.byGPA[f.next] = mem[i*HugePageSize : (i+1)*HugePageSize]
		f.next += HugePageSize
		if f.scatter {
			f.next += HugePageSize
		}
	}
	f.mapped[&mem[0]] = n
	return mem, gpas, nil
}

func (f *fakeSource) Unmap(mem []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mapped[&mem[0]]; !ok {
		return fmt.Errorf("fake: unmap of unknown memory")
	}
	delete(f.mapped, &mem[0])
	return nil
}

// slice translates a guest-physical range inside one hugepage.
func (f *fakeSource) slice(gpa uint64, n uint64) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	base := gpa &^ (HugePageSize - 1)
	m, ok := f.byGPA[base]
	if !ok || gpa-base+n > HugePageSize {
		return nil
	}
	return m[gpa-base : gpa-base+n]
}

// memRegs is a Regs over plain bytes (device config, notify area).
type memRegs struct {
	b       []byte
	onWrite func(off uint32, size int, v uint32)
}

func (m *memRegs) Len() uint32 { return uint32(len(m.b)) }
func (m *memRegs) Read8(off uint32) uint8 {
	return m.b[off]
}
func (m *memRegs) Read16(off uint32) uint16 { return binary.LittleEndian.Uint16(m.b[off:]) }
func (m *memRegs) Read32(off uint32) uint32 { return binary.LittleEndian.Uint32(m.b[off:]) }
func (m *memRegs) Write8(off uint32, v uint8) {
	m.b[off] = v
	if m.onWrite != nil {
		m.onWrite(off, 1, uint32(v))
	}
}
func (m *memRegs) Write16(off uint32, v uint16) {
	binary.LittleEndian.PutUint16(m.b[off:], v)
	if m.onWrite != nil {
		m.onWrite(off, 2, uint32(v))
	}
}
func (m *memRegs) Write32(off uint32, v uint32) {
	binary.LittleEndian.PutUint32(m.b[off:], v)
	if m.onWrite != nil {
		m.onWrite(off, 4, v)
	}
}

type fakeQueue struct {
	size, max          uint16
	enable             uint16
	desc, driver, dev  uint64
	notifyOff          uint16
	lastAvail, usedIdx uint16
}

// fakeDevice models the device side of virtio-pci modern common config,
// notifications and a control queue that echoes commands.
type fakeDevice struct {
	src       *fakeSource
	features  uint64
	refuseFOK bool
	status    uint8
	statusLog []uint8
	dfSel     uint32
	drvSel    uint32
	driverF   [2]uint32
	sel       uint16
	queues    []fakeQueue
	notified  []uint16
	gen       uint8
	cfg       []byte
	// respond builds the device-writable bytes for a control request.
	respond func(req []byte, writable int) []byte
}

func newFakeDevice(src *fakeSource, nq int) *fakeDevice {
	d := &fakeDevice{src: src, features: virtio.FeatureVersion1 | virtio.FeatureEventIdx | virtio.FeatureIndirectDesc,
		cfg: make([]byte, 96)}
	for range nq {
		d.queues = append(d.queues, fakeQueue{max: 256})
	}
	for i := range d.queues {
		d.queues[i].notifyOff = uint16(i)
	}
	d.respond = func(req []byte, n int) []byte { // status OK + the request echoed
		out := make([]byte, n)
		copy(out[8:], req)
		return out[:min(n, 8+len(req))]
	}
	return d
}

func (d *fakeDevice) Len() uint32 { return 0x38 }

func (d *fakeDevice) q() *fakeQueue {
	if int(d.sel) < len(d.queues) {
		return &d.queues[d.sel]
	}
	return &fakeQueue{}
}

func (d *fakeDevice) Read8(off uint32) uint8 {
	switch off {
	case ccDeviceStatus:
		return d.status
	case ccConfigGeneration:
		return d.gen
	}
	return 0
}

func (d *fakeDevice) Read16(off uint32) uint16 {
	switch off {
	case ccNumQueues:
		return uint16(len(d.queues))
	case ccQueueSelect:
		return d.sel
	case ccQueueSize:
		if d.q().size == 0 {
			return d.q().max
		}
		return d.q().size
	case ccQueueEnable:
		return d.q().enable
	case ccQueueNotifyOff:
		return d.q().notifyOff
	}
	return 0
}

func (d *fakeDevice) Read32(off uint32) uint32 {
	switch off {
	case ccDeviceFeature:
		if d.dfSel == 0 {
			return uint32(d.features)
		} else if d.dfSel == 1 {
			return uint32(d.features >> 32)
		}
	}
	return 0
}

func (d *fakeDevice) Write8(off uint32, v uint8) {
	if off != ccDeviceStatus {
		return
	}
	d.statusLog = append(d.statusLog, v)
	if v == 0 {
		d.status = 0
		for i := range d.queues {
			d.queues[i] = fakeQueue{max: d.queues[i].max, notifyOff: d.queues[i].notifyOff}
		}
		return
	}
	if v&virtio.StatusFeaturesOK != 0 && d.status&virtio.StatusFeaturesOK == 0 {
		f := uint64(d.driverF[1])<<32 | uint64(d.driverF[0])
		if d.refuseFOK || f&^d.features != 0 {
			v &^= virtio.StatusFeaturesOK
		}
	}
	d.status = v
}

func (d *fakeDevice) Write16(off uint32, v uint16) {
	switch off {
	case ccQueueSelect:
		d.sel = v
	case ccQueueSize:
		if v != 0 && v <= d.q().max {
			d.q().size = v
		}
	case ccQueueEnable:
		d.q().enable = v
	}
}

func (d *fakeDevice) Write32(off uint32, v uint32) {
	set := func(p *uint64, hi bool) {
		if hi {
			*p = *p&0xffffffff | uint64(v)<<32
		} else {
			*p = *p&^0xffffffff | uint64(v)
		}
	}
	switch off {
	case ccDeviceFeatureSelect:
		d.dfSel = v
	case ccDriverFeatureSelect:
		d.drvSel = v
	case ccDriverFeature:
		if d.drvSel < 2 {
			d.driverF[d.drvSel] = v
		}
	case ccQueueDesc, ccQueueDesc + 4:
		set(&d.q().desc, off == ccQueueDesc+4)
	case ccQueueDriver, ccQueueDriver + 4:
		set(&d.q().driver, off == ccQueueDriver+4)
	case ccQueueDevice, ccQueueDevice + 4:
		set(&d.q().dev, off == ccQueueDevice+4)
	}
}

// notifyRegs returns the notification structure (multiplier 4).
func (d *fakeDevice) notifyRegs() *memRegs {
	m := &memRegs{b: make([]byte, 4*len(d.queues))}
	m.onWrite = func(off uint32, size int, v uint32) {
		if size != 2 || off%4 != 0 || int(off/4) >= len(d.queues) || v != off/4 {
			panic(fmt.Sprintf("bad notification: off %d size %d value %d", off, size, v))
		}
		d.notified = append(d.notified, uint16(v))
		if v == 0 {
			d.serveControl()
		}
	}
	return m
}

// serveControl answers every available control chain (two descriptors:
// request, response).
func (d *fakeDevice) serveControl() {
	q := &d.queues[0]
	avail := d.src.slice(q.driver, 6+2*uint64(q.size))
	used := d.src.slice(q.dev, 6+8*uint64(q.size))
	// With EVENT_IDX, ask to be notified of the next chain (avail_event).
	defer func() { binary.LittleEndian.PutUint16(used[4+8*int(q.size):], q.lastAvail) }()
	desc := d.src.slice(q.desc, 16*uint64(q.size))
	for q.lastAvail != binary.LittleEndian.Uint16(avail[2:]) {
		head := binary.LittleEndian.Uint16(avail[4+2*(q.lastAvail%q.size):])
		r := desc[16*head:]
		req := d.src.slice(binary.LittleEndian.Uint64(r), uint64(binary.LittleEndian.Uint32(r[8:])))
		var written int
		if binary.LittleEndian.Uint16(r[12:])&virtio.DescFNext != 0 {
			w := desc[16*binary.LittleEndian.Uint16(r[14:]):]
			resp := d.src.slice(binary.LittleEndian.Uint64(w), uint64(binary.LittleEndian.Uint32(w[8:])))
			written = copy(resp, d.respond(req, len(resp)))
		}
		e := used[4+8*(q.usedIdx%q.size):]
		binary.LittleEndian.PutUint32(e, uint32(head))
		binary.LittleEndian.PutUint32(e[4:], uint32(written))
		q.usedIdx++
		binary.LittleEndian.PutUint16(used[2:], q.usedIdx)
		q.lastAvail++
	}
}
