package virtio

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// payload fills b with the pattern for request seq (tag distinguishes the
// request from the response).
func payload(b []byte, seq uint64, tag byte) {
	binary.LittleEndian.PutUint64(b, seq)
	for i := 8; i < len(b); i++ {
		b[i] = byte(seq>>(i%8)) ^ byte(i) ^ tag
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// TestConcurrent runs a driver and a device in two goroutines over the same
// rings for 100k requests, with notification suppression deciding every
// kick and interrupt: a lost wake-up shows up as a timeout.
func TestConcurrent(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector does not see the ring atomics (assembly), so shared-ring traffic looks racy")
	}
	for _, eventIdx := range []bool{false, true} {
		t.Run(fmt.Sprintf("eventidx=%v", eventIdx), func(t *testing.T) {
			const (
				total   = 100000
				bufLen  = 32
				size    = 64
				slots   = size / 2
				timeout = 10 * time.Second
			)
			e := newEnv(t, size, eventIdx, false)
			kick := make(chan struct{}, 1)
			call := make(chan struct{}, 1)
			var wg sync.WaitGroup
			devErr := make(chan error, 1)

			wg.Add(1)
			go func() { // device
				defer wg.Done()
				var c Chain
				in := make([]byte, bufLen)
				want := make([]byte, bufLen)
				out := make([]byte, bufLen)
				for seq := uint64(0); seq < total; {
					ok, err := e.dev.Pop(e.mem, &c)
					if err != nil {
						devErr <- err
						return
					}
					if !ok {
						e.dev.EnableNotify()
						if has, err := e.dev.HasAvail(); err != nil || has {
							e.dev.DisableNotify()
							continue
						}
						select {
						case <-kick:
						case <-time.After(timeout):
							devErr <- fmt.Errorf("device: no kick for %v at request %d (lost wake-up)", timeout, seq)
							return
						}
						e.dev.DisableNotify()
						continue
					}
					payload(want, seq, 0)
					if n := c.Gather(in); n != bufLen || !bytes.Equal(in, want) {
						devErr <- fmt.Errorf("device: request %d: got %x, want %x", seq, in[:n], want)
						return
					}
					payload(out, seq, 0xa5)
					if n := c.Scatter(out); n != bufLen {
						devErr <- fmt.Errorf("device: request %d: scattered %d, want %d", seq, n, bufLen)
						return
					}
					if err := e.dev.Push(c.Head, bufLen); err != nil {
						devErr <- err
						return
					}
					if e.dev.NeedsNotify() {
						signal(call)
					}
					seq++
				}
				devErr <- nil
			}()

			// driver
			type req struct {
				seq  uint64
				slot int
			}
			var inflight [size]req
			free := make([]int, 0, slots)
			for i := 0; i < slots; i++ {
				free = append(free, i)
			}
			bufs := make([]Buf, 2)
			want := make([]byte, bufLen)
			var sent, done uint64
			deadline := time.Now().Add(2 * time.Minute)
			consume := func() bool {
				head, written, ok, err := e.drv.Used()
				if err != nil {
					t.Fatalf("driver: Used: %v", err)
				}
				if !ok {
					return false
				}
				r := inflight[head]
				if r.seq != done || written != bufLen {
					t.Fatalf("driver: got request %d written %d, want %d written %d", r.seq, written, done, bufLen)
				}
				payload(want, r.seq, 0xa5)
				if got := e.at(e.data+abi.GPA(r.slot*2*bufLen+bufLen), bufLen); !bytes.Equal(got, want) {
					t.Fatalf("driver: request %d: response %x, want %x", r.seq, got, want)
				}
				free = append(free, r.slot)
				done++
				return true
			}
			for done < total {
				if time.Now().After(deadline) {
					t.Fatalf("driver: timed out at %d/%d", done, total)
				}
				for sent < total && len(free) > 0 {
					slot := free[len(free)-1]
					addr := e.data + abi.GPA(slot*2*bufLen)
					payload(e.at(addr, bufLen), sent, 0)
					clear(e.at(addr+bufLen, bufLen))
					bufs[0] = Buf{Addr: addr, Len: bufLen}
					bufs[1] = Buf{Addr: addr + bufLen, Len: bufLen, Writable: true}
					head, err := e.drv.Add(bufs)
					if err != nil {
						t.Fatalf("driver: Add: %v", err)
					}
					free = free[:len(free)-1]
					inflight[head] = req{seq: sent, slot: slot}
					sent++
				}
				if e.drv.NeedsKick() {
					signal(kick)
				}
				progressed := false
				for consume() {
					progressed = true
				}
				if progressed {
					continue
				}
				e.drv.EnableInterrupts()
				if consume() {
					e.drv.DisableInterrupts()
					continue
				}
				select {
				case <-call:
				case err := <-devErr:
					if err != nil {
						t.Fatal(err)
					}
					devErr <- nil
				case <-time.After(timeout):
					t.Fatalf("driver: no interrupt for %v at %d/%d (lost wake-up)", timeout, done, total)
				}
				e.drv.DisableInterrupts()
			}
			wg.Wait()
			if err := <-devErr; err != nil {
				t.Fatal(err)
			}
			if got := e.dev.LastAvail(); got != uint16(total%65536) {
				t.Errorf("LastAvail: got %d, want %d", got, uint16(total%65536))
			}
		})
	}
}
