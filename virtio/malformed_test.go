package virtio

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

func TestPopMalformed(t *testing.T) {
	const size = 8
	// Second region, adjacent to the first, for "crossing a region".
	region1 := envBase + envRAM
	tbl := envBase + 0x80000 // an indirect table inside the first region
	tests := []struct {
		name     string
		noIndir  bool   // VIRTIO_F_INDIRECT_DESC not negotiated
		maxBytes uint64 // DeviceQueueConfig.MaxChainBytes
		setup    func(e *env)
		ring     bool // a *RingError (else a *DescriptorError)
		reason   string
		index    uint16
		indirect bool
		memErr   bool // the error wraps the Memory's error
	}{
		{name: "avail idx far ahead", ring: true, reason: ReasonAvailIdx,
			setup: func(e *env) { abi.StoreUint16(e.rings.Avail, 2, e.dev.LastAvail()+size+1) }},
		{name: "avail idx behind", ring: true, reason: ReasonAvailIdx,
			setup: func(e *env) { abi.StoreUint16(e.rings.Avail, 2, e.dev.LastAvail()-1) }},
		{name: "head out of range", reason: ReasonHeadRange, index: size,
			setup: func(e *env) { e.makeAvail(size) }},
		{name: "head far out of range", reason: ReasonHeadRange, index: 0xffff,
			setup: func(e *env) { e.makeAvail(0xffff) }},
		{name: "next out of range", reason: ReasonNextRange, index: 2,
			setup: func(e *env) {
				e.setDesc(2, uint64(e.data), 8, DescFNext, size)
				e.makeAvail(2)
			}},
		{name: "self loop", reason: ReasonChainTooLong,
			setup: func(e *env) {
				e.setDesc(5, uint64(e.data), 8, DescFNext, 5)
				e.makeAvail(5)
			}, index: 5},
		{name: "two-descriptor loop", reason: ReasonChainTooLong, index: 1,
			setup: func(e *env) {
				e.setDesc(1, uint64(e.data), 8, DescFNext, 2)
				e.setDesc(2, uint64(e.data), 8, DescFNext, 1)
				e.makeAvail(1)
			}},
		{name: "loop of zero-length descriptors", reason: ReasonChainTooLong, index: 0,
			setup: func(e *env) {
				for i := uint16(0); i < size; i++ {
					e.setDesc(i, 0, 0, DescFNext, (i+1)%size)
				}
				e.makeAvail(0)
			}},
		{name: "indirect not negotiated", noIndir: true, reason: ReasonIndirectNotAllowed,
			setup: func(e *env) {
				e.setDesc(0, uint64(tbl), 16, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect with next", reason: ReasonIndirectNext, index: 3,
			setup: func(e *env) {
				e.setDesc(3, uint64(tbl), 16, DescFIndirect|DescFNext, 4)
				e.makeAvail(3)
			}},
		{name: "indirect empty", reason: ReasonIndirectEmpty,
			setup: func(e *env) {
				e.setDesc(0, uint64(tbl), 0, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect length not multiple of 16", reason: ReasonIndirectUnaligned,
			setup: func(e *env) {
				e.setDesc(0, uint64(tbl), 24, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect too long", reason: ReasonIndirectTooLong,
			setup: func(e *env) {
				e.setDesc(0, uint64(tbl), (MaxQueueSize+1)*16, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect outside memory", reason: ReasonIndirectMemory, memErr: true,
			setup: func(e *env) {
				e.setDesc(0, 0x10, 16, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect address overflow", reason: ReasonAddrOverflow,
			setup: func(e *env) {
				e.setDesc(0, math.MaxUint64-8, 16, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect nested", reason: ReasonIndirectNested, index: 1, indirect: true,
			setup: func(e *env) {
				t := e.at(tbl, 32)
				putDesc(t, 0, uint64(e.data), 8, DescFNext, 1)
				putDesc(t, 1, uint64(tbl), 16, DescFIndirect, 0)
				e.setDesc(0, uint64(tbl), 32, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect next out of range", reason: ReasonNextRange, index: 1, indirect: true,
			setup: func(e *env) {
				t := e.at(tbl, 32)
				putDesc(t, 0, uint64(e.data), 8, DescFNext, 1)
				putDesc(t, 1, uint64(e.data), 8, DescFNext, 2)
				e.setDesc(0, uint64(tbl), 32, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect loop", reason: ReasonChainTooLong, index: 0, indirect: true,
			setup: func(e *env) {
				t := e.at(tbl, 32)
				putDesc(t, 0, uint64(e.data), 8, DescFNext, 1)
				putDesc(t, 1, uint64(e.data), 8, DescFNext, 0)
				e.setDesc(0, uint64(tbl), 32, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "indirect buffer outside memory", reason: ReasonBufferMemory, index: 1, indirect: true, memErr: true,
			setup: func(e *env) {
				t := e.at(tbl, 32)
				putDesc(t, 0, uint64(e.data), 8, DescFNext, 1)
				putDesc(t, 1, 0x1000, 8, 0, 0)
				e.setDesc(0, uint64(tbl), 32, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "readable after writable", reason: ReasonReadAfterWrite, index: 1,
			setup: func(e *env) {
				e.setDesc(0, uint64(e.data), 8, DescFWrite|DescFNext, 1)
				e.setDesc(1, uint64(e.data), 8, 0, 0)
				e.makeAvail(0)
			}},
		{name: "readable after empty writable", reason: ReasonReadAfterWrite, index: 1,
			setup: func(e *env) {
				e.setDesc(0, uint64(e.data), 0, DescFWrite|DescFNext, 1)
				e.setDesc(1, uint64(e.data), 8, 0, 0)
				e.makeAvail(0)
			}},
		{name: "readable in indirect after direct writable", reason: ReasonReadAfterWrite, index: 0, indirect: true,
			setup: func(e *env) {
				putDesc(e.at(tbl, 16), 0, uint64(e.data), 8, 0, 0)
				e.setDesc(0, uint64(e.data), 8, DescFWrite|DescFNext, 1)
				e.setDesc(1, uint64(tbl), 16, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "readable after writable in indirect", reason: ReasonReadAfterWrite, index: 2, indirect: true,
			setup: func(e *env) {
				t := e.at(tbl, 48)
				putDesc(t, 0, uint64(e.data), 8, DescFNext, 1)
				putDesc(t, 1, uint64(e.data), 8, DescFWrite|DescFNext, 2)
				putDesc(t, 2, uint64(e.data), 8, 0, 0)
				e.setDesc(0, uint64(tbl), 48, DescFIndirect, 0)
				e.makeAvail(0)
			}},
		{name: "buffer outside memory", reason: ReasonBufferMemory, memErr: true,
			setup: func(e *env) {
				e.setDesc(0, 0x1000, 8, 0, 0)
				e.makeAvail(0)
			}},
		{name: "buffer past end of memory", reason: ReasonBufferMemory, memErr: true,
			setup: func(e *env) {
				e.setDesc(0, uint64(region1)+4096-4, 8, 0, 0)
				e.makeAvail(0)
			}},
		{name: "buffer crossing regions", reason: ReasonBufferMemory, memErr: true, index: 1,
			setup: func(e *env) {
				e.setDesc(1, uint64(region1)-4, 8, 0, 0)
				e.makeAvail(1)
			}},
		{name: "buffer address overflow", reason: ReasonAddrOverflow,
			setup: func(e *env) {
				e.setDesc(0, math.MaxUint64-0x10, 0x20, DescFWrite, 0)
				e.makeAvail(0)
			}},
		{name: "chain above bound", maxBytes: 100, reason: ReasonChainBytes, index: 1,
			setup: func(e *env) {
				e.setDesc(0, uint64(e.data), 64, DescFNext, 1)
				e.setDesc(1, uint64(e.data), 64, DescFWrite, 0)
				e.makeAvail(0)
			}},
		{name: "indirect chain above bound", maxBytes: 100, reason: ReasonChainBytes, index: 1, indirect: true,
			setup: func(e *env) {
				t := e.at(tbl, 32)
				putDesc(t, 0, uint64(e.data), 64, DescFNext, 1)
				putDesc(t, 1, uint64(e.data), 64, 0, 0)
				e.setDesc(0, uint64(tbl), 32, DescFIndirect, 0)
				e.makeAvail(0)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, size, false, !tt.noIndir)
			e.mem.regions = append(e.mem.regions, testRegion{region1, make([]byte, 4096)})
			var err error
			e.dev, err = NewDeviceQueue(DeviceQueueConfig{Index: 3, Size: size, Indirect: !tt.noIndir, MaxChainBytes: tt.maxBytes}, e.rings)
			if err != nil {
				t.Fatal(err)
			}
			// A valid chain first, so the failure is not at the start.
			e.setDesc(7, uint64(e.data), 8, 0, 0)
			e.makeAvail(7)
			c := Chain{}
			if ok, err := e.dev.Pop(e.mem, &c); !ok || err != nil {
				t.Fatalf("valid Pop: got (%v, %v), want (true, nil)", ok, err)
			}
			tt.setup(e)
			last := e.dev.LastAvail()

			ok, err := e.dev.Pop(e.mem, &c)
			if ok || err == nil {
				t.Fatalf("Pop: got (%v, %v), want (false, error)", ok, err)
			}
			if !errors.Is(err, ErrBroken) {
				t.Errorf("got %v, want an error matching ErrBroken", err)
			}
			if tt.ring {
				var re *RingError
				if !errors.As(err, &re) {
					t.Fatalf("got %T %v, want *RingError", err, err)
				}
				if re.Reason != tt.reason || re.Queue != 3 {
					t.Errorf("got reason %q queue %d, want %q queue 3", re.Reason, re.Queue, tt.reason)
				}
			} else {
				var de *DescriptorError
				if !errors.As(err, &de) {
					t.Fatalf("got %T %v, want *DescriptorError", err, err)
				}
				if de.Reason != tt.reason || de.Index != tt.index || de.Indirect != tt.indirect || de.Queue != 3 {
					t.Errorf("got reason %q index %d indirect %v queue %d, want %q %d %v 3",
						de.Reason, de.Index, de.Indirect, de.Queue, tt.reason, tt.index, tt.indirect)
				}
			}
			if got := errors.Is(err, errOutside); got != tt.memErr {
				t.Errorf("errors.Is(err, memory error): got %v, want %v", got, tt.memErr)
			}
			if c.Head != 0 || len(c.Readable) != 0 || len(c.Writable) != 0 || c.ReadableLen != 0 || c.WritableLen != 0 {
				t.Errorf("chain after error: got %+v, want empty", c)
			}
			if got := e.dev.LastAvail(); got != last {
				t.Errorf("LastAvail: got %d, want %d", got, last)
			}

			// The queue stays broken, even once the ring is repaired.
			e.setDesc(0, uint64(e.data), 8, 0, 0)
			for i := uint16(0); i < size; i++ {
				binary.LittleEndian.PutUint16(e.rings.Avail[4+2*int(i):], 0)
			}
			abi.StoreUint16(e.rings.Avail, 2, e.dev.LastAvail()+1)
			for i := 0; i < 3; i++ {
				if ok, err2 := e.dev.Pop(e.mem, &c); ok || err2 != err {
					t.Errorf("Pop after break: got (%v, %v), want (false, %v)", ok, err2, err)
				}
			}
			if ok, err2 := e.dev.HasAvail(); ok || err2 != err {
				t.Errorf("HasAvail after break: got (%v, %v), want (false, %v)", ok, err2, err)
			}
			if err2 := e.dev.Push(7, 8); err2 != err {
				t.Errorf("Push after break: got %v, want %v", err2, err)
			}
			if e.dev.NeedsNotify() {
				t.Errorf("NeedsNotify after break: got true, want false")
			}
			if e.dev.Err() != err {
				t.Errorf("Err: got %v, want %v", e.dev.Err(), err)
			}
			if err.Error() == "" {
				t.Errorf("empty error message")
			}
		})
	}
}

// TestChainOfQueueSize checks the boundary: exactly Size descriptors is a
// valid chain, and an indirect table of MaxQueueSize entries too.
func TestChainOfQueueSize(t *testing.T) {
	const size = 8
	e := newEnv(t, size, false, true)
	for i := uint16(0); i < size; i++ {
		e.setDesc(i, uint64(e.data)+uint64(i), 1, DescFNext, i+1)
	}
	e.setDesc(size-1, uint64(e.data), 1, 0, 0)
	e.makeAvail(0)
	var c Chain
	if ok, err := e.dev.Pop(e.mem, &c); !ok || err != nil || len(c.Readable) != size {
		t.Fatalf("Pop: got (%v, %v, %d buffers), want (true, nil, %d)", ok, err, len(c.Readable), size)
	}

	tbl := e.data + 0x10000
	t2 := e.at(tbl, MaxQueueSize*16)
	for i := 0; i < MaxQueueSize; i++ {
		putDesc(t2, uint16(i), uint64(e.data), 1, DescFNext, uint16(i+1))
	}
	putDesc(t2, MaxQueueSize-1, uint64(e.data), 1, 0, 0)
	e.setDesc(1, uint64(tbl), MaxQueueSize*16, DescFIndirect, 0)
	e.makeAvail(1)
	if ok, err := e.dev.Pop(e.mem, &c); !ok || err != nil || c.ReadableLen != MaxQueueSize {
		t.Fatalf("Pop indirect: got (%v, %v, %d bytes), want (true, nil, %d)", ok, err, c.ReadableLen, MaxQueueSize)
	}
}

func TestDriverRejectsBadDevice(t *testing.T) {
	putUsed := func(e *env, slot uint16, id, n uint32, idx uint16) {
		off := 4 + 8*int(slot)
		binary.LittleEndian.PutUint32(e.rings.Used[off:], id)
		binary.LittleEndian.PutUint32(e.rings.Used[off+4:], n)
		abi.StoreUint16(e.rings.Used, 2, idx)
	}
	tests := []struct {
		name   string
		device func(e *env, h0, h1 uint16)
		reason string
		good   int // valid elements before the bad one
	}{
		{"used idx too far", func(e *env, h0, h1 uint16) { putUsed(e, 0, uint32(h0), 0, 3) }, ReasonUsedIdx, 0},
		{"used idx behind", func(e *env, h0, h1 uint16) { putUsed(e, 0, uint32(h0), 0, 0xffff) }, ReasonUsedIdx, 0},
		{"id out of range", func(e *env, h0, h1 uint16) { putUsed(e, 0, 4, 0, 1) }, ReasonUsedID, 0},
		{"id huge", func(e *env, h0, h1 uint16) { putUsed(e, 0, 1<<31, 0, 1) }, ReasonUsedID, 0},
		{"id inside a chain, not a head", func(e *env, h0, h1 uint16) { putUsed(e, 0, uint32(h1)+1, 0, 1) }, ReasonUsedNotInFlight, 0},
		{"id free", func(e *env, h0, h1 uint16) { putUsed(e, 0, 3, 0, 1) }, ReasonUsedNotInFlight, 0},
		{"id twice", func(e *env, h0, h1 uint16) {
			putUsed(e, 0, uint32(h0), 0, 1)
			putUsed(e, 1, uint32(h0), 0, 2)
		}, ReasonUsedNotInFlight, 1},
		{"length above writable", func(e *env, h0, h1 uint16) { putUsed(e, 0, uint32(h1), 17, 1) }, ReasonUsedLen, 0},
		{"length on readable-only chain", func(e *env, h0, h1 uint16) { putUsed(e, 0, uint32(h0), 1, 1) }, ReasonUsedLen, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, 4, false, false)
			h0, err := e.drv.Add([]Buf{{Addr: e.data, Len: 8}})
			if err != nil {
				t.Fatal(err)
			}
			h1, err := e.drv.Add([]Buf{{Addr: e.data, Len: 8}, {Addr: e.data + 8, Len: 16, Writable: true}})
			if err != nil {
				t.Fatal(err)
			}
			tt.device(e, h0, h1)
			for i := 0; i < tt.good; i++ {
				if _, _, ok, err := e.drv.Used(); !ok || err != nil {
					t.Fatalf("valid Used %d: got (%v, %v)", i, ok, err)
				}
			}
			_, _, ok, err := e.drv.Used()
			var re *RingError
			if ok || !errors.As(err, &re) || re.Reason != tt.reason || !errors.Is(err, ErrBroken) {
				t.Fatalf("Used: got (%v, %v), want (false, *RingError %q)", ok, err, tt.reason)
			}
			if _, _, ok, err2 := e.drv.Used(); ok || err2 != err {
				t.Errorf("Used after break: got (%v, %v), want (false, %v)", ok, err2, err)
			}
			if _, err2 := e.drv.Add([]Buf{{Addr: e.data, Len: 1}}); err2 != err {
				t.Errorf("Add after break: got %v, want %v", err2, err)
			}
			if e.drv.Err() != err {
				t.Errorf("Err: got %v, want %v", e.drv.Err(), err)
			}
		})
	}
}
