package virtio

import "github.com/vrdma/vrdma/virtio/rdma/abi"

// FeatureLogAll is VHOST_F_LOG_ALL (bit 26), the vhost feature a
// vhost-user back-end offers when it marks every guest page it writes in
// the front-end's dirty log; the front-end acks it while it migrates the
// guest. It is never a feature of the virtio device the guest sees.
const FeatureLogAll uint64 = 1 << 26

// DirtyMarker is a Memory that logs writes (*memmap.Table): MarkDirty
// marks the guest pages of [gpa, gpa+n) in its dirty log, if it has one.
// Chain.Scatter calls it for every buffer it writes.
type DirtyMarker interface {
	MarkDirty(gpa abi.GPA, n uint64)
}

// UsedLog is told of every store a DeviceQueue makes into its used ring
// (used elements, used.idx, used.flags, avail_event), after the store:
// n bytes at byte offset off of the ring. The vhost-user back-end marks
// them in the dirty log at the ring's log address (VHOST_VRING_F_LOG).
type UsedLog interface {
	LogUsed(off, n uint64)
}
