package memmap

// UVA is a virtual address in the front-end's (QEMU's) address space, as
// vhost-user SET_VRING_ADDR and the memory table's userspace_addr use.
type UVA uint64
