// Package frontend is a vhost-user front-end written in Go: it does what
// QEMU does for a vhost-user device — memfd guest memory shared with the
// back-end, feature and protocol negotiation in QEMU 10's order, driver-side
// virtqueues with kick and call eventfds. Tests and benchmarks use it to
// play the VM, and containers use it to reach a vrdma device without a VM
// (virtio-user).
//
// Guest memory is one memfd region at guest-physical address 0. Front-end
// virtual addresses (what SET_VRING_ADDR and the memory table's
// userspace_addr carry) are guest-physical addresses plus UserBase: the
// back-end only needs them to be consistent, not to be real addresses in
// this process.
//
// A Frontend is not safe for concurrent use except where a method says so;
// each Queue is used by one goroutine at a time.
package frontend
