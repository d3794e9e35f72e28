package frontend

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// StartDirtyLog turns the back-end's dirty logging on as QEMU does when a
// migration starts (vhost_dev_set_log): a log covering the guest memory,
// one bit per LogPageSize page, in a memfd given with SET_LOG_BASE, then
// SET_FEATURES with VHOST_F_LOG_ALL. It returns the log's bytes, mapped
// until Close. The back-end must offer VHOST_F_LOG_ALL (a device on a
// host NIC does not); logging is started once.
func (f *Frontend) StartDirtyLog() ([]byte, error) {
	if f.DeviceFeatures&virtio.FeatureLogAll == 0 {
		return nil, fmt.Errorf("frontend: the back-end does not offer VHOST_F_LOG_ALL")
	}
	if f.log != nil {
		return nil, fmt.Errorf("frontend: dirty logging is on already")
	}
	pages := (uint64(len(f.Memory())) + memmap.LogPageSize - 1) / memmap.LogPageSize
	size := (pages + 63) / 64 * 8
	fd, err := memmap.NewMemfd("vrdma-frontend-log", size)
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	defer unix.Close(fd)
	log, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("frontend: map the dirty log: %w", err)
	}
	// With LOG_SHMFD the back-end answers SET_LOG_BASE (a u64, 0: the
	// log is in use) whether or not REPLY_ACK asked.
	m, err := f.Call(vu.SetLogBase, vu.LogInfo{MmapSize: size}.Encode(), []int{fd}, true)
	if err != nil {
		unix.Munmap(log)
		return nil, err
	}
	v, err := vu.DecodeU64(m.Payload)
	m.CloseFds()
	if err == nil && v != 0 {
		err = &NackError{Request: vu.SetLogBase, Status: v}
	}
	if err != nil {
		unix.Munmap(log)
		return nil, err
	}
	if err := f.Send(vu.SetFeatures, vu.EncodeU64(f.Features|virtio.FeatureLogAll), nil); err != nil {
		unix.Munmap(log)
		return nil, err
	}
	f.Features |= virtio.FeatureLogAll
	f.log = log
	return log, nil
}
