// Package virtiopci is the guest's user-space virtio-pci driver for the
// vrdma device: a virtio-pci modern transport (virtio 1.2 §4.1 "Virtio
// Over PCI Bus") driven from user space as root, and Transport, the
// verbs.Transport of the verbs library (guest/verbs) over it. Only programs
// that run inside a guest use it (cmd/vrdma-guest); the host reaches a
// device through vhost-user instead (backend, vmm/frontend).
//
// Linux has no driver for virtio device 42, so a guest program opens the
// device itself: Open enables memory and bus mastering by writing the
// command register through /sys/bus/pci/devices/X/config, walks the
// capability list for the common, notification and device structures,
// mmaps the BARs they name through sysfs resourceN, and runs the
// initialisation sequence (reset, ACKNOWLEDGE, DRIVER, features,
// FEATURES_OK, every virtqueue, DRIVER_OK). DMA memory comes from 2 MiB
// hugepages (MAP_HUGETLB, mlocked) whose guest-physical addresses are read
// from /proc/self/pagemap.
//
// Non-goals: interrupts (everything polls: control commands, events; no
// MSI-X vectors are assigned), legacy and transitional devices, packed
// rings, the PCI_CFG access window, VFIO, other device types' config.
// No kernel driver may be bound to the device: never load virtio_pci.
// Nothing of the host: guest-physical addresses and ring atomics come from
// virtio/rdma/abi, never from memmap, backend/... or vmm/...
// (internal/layout's test enforces it).
//
// Invariants:
//   - Registers are reached only through Regs windows whose bounds were
//     checked against the BAR at Open; an access outside reads all ones
//     and writes nothing. MMIO is one plain MOV of the register's width
//     (mmio_amd64.s); nothing else in the package uses unsafe except for
//     taking a hugepage's virtual address for pagemap.
//   - Config space is copied once, then parsed (ParseCaps); the walk is
//     bounded and detects loops.
//   - Allocations up to 2 MiB never straddle a hugepage and are physically
//     contiguous; larger ones carry a 4 KiB page table (verbs.DMABuf.Pages)
//     unless their hugepages happen to be contiguous. Rings, the control
//     scratch and event buffers are always contiguous.
//   - Every queue the device has is set up (QEMU's generic vhost-user
//     device starts only queues with a descriptor address).
//   - Used elements are checked by virtio.DriverQueue; a malformed one
//     breaks the control queue for good, never panics.
//
// Lock order: Transport.cmdMu before Transport.evMu (only Close takes both);
// DMA.mu is a leaf.
package virtiopci
