package virtio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

var errOutside = errors.New("test memory: range outside guest memory")

// testRegion is one slice-backed region of fake guest memory.
type testRegion struct {
	base abi.GPA
	b    []byte
}

// testMemory is fake guest memory: a few slice-backed regions. Like
// memmap.Table, a range must lie wholly inside one region.
type testMemory struct {
	regions []testRegion
}

func (m *testMemory) Slice(gpa abi.GPA, n uint64) ([]byte, error) {
	for _, r := range m.regions {
		if gpa < r.base || uint64(gpa-r.base) >= uint64(len(r.b)) {
			continue
		}
		off := uint64(gpa - r.base)
		if n > uint64(len(r.b))-off {
			return nil, fmt.Errorf("%#x+%d crosses the end of region %#x: %w", gpa, n, r.base, errOutside)
		}
		return r.b[off : off+n : off+n], nil
	}
	return nil, fmt.Errorf("%#x+%d: %w", gpa, n, errOutside)
}

// contains reports whether b lies wholly inside one region of m.
func (m *testMemory) contains(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	p := reflect.ValueOf(&b[0]).Pointer()
	for _, r := range m.regions {
		if len(r.b) == 0 {
			continue
		}
		start := reflect.ValueOf(&r.b[0]).Pointer()
		if p >= start && p-start <= uintptr(len(r.b)) && uintptr(len(b)) <= uintptr(len(r.b))-(p-start) {
			return true
		}
	}
	return false
}

// alignedBytes returns n zeroed bytes starting at an address aligned to align.
func alignedBytes(n, align int) []byte {
	b := make([]byte, n+align)
	p := reflect.ValueOf(&b[0]).Pointer()
	off := (align - int(p%uintptr(align))) % align
	return b[off : off+n : off+n]
}

// env is a driver and a device over the same rings, which live in the first
// region of a fake guest memory, followed by a data area.
type env struct {
	t     testing.TB
	mem   *testMemory
	ram   []byte
	base  abi.GPA
	rings Rings
	data  abi.GPA // start of the data area
	drv   *DriverQueue
	dev   *DeviceQueue
}

const (
	envBase    = abi.GPA(0x100000)
	envRAM     = 1 << 20
	envDataOff = 0x40000
)

func ringsIn(ram []byte, size uint16) Rings {
	d := int(DescTableSize(size))
	a := int(AvailRingSize(size))
	uOff := (d + a + 3) &^ 3
	u := int(UsedRingSize(size))
	return Rings{Desc: ram[0:d], Avail: ram[d : d+a], Used: ram[uOff : uOff+u]}
}

func newEnv(t testing.TB, size uint16, eventIdx, indirect bool) *env {
	t.Helper()
	ram := alignedBytes(envRAM, 4096)
	e := &env{
		t:    t,
		mem:  &testMemory{regions: []testRegion{{envBase, ram}}},
		ram:  ram,
		base: envBase,
		data: envBase + envDataOff,
	}
	e.rings = ringsIn(ram, size)
	var err error
	e.drv, err = NewDriverQueue(DriverQueueConfig{Size: size, EventIdx: eventIdx, Index: 3}, e.rings)
	if err != nil {
		t.Fatalf("NewDriverQueue: %v", err)
	}
	e.dev, err = NewDeviceQueue(DeviceQueueConfig{Index: 3, Size: size, EventIdx: eventIdx, Indirect: indirect}, e.rings)
	if err != nil {
		t.Fatalf("NewDeviceQueue: %v", err)
	}
	return e
}

// at returns the host view of n bytes at gpa in the first region.
func (e *env) at(gpa abi.GPA, n int) []byte {
	off := int(gpa - e.base)
	return e.ram[off : off+n]
}

// Raw ring writers for building malformed input (the driver side as a
// hostile guest would).

func (e *env) setDesc(i uint16, addr uint64, n uint32, flags, next uint16) {
	putDesc(e.rings.Desc, i, addr, n, flags, next)
}

func (e *env) makeAvail(heads ...uint16) {
	idx := binary.LittleEndian.Uint16(e.rings.Avail[2:])
	size := e.dev.Size()
	for _, h := range heads {
		binary.LittleEndian.PutUint16(e.rings.Avail[4+2*int(idx&(size-1)):], h)
		idx++
	}
	abi.StoreUint16(e.rings.Avail, 2, idx)
}
