package virtio

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Fuzz input layout:
//
//	[0]    log2(queue size) (mod 5: sizes 1..16)
//	[1]    bit 0 EVENT_IDX, bit 1 INDIRECT_DESC
//	[2:4]  LastAvail
//	[4]    MaxChainBytes selector: 0 default, else value*16
//	then   descriptor table (16*size), available ring (6+2*size),
//	       guest memory (the rest, at most fuzzMemMax bytes) at fuzzMemBase,
//	       followed by an adjacent 64-byte region.
const (
	fuzzHdr     = 5
	fuzzMemBase = abi.GPA(0x1000)
	fuzzMemMax  = 4096
)

// fuzzSeed builds a valid input: a queue of 4 with a direct chain of two
// buffers (readable, writable) and an indirect chain of two buffers.
func fuzzSeed() []byte {
	const size = 4
	b := make([]byte, fuzzHdr)
	b[0] = 2    // size 4
	b[1] = 0b11 // EVENT_IDX, INDIRECT
	desc := make([]byte, 16*size)
	putDesc(desc, 0, uint64(fuzzMemBase), 16, DescFNext, 1)
	putDesc(desc, 1, uint64(fuzzMemBase)+16, 16, DescFWrite, 0)
	putDesc(desc, 2, uint64(fuzzMemBase)+64, 32, DescFIndirect, 0)
	avail := make([]byte, 6+2*size)
	binary.LittleEndian.PutUint16(avail[2:], 2) // idx
	binary.LittleEndian.PutUint16(avail[4:], 0)
	binary.LittleEndian.PutUint16(avail[6:], 2)
	mem := make([]byte, 128)
	for i := range 32 {
		mem[i] = byte(i)
	}
	putDesc(mem[64:], 0, uint64(fuzzMemBase), 8, DescFNext, 1)
	putDesc(mem[64:], 1, uint64(fuzzMemBase)+32, 8, DescFWrite, 0)
	b = append(b, desc...)
	b = append(b, avail...)
	return append(b, mem...)
}

// fuzzSetup builds a device queue and guest memory from fuzz input.
func fuzzSetup(t *testing.T, data []byte) (q *DeviceQueue, mem *testMemory, bound uint64, ok bool) {
	if len(data) < fuzzHdr {
		return nil, nil, 0, false
	}
	size := uint16(1) << (data[0] % 5)
	eventIdx := data[1]&1 != 0
	indirect := data[1]&2 != 0
	lastAvail := binary.LittleEndian.Uint16(data[2:4])
	maxBytes := uint64(data[4]) * 16
	rest := data[fuzzHdr:]

	ram := alignedBytes(1<<16, 4096)
	rings := ringsIn(ram, size)
	rest = rest[copy(rings.Desc, rest):]
	rest = rest[copy(rings.Avail, rest):]
	if len(rest) > fuzzMemMax {
		rest = rest[:fuzzMemMax]
	}
	memA := append([]byte(nil), rest...)
	memB := make([]byte, 64)
	mem = &testMemory{regions: []testRegion{
		{fuzzMemBase, memA},
		{fuzzMemBase + abi.GPA(len(memA)), memB},
	}}
	q, err := NewDeviceQueue(DeviceQueueConfig{Size: size, EventIdx: eventIdx, Indirect: indirect, LastAvail: lastAvail, MaxChainBytes: maxBytes}, rings)
	if err != nil {
		t.Fatalf("NewDeviceQueue: %v", err)
	}
	bound = maxBytes
	if bound == 0 {
		bound = 1<<32 - 1
	}
	return q, mem, bound, true
}

func TestFuzzSeedIsValid(t *testing.T) {
	q, mem, _, _ := fuzzSetup(t, fuzzSeed())
	var c Chain
	for i, want := range []uint64{16, 8} {
		if ok, err := q.Pop(mem, &c); !ok || err != nil || c.ReadableLen != want || c.WritableLen != want {
			t.Fatalf("Pop %d: got (%v, %v, %d/%d), want (true, nil, %d/%d)", i, ok, err, c.ReadableLen, c.WritableLen, want, want)
		}
	}
	if ok, err := q.Pop(mem, &c); ok || err != nil {
		t.Fatalf("third Pop: got (%v, %v), want (false, nil)", ok, err)
	}
}

func FuzzPop(f *testing.F) {
	f.Add(fuzzSeed())
	f.Fuzz(func(t *testing.T, data []byte) {
		q, mem, bound, ok := fuzzSetup(t, data)
		if !ok {
			return
		}
		size := q.Size()
		var c Chain
		scratch := make([]byte, 256)
		for i := 0; i < 2*int(size)+2; i++ {
			ok, err := q.Pop(mem, &c)
			if err != nil {
				if ok || !errors.Is(err, ErrBroken) {
					t.Fatalf("Pop: got (%v, %v), want (false, error matching ErrBroken)", ok, err)
				}
				if c.Head != 0 || len(c.Readable) != 0 || len(c.Writable) != 0 || c.ReadableLen != 0 || c.WritableLen != 0 {
					t.Fatalf("chain after error: got %+v, want empty", c)
				}
				if ok, err2 := q.Pop(mem, &c); ok || !errors.Is(err2, ErrBroken) {
					t.Fatalf("Pop after break: got (%v, %v)", ok, err2)
				}
				if _, err2 := q.HasAvail(); !errors.Is(err2, ErrBroken) {
					t.Fatalf("HasAvail after break: got %v", err2)
				}
				if q.Err() == nil {
					t.Fatal("Err after break: got nil")
				}
				return
			}
			if !ok {
				if has, err := q.HasAvail(); has || err != nil {
					t.Fatalf("HasAvail after empty Pop: got (%v, %v)", has, err)
				}
				return
			}
			if c.Head >= size {
				t.Fatalf("Head %d >= size %d", c.Head, size)
			}
			var rl, wl uint64
			for _, b := range c.Readable {
				if !mem.contains(b) {
					t.Fatalf("readable buffer of %d bytes outside guest memory", len(b))
				}
				rl += uint64(len(b))
			}
			for _, b := range c.Writable {
				if !mem.contains(b) {
					t.Fatalf("writable buffer of %d bytes outside guest memory", len(b))
				}
				wl += uint64(len(b))
			}
			if rl != c.ReadableLen || wl != c.WritableLen {
				t.Fatalf("lengths: got %d/%d, buffers sum to %d/%d", c.ReadableLen, c.WritableLen, rl, wl)
			}
			if rl+wl > bound {
				t.Fatalf("chain of %d bytes above bound %d", rl+wl, bound)
			}
			if n := len(c.Readable) + len(c.Writable); n > int(size)+MaxQueueSize {
				t.Fatalf("chain of %d buffers", n)
			}
			c.Gather(scratch)
			c.Scatter(scratch)
			if err := q.Push(c.Head, uint32(min(wl, 1<<32-1))); err != nil {
				t.Fatalf("Push: %v", err)
			}
			q.NeedsNotify()
		}
		// More than size+1 successful pops: impossible, the avail index
		// is fixed and at most size ahead.
		t.Fatalf("Pop succeeded %d times on a queue of %d", 2*int(size)+2, size)
	})
}
