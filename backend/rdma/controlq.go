package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The control queue's worker: commands run in order, each answered in the
// chain that carried it.

// errNoRoom is a control chain whose writable part cannot hold a response
// header.
var errNoRoom = errors.New("control response buffer too small")

// handleControl runs the commands waiting on the control queue, in order.
// When none is left it answers (Notify) and polls for the next one for
// ControlSpin, yielding the processor between looks, before it returns to
// sleep on the kick eventfd. The loop is bounded: a queue holds at most its
// size in chains, Pop fails on an index that jumps further, and the spin
// ends ControlSpin after the last command.
func (d *Device) handleControl(q *backend.Queue) error {
	if err := d.serving(); err != nil {
		// An incoming device started without a migration state while
		// the source runs, or a migrated-out one: its driver may not
		// make objects under an identity another device holds. The
		// ring breaks (the session logs why); nothing is answered.
		return fmt.Errorf("rdma: control queue: %w", err)
	}
	var idle time.Time
	for !q.Stopping() {
		ok, err := q.Pop(&d.chain)
		if err != nil {
			return err
		}
		if !ok {
			q.Notify()
			now := time.Now()
			if idle.IsZero() {
				idle = now
			}
			if now.Sub(idle) >= d.cfg.ControlSpin {
				return nil
			}
			runtime.Gosched()
			continue
		}
		idle = time.Time{}
		n := d.execute(&d.chain, q.Memory())
		if err := q.Push(d.chain.Head, n); err != nil {
			return err
		}
	}
	return nil
}

// execute runs one command and writes its response; it returns the bytes
// written. The request is copied out of guest memory once and only the copy
// is looked at.
func (d *Device) execute(c *virtio.Chain, t *memmap.Table) uint32 {
	d.commands.Add(1)
	if c.WritableLen < abi.RespHeaderSize {
		d.errors.Add(1)
		d.log.WithError(errNoRoom).Warn("control command dropped")
		return 0
	}
	var st abi.Status
	var payload []byte
	if !d.admitCommand() {
		st = abi.StatusQuota
	} else if c.ReadableLen > maxRequest || c.ReadableLen < abi.CmdHeaderSize {
		st = abi.StatusInvalid
	} else {
		d.req = scratch(d.req, int(c.ReadableLen))
		req := d.req[:c.Gather(d.req)]
		var h abi.CmdHeader
		_ = abi.Unmarshal(req[:abi.CmdHeaderSize], &h)
		op := abi.Opcode(h.Opcode)
		if h.Flags != 0 || h.Reserved != 0 {
			st = abi.StatusInvalid
		} else {
			payload, st = d.command(op, req[abi.CmdHeaderSize:], t)
		}
		if st != abi.StatusOK {
			d.log.WithFields(logrus.Fields{"cmd": op.String(), "status": st.String()}).Debug("control command failed")
		}
	}
	if st == abi.StatusOK && uint64(abi.RespHeaderSize+len(payload)) > c.WritableLen {
		st, payload = abi.StatusInvalid, nil
	}
	if st != abi.StatusOK {
		d.errors.Add(1)
		payload = nil
	}
	d.resp = scratch(d.resp, abi.RespHeaderSize+len(payload))
	resp := d.resp[:abi.RespHeaderSize+len(payload)]
	binary.LittleEndian.PutUint32(resp[0:], uint32(st))
	binary.LittleEndian.PutUint32(resp[4:], 0)
	copy(resp[abi.RespHeaderSize:], payload)
	return uint32(c.Scatter(resp))
}

// minScratch is the least a control scratch buffer is allocated with: most
// commands and responses fit, so a device that sees only those allocates
// each buffer once.
const minScratch = 512

// scratch returns buf if it holds n bytes, else a new buffer of at least n
// bytes (the next power of two, at least minScratch); n is bounded by
// maxRequest or maxResponse.
func scratch(buf []byte, n int) []byte {
	if len(buf) >= n {
		return buf
	}
	size := minScratch
	for size < n {
		size *= 2
	}
	return make([]byte, size)
}

// admitCommand takes a token from the command-rate bucket. Precondition:
// the control queue is locked.
func (d *Device) admitCommand() bool {
	rate := float64(d.cfg.MaxCommandsPerSec)
	if rate <= 0 {
		return true
	}
	now := time.Now()
	if d.tokensAt.IsZero() {
		d.tokens = rate
	} else {
		d.tokens = min(rate, d.tokens+now.Sub(d.tokensAt).Seconds()*rate)
	}
	d.tokensAt = now
	if d.tokens < 1 {
		return false
	}
	d.tokens--
	return true
}
