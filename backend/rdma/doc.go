// Package rdma is the device side of the vrdma device: its config space
// and its control queue, behind the backend.Device interface. The ABI lives
// in package virtio/rdma and docs/spec.md.
//
// Every command is copied out of guest memory once (Chain.Gather into a
// per-device buffer) and only the copy is parsed; a malformed command gets
// an error status and changes nothing.
//
// Concurrency: the control queue is handled by its worker with the queue
// locked, so the per-device scratch buffers need no lock of their own.
// Device.mu protects the attached host.
package rdma
