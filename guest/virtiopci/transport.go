package virtiopci

import (
	"errors"
	"fmt"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

var _ verbs.Transport = (*Transport)(nil)

// maxConfigRetries bounds the re-reads when config_generation changes
// under a read.
const maxConfigRetries = 64

// ReadConfig reads n bytes of device config space at off, consistently:
// "drivers MUST NOT assume reads from fields greater than 32 bits wide are
// atomic ... read config_generation before and after".
func (d *Transport) ReadConfig(off, n int) ([]byte, error) {
	if off < 0 || n < 0 || uint64(off)+uint64(n) > uint64(d.devcfg.Len()) {
		return nil, fmt.Errorf("pci: config read [%d, +%d) outside %d bytes", off, n, d.devcfg.Len())
	}
	d.cmdMu.Lock()
	defer d.cmdMu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	out := make([]byte, n)
	for range maxConfigRetries {
		gen := d.common.Read8(ccConfigGeneration)
		for i := 0; i < n; {
			o := uint32(off + i)
			if o%4 == 0 && n-i >= 4 {
				v := d.devcfg.Read32(o)
				out[i], out[i+1], out[i+2], out[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
				i += 4
				continue
			}
			out[i] = d.devcfg.Read8(o)
			i++
		}
		if d.common.Read8(ccConfigGeneration) == gen {
			return out, nil
		}
	}
	return nil, fmt.Errorf("pci: config space kept changing: %w", ErrDevice)
}

// Command runs one control command on queue 0, polling for the answer. A
// command that times out leaves its chain with the device, so the device
// refuses further commands.
func (d *Transport) Command(req []byte, respLen int) ([]byte, error) {
	if len(req) == 0 || len(req) > scratchSize || respLen < 0 || respLen > scratchSize {
		return nil, fmt.Errorf("pci: command of %d/%d bytes: %w", len(req), respLen, verbs.ErrInvalid)
	}
	d.cmdMu.Lock()
	defer d.cmdMu.Unlock()
	if d.closed {
		return nil, verbs.ErrClosed
	}
	if d.broken != nil {
		return nil, fmt.Errorf("pci: control queue unusable: %w", d.broken)
	}
	q := d.queues[abi.ControlQueue]
	copy(d.scratch.Buf, req)
	resp := d.scratch.Buf[scratchSize : scratchSize+respLen]
	clear(resp)
	bufs := []virtio.Buf{{Addr: d.scratch.Addr, Len: uint32(len(req))}}
	if respLen > 0 {
		bufs = append(bufs, virtio.Buf{Addr: d.scratch.Addr + scratchSize, Len: uint32(respLen), Writable: true})
	}
	head, err := q.dq.Add(bufs)
	if err != nil {
		return nil, fmt.Errorf("pci: control queue: %w", err)
	}
	if q.dq.NeedsKick() {
		d.kick(q)
	}
	deadline := time.Now().Add(d.timeout)
	var b backoff
	for {
		h, n, ok, err := q.dq.Used()
		if err != nil {
			d.broken = err
			return nil, fmt.Errorf("pci: control queue: %w", err)
		}
		if ok {
			if h != head {
				d.broken = fmt.Errorf("device returned chain %d, want %d: %w", h, head, ErrDevice)
				return nil, d.broken
			}
			out := make([]byte, n)
			copy(out, resp)
			return out, nil
		}
		if !time.Now().Before(deadline) {
			d.broken = fmt.Errorf("no answer in %v: %w", d.timeout, ErrTimeout)
			return nil, fmt.Errorf("pci: command: %w", verbs.ErrTimeout)
		}
		b.wait(deadline)
	}
}

// AllocDMA allocates zeroed hugepage-backed memory.
func (d *Transport) AllocDMA(size, align uint64) (verbs.DMABuf, error) {
	return d.dma.Alloc(size, align)
}

// FreeDMA gives DMA memory back.
func (d *Transport) FreeDMA(b verbs.DMABuf) { d.dma.Free(b) }

// doorbell returns doorbell queue i, or nil.
func (d *Transport) doorbell(i int) *queue {
	if i < 0 || i >= len(d.queues)-abi.FirstDoorbellQueue {
		return nil
	}
	return d.queues[abi.FirstDoorbellQueue+i]
}

// Notify notifies doorbell queue i (virtqueue 2+i); doorbell queues carry
// no descriptors.
func (d *Transport) Notify(i int) error {
	q := d.doorbell(i)
	if q == nil {
		return fmt.Errorf("pci: doorbell queue %d of %d: %w", i, len(d.queues)-abi.FirstDoorbellQueue, verbs.ErrInvalid)
	}
	d.kick(q)
	return nil
}

// Polling reports the NO_NOTIFY bit of doorbell queue i's used ring flags.
func (d *Transport) Polling(i int) bool {
	q := d.doorbell(i)
	if q == nil {
		return false
	}
	return abi.LoadUint16(q.rings.Used, 0)&virtio.UsedFNoNotify != 0
}

// WaitEvent returns the next event, polling up to timeout; the buffer is
// posted again at once.
func (d *Transport) WaitEvent(timeout time.Duration) (abi.Event, error) {
	d.evMu.Lock()
	defer d.evMu.Unlock()
	q := d.queues[abi.EventQueue]
	deadline := time.Now().Add(timeout)
	var b backoff
	for {
		h, n, ok, err := q.dq.Used()
		if err != nil {
			return abi.Event{}, fmt.Errorf("pci: event queue: %w", err)
		}
		if ok {
			return d.takeEvent(q, h, n)
		}
		if !time.Now().Before(deadline) {
			return abi.Event{}, fmt.Errorf("pci: event queue: %w", verbs.ErrTimeout)
		}
		b.wait(deadline)
	}
}

// takeEvent copies the event out of chain h and reposts its buffer.
// Precondition: evMu held.
func (d *Transport) takeEvent(q *queue, h uint16, n uint32) (abi.Event, error) {
	s := d.slotOf[h]
	d.slotOf[h] = -1
	if s < 0 {
		return abi.Event{}, fmt.Errorf("pci: event chain %d carries no buffer: %w", h, ErrDevice)
	}
	var raw [abi.EventSize]byte
	copy(raw[:], d.evBuf.Buf[s*abi.EventSize:])
	var ev abi.Event
	uerr := abi.Unmarshal(raw[:], &ev)
	if err := d.postEvent(s); err != nil {
		return abi.Event{}, err
	}
	if q.dq.NeedsKick() {
		d.kick(q)
	}
	if n != abi.EventSize {
		return abi.Event{}, fmt.Errorf("%w: event of %d bytes", verbs.ErrProtocol, n)
	}
	if uerr != nil {
		return abi.Event{}, uerr
	}
	return ev, nil
}

// Close resets the device (so it stops using guest memory), then unmaps
// the DMA memory and the BARs. It is idempotent.
func (d *Transport) Close() error {
	d.cmdMu.Lock()
	defer d.cmdMu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	d.evMu.Lock()
	defer d.evMu.Unlock()
	var errs []error
	if err := d.reset(); err != nil {
		// The device may still write the rings: keep the memory.
		errs = append(errs, err)
	} else {
		errs = append(errs, d.dma.Close())
	}
	for i := len(d.release) - 1; i >= 0; i-- {
		errs = append(errs, d.release[i]())
	}
	return errors.Join(errs...)
}
