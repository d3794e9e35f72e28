package frontend

import (
	"fmt"
	"time"

	"github.com/vrdma/vrdma/virtio"
)

// scratchSize bounds a request or response passed through Exec.
const scratchSize = 64 << 10

// Exec places req (device-readable) and a device-writable buffer of
// respLen bytes on queue qi as one chain, kicks, waits for the device to
// return it and gives back what the device wrote. It is the synchronous
// command path a driver's control queue needs.
func (f *Frontend) Exec(qi int, req []byte, respLen int, timeout time.Duration) ([]byte, error) {
	if len(req) > scratchSize || respLen > scratchSize || respLen < 0 {
		return nil, fmt.Errorf("frontend: command of %d/%d bytes too large", len(req), respLen)
	}
	if f.scratch == nil {
		gpa, b, err := f.Alloc(2*scratchSize, 4096)
		if err != nil {
			return nil, err
		}
		f.scratchGPA, f.scratch = gpa, b
	}
	q := f.queues[qi]
	copy(f.scratch, req)
	resp := f.scratch[scratchSize : scratchSize+respLen]
	clear(resp)
	bufs := []virtio.Buf{{Addr: f.scratchGPA, Len: uint32(len(req))}}
	if respLen > 0 {
		bufs = append(bufs, virtio.Buf{Addr: f.scratchGPA + scratchSize, Len: uint32(respLen), Writable: true})
	}
	head, err := q.Add(bufs)
	if err != nil {
		return nil, err
	}
	if err := q.Notify(); err != nil {
		return nil, err
	}
	spin := f.cfg.Spin
	if spin == 0 {
		spin = 20 * time.Microsecond
	}
	q.SpinUsed(spin)
	h, n, err := q.WaitUsed(timeout)
	if err != nil {
		return nil, err
	}
	if h != head {
		return nil, fmt.Errorf("frontend: device returned chain %d, want %d", h, head)
	}
	if int(n) > respLen {
		return nil, fmt.Errorf("frontend: device claims %d bytes written into %d", n, respLen)
	}
	out := make([]byte, n)
	copy(out, resp)
	return out, nil
}
