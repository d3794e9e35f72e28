// Package virtio holds the virtio basics both sides of a vrdma device share —
// feature bits, device status bits, split-virtqueue layout — and the two ends
// of a split virtqueue (virtio 1.2 §2.7, "Split Virtqueues"):
//
//   - DeviceQueue is the device side, used by the vhost-user back-end. It pops
//     descriptor chains the driver made available, translating every buffer
//     through a Memory (the back-end's memory table), pushes used elements,
//     and implements notification suppression with and without
//     VIRTIO_F_EVENT_IDX. It must survive a hostile guest.
//   - DriverQueue is the driver side, used by the Go front-end that plays the
//     guest in tests and by the guest-side library. It does not trust the
//     device either.
//
// # Non-goals
//
// Packed virtqueues (VIRTIO_F_RING_PACKED), VIRTIO_F_IN_ORDER and
// VIRTIO_F_NOTIFICATION_DATA semantics, legacy (pre-1.0) layouts and
// big-endian rings, and the transport (kicks and interrupts are the caller's:
// the queues only say whether the other side wants one). The package never
// maps memory and uses no unsafe: ring fields shared with the other side are
// read and written through the atomic accessors of package virtio/rdma/abi.
//
// # Invariants
//
//   - Every field the other side writes is read once: ring indices, flags and
//     event indices with an atomic load; a descriptor or used element is
//     copied whole into a local value, and only the copy is validated and used.
//   - Every loop over guest-controlled data is bounded: a chain has at most
//     Size descriptors in the ring and at most len/16 (≤ MaxQueueSize) in an
//     indirect table, which also ends loops.
//   - Every buffer is translated whole (Memory.Slice over its full length,
//     within one region) after its address+length was checked for overflow,
//     and the chain's total length is bounded (MaxChainBytes).
//   - A malformed ring or chain breaks the queue: the method returns a
//     *DescriptorError or *RingError, both matching ErrBroken, and every later
//     call fails with that error until the queue is recreated. Nothing panics
//     on guest input. Caller mistakes (bad sizes, misaligned rings, a Push of
//     an out-of-range head) return errors matching ErrInvalid and do not
//     break the queue.
//   - Publication order: a used element (resp. available entry) is written
//     before the used (resp. available) index; the index store is
//     sequentially consistent, so it is also the full barrier needed before
//     reading the other side's event index or flags.
//   - Steady-state Pop, Push, Add and Used allocate nothing.
//
// # Concurrency and lock order
//
// There are no locks. A DeviceQueue is owned by one worker goroutine and a
// DriverQueue by one caller at a time; the other side of the ring runs
// concurrently (in another goroutine, process or guest) and synchronises only
// through the ring indices.
package virtio
