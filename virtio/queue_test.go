package virtio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

func TestLayout(t *testing.T) {
	tests := []struct {
		n                 uint16
		desc, avail, used uint64
	}{
		{1, 16, 8, 14},
		{4, 64, 14, 38},
		{256, 4096, 518, 2054},
		{MaxQueueSize, 524288, 65542, 262150},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.n), func(t *testing.T) {
			if got := DescTableSize(tt.n); got != tt.desc {
				t.Errorf("DescTableSize: got %d, want %d", got, tt.desc)
			}
			if got := AvailRingSize(tt.n); got != tt.avail {
				t.Errorf("AvailRingSize: got %d, want %d", got, tt.avail)
			}
			if got := UsedRingSize(tt.n); got != tt.used {
				t.Errorf("UsedRingSize: got %d, want %d", got, tt.used)
			}
		})
	}
}

func TestNeedEvent(t *testing.T) {
	tests := []struct {
		event, new, old uint16
		want            bool
	}{
		{0, 1, 0, true},
		{0, 2, 1, false},
		{5, 10, 0, true},
		{10, 10, 0, false},
		{9, 10, 9, true},
		{0xffff, 0, 0xffff, true},
		{0xffff, 1, 0xfffe, true},
		{3, 3, 3, false},
	}
	for _, tt := range tests {
		if got := needEvent(tt.event, tt.new, tt.old); got != tt.want {
			t.Errorf("needEvent(%d, %d, %d): got %v, want %v", tt.event, tt.new, tt.old, got, tt.want)
		}
	}
}

func TestNewQueueValidation(t *testing.T) {
	ram := alignedBytes(1<<20, 4096)
	good := ringsIn(ram, 8)
	tests := []struct {
		name  string
		size  uint16
		rings Rings
	}{
		{"size zero", 0, good},
		{"size not power of two", 6, good},
		{"size not power of two max", 65535, good},
		{"short desc", 8, Rings{good.Desc[:127], good.Avail, good.Used}},
		{"short avail", 8, Rings{good.Desc, good.Avail[:21], good.Used}},
		{"short used", 8, Rings{good.Desc, good.Avail, good.Used[:69]}},
		{"nil used", 8, Rings{good.Desc, good.Avail, nil}},
		{"misaligned desc", 8, Rings{ram[8:200], good.Avail, good.Used}},
		{"misaligned avail", 8, Rings{good.Desc, ram[1001:1100], good.Used}},
		{"misaligned used", 8, Rings{good.Desc, good.Avail, ram[1002:1100]}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if q, err := NewDeviceQueue(DeviceQueueConfig{Size: tt.size}, tt.rings); !errors.Is(err, ErrInvalid) || q != nil {
				t.Errorf("NewDeviceQueue: got (%v, %v), want (nil, ErrInvalid)", q, err)
			}
			if q, err := NewDriverQueue(DriverQueueConfig{Size: tt.size}, tt.rings); !errors.Is(err, ErrInvalid) || q != nil {
				t.Errorf("NewDriverQueue: got (%v, %v), want (nil, ErrInvalid)", q, err)
			}
		})
	}
	t.Run("max size", func(t *testing.T) {
		r := ringsIn(alignedBytes(1<<20, 4096), MaxQueueSize)
		if _, err := NewDriverQueue(DriverQueueConfig{Size: MaxQueueSize}, r); err != nil {
			t.Fatalf("NewDriverQueue: %v", err)
		}
		if _, err := NewDeviceQueue(DeviceQueueConfig{Size: MaxQueueSize}, r); err != nil {
			t.Fatalf("NewDeviceQueue: %v", err)
		}
	})
	t.Run("set rings", func(t *testing.T) {
		q, err := NewDeviceQueue(DeviceQueueConfig{Size: 8}, good)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.SetRings(Rings{good.Desc, good.Avail, good.Used[:10]}); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetRings(short): got %v, want ErrInvalid", err)
		}
	})
}

// fill writes a recognisable pattern.
func fill(b []byte, seed int) {
	for i := range b {
		b[i] = byte(seed*31 + i*7 + 1)
	}
}

func TestRoundTrip(t *testing.T) {
	type layout struct {
		read, write []uint32 // buffer lengths
		indirect    bool
	}
	layouts := map[string]layout{
		"direct one readable":  {read: []uint32{100}},
		"direct one writable":  {write: []uint32{64}},
		"direct multi":         {read: []uint32{10, 0, 300}, write: []uint32{7, 500}},
		"indirect":             {read: []uint32{33, 44}, write: []uint32{55, 66, 77}, indirect: true},
		"indirect only write":  {write: []uint32{128}, indirect: true},
		"direct full queue 16": {read: []uint32{1, 2, 3, 4, 5, 6, 7, 8}, write: []uint32{9, 10, 11, 12, 13, 14, 15, 16}},
	}
	for name, l := range layouts {
		for _, eventIdx := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/eventidx=%v", name, eventIdx), func(t *testing.T) {
				e := newEnv(t, 16, eventIdx, true)
				for round := 0; round < 40; round++ {
					var bufs []Buf
					gpa := e.data
					var want []byte
					for _, n := range l.read {
						fill(e.at(gpa, int(n)), round+int(n))
						want = append(want, e.at(gpa, int(n))...)
						bufs = append(bufs, Buf{Addr: gpa, Len: n})
						gpa += abi.GPA(n) + 13
					}
					var wbufs [][]byte
					var wtotal uint32
					for _, n := range l.write {
						clear(e.at(gpa, int(n)))
						wbufs = append(wbufs, e.at(gpa, int(n)))
						bufs = append(bufs, Buf{Addr: gpa, Len: n, Writable: true})
						gpa += abi.GPA(n) + 5
						wtotal += n
					}
					var head uint16
					var err error
					if l.indirect {
						tbl := e.data + 0x80000
						head, err = e.drv.AddIndirect(tbl, e.at(tbl, 16*len(bufs)), bufs)
					} else {
						head, err = e.drv.Add(bufs)
					}
					if err != nil {
						t.Fatalf("round %d: add: %v", round, err)
					}
					var c Chain
					ok, err := e.dev.Pop(e.mem, &c)
					if !ok || err != nil {
						t.Fatalf("round %d: Pop: got (%v, %v), want (true, nil)", round, ok, err)
					}
					if c.Head != head {
						t.Errorf("Head: got %d, want %d", c.Head, head)
					}
					if c.ReadableLen != uint64(len(want)) {
						t.Errorf("ReadableLen: got %d, want %d", c.ReadableLen, len(want))
					}
					if c.WritableLen != uint64(wtotal) {
						t.Errorf("WritableLen: got %d, want %d", c.WritableLen, wtotal)
					}
					got := make([]byte, len(want)+10)
					if n := c.Gather(got); n != len(want) || !bytes.Equal(got[:n], want) {
						t.Errorf("Gather: got %d bytes %x, want %x", n, got[:n], want)
					}
					resp := make([]byte, wtotal)
					fill(resp, round+1000)
					if n := c.Scatter(resp); n != int(wtotal) {
						t.Errorf("Scatter: got %d, want %d", n, wtotal)
					}
					if err := e.dev.Push(c.Head, wtotal); err != nil {
						t.Fatalf("Push: %v", err)
					}
					if ok, err := e.dev.Pop(e.mem, &c); ok || err != nil {
						t.Fatalf("second Pop: got (%v, %v), want (false, nil)", ok, err)
					}
					h, w, ok, err := e.drv.Used()
					if !ok || err != nil || h != head || w != wtotal {
						t.Fatalf("Used: got (%d, %d, %v, %v), want (%d, %d, true, nil)", h, w, ok, err, head, wtotal)
					}
					var gotResp []byte
					for _, b := range wbufs {
						gotResp = append(gotResp, b...)
					}
					if !bytes.Equal(gotResp, resp) {
						t.Errorf("writable buffers: got %x, want %x", gotResp, resp)
					}
					if _, _, ok, err := e.drv.Used(); ok || err != nil {
						t.Fatalf("second Used: got (%v, %v), want (false, nil)", ok, err)
					}
					if e.drv.Free() != int(e.drv.Size()) {
						t.Fatalf("Free: got %d, want %d", e.drv.Free(), e.drv.Size())
					}
				}
				if got, want := e.dev.LastAvail(), uint16(40); got != want {
					t.Errorf("LastAvail: got %d, want %d", got, want)
				}
			})
		}
	}
}

func TestGatherScatterPartial(t *testing.T) {
	c := Chain{
		Readable: [][]byte{{1, 2, 3}, {4, 5}},
		Writable: [][]byte{make([]byte, 2), make([]byte, 3)},
	}
	dst := make([]byte, 4)
	if n := c.Gather(dst); n != 4 || !bytes.Equal(dst, []byte{1, 2, 3, 4}) {
		t.Errorf("Gather: got %d %v, want 4 [1 2 3 4]", n, dst)
	}
	if n := c.Scatter([]byte{9, 8, 7}); n != 3 || !bytes.Equal(c.Writable[0], []byte{9, 8}) || c.Writable[1][0] != 7 {
		t.Errorf("Scatter short: got %d %v", n, c.Writable)
	}
	if n := c.Scatter([]byte{1, 1, 1, 1, 1, 1, 1}); n != 5 {
		t.Errorf("Scatter long: got %d, want 5", n)
	}
	if n := c.Gather(nil); n != 0 {
		t.Errorf("Gather(nil): got %d, want 0", n)
	}
}

func TestDriverAddErrors(t *testing.T) {
	e := newEnv(t, 4, false, false)
	if _, err := e.drv.Add(nil); !errors.Is(err, ErrInvalid) {
		t.Errorf("Add(nil): got %v, want ErrInvalid", err)
	}
	if _, err := e.drv.Add([]Buf{{Addr: e.data, Len: 1, Writable: true}, {Addr: e.data, Len: 1}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Add(readable after writable): got %v, want ErrInvalid", err)
	}
	if _, err := e.drv.Add([]Buf{{Addr: ^abi.GPA(0), Len: 2}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Add(overflow): got %v, want ErrInvalid", err)
	}
	five := make([]Buf, 5)
	if _, err := e.drv.Add(five); !errors.Is(err, ErrQueueFull) {
		t.Errorf("Add(5 on size 4): got %v, want ErrQueueFull", err)
	}
	if _, err := e.drv.Add(five[:3]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.drv.Add(five[:2]); !errors.Is(err, ErrQueueFull) {
		t.Errorf("Add(2 with 1 free): got %v, want ErrQueueFull", err)
	}
	if got := e.drv.Free(); got != 1 {
		t.Errorf("Free: got %d, want 1", got)
	}
	if _, err := e.drv.AddIndirect(e.data, make([]byte, 16), five[:2]); !errors.Is(err, ErrInvalid) {
		t.Errorf("AddIndirect(short table): got %v, want ErrInvalid", err)
	}
	if _, err := e.drv.Add(five[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.drv.AddIndirect(e.data, make([]byte, 16), five[:1]); !errors.Is(err, ErrQueueFull) {
		t.Errorf("AddIndirect(full): got %v, want ErrQueueFull", err)
	}
	if err := e.dev.Push(4, 0); !errors.Is(err, ErrInvalid) {
		t.Errorf("Push(4) on size 4: got %v, want ErrInvalid", err)
	}
	if e.dev.Err() != nil {
		t.Errorf("caller error broke the queue: %v", e.dev.Err())
	}
}

// TestRestart checks that a new device queue continues from SET_VRING_BASE
// and the used index in the ring, as after a back-end reconnect.
func TestRestart(t *testing.T) {
	e := newEnv(t, 8, true, false)
	bufs := []Buf{{Addr: e.data, Len: 8}}
	for i := 0; i < 3; i++ {
		if _, err := e.drv.Add(bufs); err != nil {
			t.Fatal(err)
		}
	}
	var c Chain
	for i := 0; i < 2; i++ {
		if ok, err := e.dev.Pop(e.mem, &c); !ok || err != nil {
			t.Fatalf("Pop: %v %v", ok, err)
		}
		if err := e.dev.Push(c.Head, 0); err != nil {
			t.Fatal(err)
		}
	}
	dev2, err := NewDeviceQueue(DeviceQueueConfig{Index: 3, Size: 8, EventIdx: true, LastAvail: e.dev.LastAvail()}, e.rings)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := dev2.Pop(e.mem, &c); !ok || err != nil || c.Head != 2 {
		t.Fatalf("Pop after restart: got (%v, %v, head %d), want (true, nil, 2)", ok, err, c.Head)
	}
	if err := dev2.Push(c.Head, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, _, ok, err := e.drv.Used(); !ok || err != nil {
			t.Fatalf("Used %d: got (%v, %v)", i, ok, err)
		}
	}
	// SetRings onto a copy of the rings keeps the state.
	cp := ringsIn(alignedBytes(1<<16, 4096), 8)
	copy(cp.Desc, e.rings.Desc)
	copy(cp.Avail, e.rings.Avail)
	copy(cp.Used, e.rings.Used)
	if err := dev2.SetRings(cp); err != nil {
		t.Fatal(err)
	}
	if ok, err := dev2.HasAvail(); ok || err != nil {
		t.Errorf("HasAvail after SetRings: got (%v, %v), want (false, nil)", ok, err)
	}
}

func TestNotifySuppression(t *testing.T) {
	for _, eventIdx := range []bool{false, true} {
		t.Run(fmt.Sprintf("eventidx=%v", eventIdx), func(t *testing.T) {
			e := newEnv(t, 8, eventIdx, false)
			one := []Buf{{Addr: e.data, Len: 4}}
			add := func() {
				t.Helper()
				if _, err := e.drv.Add(one); err != nil {
					t.Fatal(err)
				}
			}
			var c Chain
			var heads []uint16
			pop := func() {
				t.Helper()
				if ok, err := e.dev.Pop(e.mem, &c); !ok || err != nil {
					t.Fatalf("Pop: got (%v, %v)", ok, err)
				}
				heads = append(heads, c.Head)
			}
			push := func() {
				t.Helper()
				if err := e.dev.Push(heads[0], 0); err != nil {
					t.Fatal(err)
				}
				heads = heads[1:]
			}
			used := func() {
				t.Helper()
				if _, _, ok, err := e.drv.Used(); !ok || err != nil {
					t.Fatalf("Used: got (%v, %v)", ok, err)
				}
			}

			// Driver -> device: kicks.
			if e.drv.NeedsKick() {
				t.Errorf("NeedsKick with nothing added: got true, want false")
			}
			e.dev.EnableNotify()
			add()
			if !e.drv.NeedsKick() {
				t.Errorf("NeedsKick after EnableNotify: got false, want true")
			}
			add()
			if got, want := e.drv.NeedsKick(), !eventIdx; got != want {
				// With EVENT_IDX the device asked for one kick at
				// avail_event; it was already sent.
				t.Errorf("NeedsKick for second add: got %v, want %v", got, want)
			}
			pop()
			pop()
			e.dev.DisableNotify()
			add()
			if e.drv.NeedsKick() {
				t.Errorf("NeedsKick after DisableNotify: got true, want false")
			}
			pop()
			e.dev.EnableNotify()
			if ok, err := e.dev.HasAvail(); ok || err != nil {
				t.Errorf("HasAvail: got (%v, %v), want (false, nil)", ok, err)
			}
			add()
			if !e.drv.NeedsKick() {
				t.Errorf("NeedsKick after re-enable: got false, want true")
			}
			pop()

			// Device -> driver: interrupts. Four chains are popped and
			// not yet pushed.
			if e.dev.NeedsNotify() {
				t.Errorf("NeedsNotify with nothing pushed: got true, want false")
			}
			e.drv.EnableInterrupts()
			push()
			if !e.dev.NeedsNotify() {
				t.Errorf("NeedsNotify after EnableInterrupts: got false, want true")
			}
			push()
			if got, want := e.dev.NeedsNotify(), !eventIdx; got != want {
				// With EVENT_IDX the driver asked for one interrupt at
				// used_event and has not consumed since.
				t.Errorf("NeedsNotify for second push before driver consumed: got %v, want %v", got, want)
			}
			used()
			used()
			e.drv.DisableInterrupts()
			push()
			if e.dev.NeedsNotify() {
				t.Errorf("NeedsNotify after DisableInterrupts: got true, want false")
			}
			used()
			e.drv.EnableInterrupts()
			push()
			if !e.dev.NeedsNotify() {
				t.Errorf("NeedsNotify after re-enable: got false, want true")
			}
			used()
			if e.dev.NeedsNotify() {
				t.Errorf("NeedsNotify with nothing new pushed: got true, want false")
			}
		})
	}
}

func TestWrapAround(t *testing.T) {
	const ops = 70000
	for _, eventIdx := range []bool{false, true} {
		for _, indirect := range []bool{false, true} {
			t.Run(fmt.Sprintf("eventidx=%v/indirect=%v", eventIdx, indirect), func(t *testing.T) {
				e := newEnv(t, 4, eventIdx, indirect)
				var c Chain
				bufs := make([]Buf, 0, 4)
				out := make([]byte, 16)
				inflight := make(map[uint16]int)
				next := 0 // next request to add
				done := 0
				for done < ops {
					// Fill the queue with chains of 1..3 descriptors.
					for next < ops {
						n := next%3 + 1
						bufs = bufs[:0]
						slot := abi.GPA(next%8) * 64
						in := e.at(e.data+slot, 8)
						fill(in, next)
						bufs = append(bufs, Buf{Addr: e.data + slot, Len: 8})
						for k := 1; k < n; k++ {
							bufs = append(bufs, Buf{Addr: e.data + slot + abi.GPA(8*k), Len: 8, Writable: true})
						}
						var head uint16
						var err error
						if indirect {
							tbl := e.data + 0x10000 + abi.GPA(next%8)*64
							head, err = e.drv.AddIndirect(tbl, e.at(tbl, 64), bufs)
						} else {
							head, err = e.drv.Add(bufs)
						}
						if errors.Is(err, ErrQueueFull) {
							break
						}
						if err != nil {
							t.Fatalf("add %d: %v", next, err)
						}
						inflight[head] = next
						next++
					}
					e.drv.NeedsKick()
					for {
						ok, err := e.dev.Pop(e.mem, &c)
						if err != nil {
							t.Fatalf("Pop: %v", err)
						}
						if !ok {
							break
						}
						req := inflight[c.Head]
						want := make([]byte, 8)
						fill(want, req)
						if n := c.Gather(out); n != 8 || !bytes.Equal(out[:8], want) {
							t.Fatalf("request %d: Gather got %x, want %x", req, out[:n], want)
						}
						if err := e.dev.Push(c.Head, uint32(c.WritableLen)); err != nil {
							t.Fatal(err)
						}
					}
					e.dev.NeedsNotify()
					for {
						head, w, ok, err := e.drv.Used()
						if err != nil {
							t.Fatalf("Used: %v", err)
						}
						if !ok {
							break
						}
						req, found := inflight[head]
						if !found || req != done {
							t.Fatalf("Used: got head %d (request %d, found %v), want request %d", head, req, found, done)
						}
						if want := uint32(8 * (req % 3)); w != want {
							t.Fatalf("Used: written %d, want %d", w, want)
						}
						delete(inflight, head)
						done++
					}
				}
				if got, want := e.dev.LastAvail(), uint16(ops%65536); got != want {
					t.Errorf("LastAvail: got %d, want %d", got, want)
				}
				if e.drv.Free() != 4 {
					t.Errorf("Free: got %d, want 4", e.drv.Free())
				}
			})
		}
	}
}

func TestNoAllocs(t *testing.T) {
	e := newEnv(t, 64, true, true)
	bufs := []Buf{{Addr: e.data, Len: 64}, {Addr: e.data + 64, Len: 32}, {Addr: e.data + 128, Len: 64, Writable: true}}
	var c Chain
	tbl := e.data + 0x1000
	step := func(indirect bool) {
		var err error
		if indirect {
			_, err = e.drv.AddIndirect(tbl, e.at(tbl, 48), bufs)
		} else {
			_, err = e.drv.Add(bufs)
		}
		if err != nil {
			t.Fatal(err)
		}
		e.drv.NeedsKick()
		if ok, err := e.dev.Pop(e.mem, &c); !ok || err != nil {
			t.Fatalf("Pop: %v %v", ok, err)
		}
		if err := e.dev.Push(c.Head, 64); err != nil {
			t.Fatal(err)
		}
		e.dev.NeedsNotify()
		if _, _, ok, err := e.drv.Used(); !ok || err != nil {
			t.Fatalf("Used: %v %v", ok, err)
		}
	}
	for _, indirect := range []bool{false, true} {
		step(indirect) // warm up: grows the chain's slices
		if n := testing.AllocsPerRun(1000, func() { step(indirect) }); n != 0 {
			t.Errorf("indirect=%v: got %v allocations per round trip, want 0", indirect, n)
		}
	}
}

func BenchmarkPopPush(b *testing.B) {
	const size = 4096
	e := newEnv(b, 256, true, false)
	bufs := []Buf{{Addr: e.data, Len: size}, {Addr: e.data + size, Len: size, Writable: true}}
	var c Chain
	b.ReportAllocs()
	b.SetBytes(size)
	b.ResetTimer()
	for b.Loop() {
		if _, err := e.drv.Add(bufs); err != nil {
			b.Fatal(err)
		}
		if ok, err := e.dev.Pop(e.mem, &c); !ok || err != nil {
			b.Fatal(ok, err)
		}
		if err := e.dev.Push(c.Head, size); err != nil {
			b.Fatal(err)
		}
		e.dev.NeedsNotify()
		if _, _, ok, err := e.drv.Used(); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// TestUsedFlagStoredOnChange: SetUsedFlagNoNotify writes the used ring's
// flags only when the flag changes (and once after the rings are set), so
// an engine calling it on every pass does not keep writing the cache line
// the driver reads.
func TestUsedFlagStoredOnChange(t *testing.T) {
	ram := alignedBytes(1<<20, 4096)
	r := ringsIn(ram, 8)
	q, err := NewDeviceQueue(DeviceQueueConfig{Size: 8}, r)
	if err != nil {
		t.Fatal(err)
	}
	flags := func() uint16 { return binary.LittleEndian.Uint16(r.Used[0:]) }
	q.SetUsedFlagNoNotify(false) // first call: stored even though the shadow agrees
	r.Used[0] = 0xee             // the driver scribbles the word
	q.SetUsedFlagNoNotify(false)
	if flags() != 0xee {
		t.Errorf("unchanged flag stored again: %#x", flags())
	}
	q.SetUsedFlagNoNotify(true)
	if flags() != UsedFNoNotify {
		t.Errorf("changed flag: %#x, want %#x", flags(), UsedFNoNotify)
	}
	r.Used[0] = 0
	q.SetUsedFlagNoNotify(true)
	if flags() != 0 {
		t.Errorf("unchanged flag stored again: %#x", flags())
	}
	// New rings (a memory table change): stored once more.
	if err := q.SetRings(r); err != nil {
		t.Fatal(err)
	}
	q.SetUsedFlagNoNotify(true)
	if flags() != UsedFNoNotify {
		t.Errorf("after SetRings: %#x, want %#x", flags(), UsedFNoNotify)
	}
}
