// Package hostnic is the "verbs" RNIC: a port of the host's RDMA NIC
// (ConnectX, erdma, rxe: any device rdma-core drives), reached through
// libibverbs (package ibv, loaded at run time), on which a vrdma device's
// work runs instead of on the software RNIC. vrdmad --rnic
// verbs:DEVICE[:PORT] (or "rnic" in the control API) gives a device one.
//
// # What maps to what
//
// The device model stays the virtio device's (backend/rdma, engine): the
// control commands, the limits and quotas, the rings and records in guest
// memory, the CQEs and events. engine/nic.go is the seam; this package is
// the NIC side of it:
//
//   - a guest PD is a host PD, so the NIC keeps one tenant's MRs from
//     another's QPs, as it keeps two processes apart;
//   - a guest MR is ibv_reg_mr_iova2 over a host view of the MR's pages
//     (memmap.View: the guest's scattered pages mapped back to back in one
//     host range, no copy) with the IOVA the guest registered, so the
//     guest's SGEs, remote addresses and keys reach the NIC unchanged and
//     the NIC's own translation table maps them: no vIOMMU, no translation
//     per WQE in vrdmad. The lkey and rkey the guest sees are the NIC's;
//   - a guest CQ is a host CQ on the NIC's completion channel, kept armed;
//     its events wake the device's doorbell queues, whose passes poll it
//     and write the guest's CQEs;
//   - a guest QP is a host RC QP whose number the guest sees; MODIFY_QP is
//     ibv_modify_qp with the device's port and a RoCE v2 GRH whose sgid
//     index is the host's index of the guest's GID.
//
// Pinning stays on demand (PVDMA): REG_MR pins exactly the MR's pages
// (memmap's pinner, its quota and pinned_bytes) and the NIC pins them
// again for its registration; nothing is pinned at boot. The map cache
// keeps the pins of deregistered MRs, not NIC registrations: a cached
// registration would keep a live rkey for memory the guest deregistered.
//
// # Sharing a NIC
//
// Open returns one NIC per host port for the whole process: every device
// on it shares one rdma-core context, one completion channel (one
// goroutine waits on it and re-arms each CQ that fired) and one async
// event goroutine (port events are logged; QP errors reach the guest
// through their error completions). Tenants are apart by PD on the NIC and
// by GID on the network: a device sends only from the port's GIDs within
// the addresses its operator assigned it (all of the port's RoCE v2 GIDs
// when none are: a single-tenant host). The NIC itself does not stop one
// tenant's QP from addressing another's QPN on the wire; the network does
// (GIDs per tenant, VLANs), as it does for SR-IOV functions.
//
// # Cost
//
// Per WQE vrdmad reads and validates the guest's WQE, converts it and
// posts it in a chain of up to 64 (one ibv_post_send per pass); per
// completion it converts the host's WC into the guest's CQE. Stats
// counts the posts and the host CPU time spent in ibv_post_send/recv, so
// the per-WQE cost on a real NIC can be projected (docs/benchmarks.md).
//
// Non-goals (for now): UD QPs and SRQs (the device has none yet), memory
// windows, ODP, dma-buf MRs, several ports per device, re-registering an
// MR's view when the guest's memory table changes under it (a front-end
// that moves its memory under live MRs leaves them on the old pages of
// the same file).
package hostnic
