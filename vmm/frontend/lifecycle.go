package frontend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// The lifecycle sequences QEMU sends, in its order: realize, DRIVER_OK
// (Start), stop, reconnect and reset.

// ErrRefused means the back-end closed the connection without answering
// the first message. vhost-user has no way to say why; vrdmad does it to
// a front-end it refuses: the device is connected to another front-end,
// or --allow-uid leaves this uid out. Its log says which.
var ErrRefused = errors.New("frontend: the back-end refused this front-end")

// Realize performs QEMU's realize-time sequence.
func (f *Frontend) Realize() error {
	var err error
	if f.DeviceFeatures, err = f.callU64(vu.GetFeatures); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			return fmt.Errorf("%w: it closed the connection without answering GET_FEATURES "+
				"(is the device connected to another front-end? vrdmactl device show names its peer): %v", ErrRefused, err)
		}
		return err
	}
	if f.DeviceFeatures&vu.FeatureProtocolFeatures != 0 {
		pf, err := f.callU64(vu.GetProtocolFeatures)
		if err != nil {
			return err
		}
		f.ProtocolFeatures = pf & ProtocolFeatures
		if err := f.Send(vu.SetProtocolFeatures, vu.EncodeU64(f.ProtocolFeatures), nil); err != nil {
			return err
		}
	}
	if f.ProtocolFeatures&vu.ProtocolMQ != 0 {
		n, err := f.callU64(vu.GetQueueNum)
		if err != nil {
			return err
		}
		if n == 0 || n > 1024 {
			return fmt.Errorf("frontend: back-end reports %d queues", n)
		}
		f.NumQueues = int(n)
	} else {
		f.NumQueues = 1
	}
	if f.ProtocolFeatures&vu.ProtocolConfigureMemSlots != 0 {
		if f.MaxMemSlots, err = f.callU64(vu.GetMaxMemSlots); err != nil {
			return err
		}
	}
	if f.ProtocolFeatures&vu.ProtocolBackendReq != 0 {
		if err := f.setupBackendChannel(); err != nil {
			return err
		}
	}
	if err := f.Send(vu.SetOwner, nil, nil); err != nil {
		return err
	}
	if len(f.queues) != f.NumQueues {
		f.queues = make([]*Queue, f.NumQueues)
	}
	for i := range f.queues {
		q := f.queues[i]
		if q == nil {
			q = &Queue{Index: i}
			f.queues[i] = q
		}
		if q.Call == nil {
			if q.Call, err = eventfd.New(); err != nil {
				return err
			}
		}
		if q.Err == nil {
			if q.Err, err = eventfd.New(); err != nil {
				return err
			}
		}
		if err := f.SetVringFile(vu.SetVringCall, i, q.Call); err != nil {
			return err
		}
		if err := f.SetVringFile(vu.SetVringErr, i, q.Err); err != nil {
			return err
		}
	}
	return nil
}

// Reconnect does what QEMU does when its vhost-user back-end went away
// and is back (chardev reconnect): it connects again, repeats realize, and
// restarts the queues the driver had set up, from the used index in guest
// memory — the back-end's last progress — since there was no
// GET_VRING_BASE to ask. Guest memory, rings and eventfds are kept.
func (f *Frontend) Reconnect(ctx context.Context) error {
	f.conn.Close()
	if f.backendConn != nil {
		f.backendConn.Close()
		f.wg.Wait()
		f.backendConn = nil
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", f.cfg.Socket)
	if err != nil {
		return fmt.Errorf("frontend: reconnect: %w", err)
	}
	f.conn = vu.NewConn(c.(*net.UnixConn))
	f.sent = 0
	if err := f.Realize(); err != nil {
		return err
	}
	var qs []int
	for _, q := range f.queues {
		if q.DriverQueue != nil {
			q.base = abi.LoadUint16(q.rings.Used, 2)
			q.started = false
			qs = append(qs, q.Index)
		}
	}
	return f.Start(qs...)
}

// Start performs QEMU's DRIVER_OK sequence for the given queues (the others
// are left unset, as QEMU skips queues the guest did not set up):
// SET_FEATURES, SET_MEM_TABLE, per queue SET_VRING_NUM, SET_VRING_BASE,
// SET_VRING_ADDR, SET_VRING_KICK, then SET_VRING_ENABLE(1) each, and
// SET_STATUS. Rings are allocated in guest memory on first start and kept
// (with their indices) across Stop/Start.
func (f *Frontend) Start(queues ...int) error {
	// VHOST_F_LOG_ALL is offered by a back-end that logs its writes, and
	// acked by QEMU only while it migrates the guest (dirty logging on):
	// never as a device feature of a start.
	feat := f.DeviceFeatures &^ (vu.FeatureProtocolFeatures | virtio.FeatureLogAll)
	if f.cfg.Features != 0 {
		feat &= f.cfg.Features
	}
	f.Features = feat
	if f.DeviceFeatures&vu.FeatureProtocolFeatures != 0 {
		feat |= vu.FeatureProtocolFeatures
	}
	if err := f.Send(vu.SetFeatures, vu.EncodeU64(feat), nil); err != nil {
		return err
	}
	if err := f.SetMemTable(); err != nil {
		return err
	}
	for _, i := range queues {
		if i < 0 || i >= len(f.queues) {
			return fmt.Errorf("frontend: queue %d out of range", i)
		}
		if err := f.startQueue(f.queues[i]); err != nil {
			return err
		}
	}
	for _, i := range queues {
		if f.ProtocolFeatures != 0 {
			if err := f.Send(vu.SetVringEnable, vu.VringState{Index: uint32(i), Num: 1}.Encode(), nil); err != nil {
				return err
			}
		}
	}
	if f.ProtocolFeatures&vu.ProtocolStatus != 0 {
		st := uint64(virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK | virtio.StatusDriverOK)
		if err := f.Send(vu.SetStatus, vu.EncodeU64(st), nil); err != nil {
			return err
		}
	}
	return nil
}

func (f *Frontend) startQueue(q *Queue) error {
	n := f.cfg.QueueSize
	if q.DriverQueue == nil {
		dAddr, d, err := f.Alloc(virtio.DescTableSize(n), 4096)
		if err != nil {
			return err
		}
		aAddr, a, err := f.Alloc(virtio.AvailRingSize(n), virtio.AvailAlign)
		if err != nil {
			return err
		}
		uAddr, u, err := f.Alloc(virtio.UsedRingSize(n), 4096)
		if err != nil {
			return err
		}
		dq, err := virtio.NewDriverQueue(virtio.DriverQueueConfig{Size: n, EventIdx: f.Features&virtio.FeatureEventIdx != 0},
			virtio.Rings{Desc: d, Avail: a, Used: u})
		if err != nil {
			return err
		}
		q.DriverQueue, q.desc, q.avail, q.used = dq, dAddr, aAddr, uAddr
		q.rings = virtio.Rings{Desc: d, Avail: a, Used: u}
	}
	var err error
	if q.Kick == nil {
		if q.Kick, err = eventfd.New(); err != nil {
			return err
		}
	}
	i := uint32(q.Index)
	if err := f.Send(vu.SetVringNum, vu.VringState{Index: i, Num: uint32(n)}.Encode(), nil); err != nil {
		return err
	}
	if err := f.Send(vu.SetVringBase, vu.VringState{Index: i, Num: uint32(q.base)}.Encode(), nil); err != nil {
		return err
	}
	addr := vu.VringAddr{Index: i, Desc: uint64(q.desc) + UserBase, Avail: uint64(q.avail) + UserBase, Used: uint64(q.used) + UserBase}
	if err := f.Send(vu.SetVringAddr, addr.Encode(), nil); err != nil {
		return err
	}
	if err := f.SetVringFile(vu.SetVringKick, q.Index, q.Kick); err != nil {
		return err
	}
	q.started = true
	return nil
}

// Stop performs QEMU's stop sequence for the started queues:
// SET_VRING_ENABLE(0) each, then GET_VRING_BASE each. It returns the bases.
func (f *Frontend) Stop() (map[int]uint32, error) {
	bases := map[int]uint32{}
	for _, q := range f.queues {
		if q.started && f.ProtocolFeatures != 0 {
			if err := f.Send(vu.SetVringEnable, vu.VringState{Index: uint32(q.Index), Num: 0}.Encode(), nil); err != nil {
				return nil, err
			}
		}
	}
	for _, q := range f.queues {
		if !q.started {
			continue
		}
		m, err := f.Call(vu.GetVringBase, vu.VringState{Index: uint32(q.Index)}.Encode(), nil, true)
		if err != nil {
			return nil, err
		}
		st, err := vu.DecodeVringState(m.Payload)
		m.CloseFds()
		if err != nil {
			return nil, err
		}
		bases[q.Index] = st.Num
		q.base = uint16(st.Num)
		q.started = false
	}
	return bases, nil
}

// ResetDevice sends RESET_DEVICE; queues must be set up again with Start.
func (f *Frontend) ResetDevice() error {
	for _, q := range f.queues {
		q.started = false
		q.DriverQueue = nil
		q.base = 0
		q.Kick.Close()
		q.Kick = nil
	}
	return f.Send(vu.ResetDevice, nil, nil)
}
