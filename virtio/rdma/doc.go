// Package rdma is the para-virtual RDMA device type: its ABI (config space,
// control commands, statuses; docs/spec.md is the normative text and tests
// hold the two together) and, on top of it, the driver-side verbs library.
//
// The ABI is little-endian and fixed-size. Wire structures are plain Go
// structs of fixed-size fields in declaration order, so encoding/binary
// lays them out exactly as the specification's tables do.
package rdma

// # Verbs library
//
// On top of the ABI sits a driver-side verbs library shaped like
// libibverbs: Open a Context over a Transport (vmm/frontend's virtio-user
// transport on the host; the guest's virtio-pci later), then AllocPD,
// AllocBuffer + RegMR, CreateCQ, CreateQP, ConnectRC (or Modify), PostSend,
// PostRecv, Poll, ReqNotify + GetCQEvent.
//
// Non-goals: UD QPs and address handles (version 1 of the device has RC
// only), shared receive queues, memory windows, on-demand paging.
//
// Invariants:
//   - Rings, CQEs and doorbell records live in DMA memory the device also
//     writes. The library reads the device's indices (cq pi, qp sq_ci/rq_ci)
//     with memmap.LoadUint32 and publishes its own (ci, sq_pi, rq_pi) with
//     memmap.StoreUint32 (sequentially consistent: release plus a full
//     barrier). The producer indices the library writes are kept in host
//     memory and never read back; an index the device moves beyond the
//     ring is ErrProtocol, not a panic.
//   - Posting writes every WQE, then the producer index, then a fence, then
//     reads the doorbell queue's NO_NOTIFY flag and notifies only when it
//     is clear (docs/spec.md, "Doorbell queues and the data path").
//   - A post is all or nothing: WRs are checked and the free slots counted
//     before anything is written (ErrInvalid, ErrQueueFull).
//   - PostSend, PostRecv and Poll allocate nothing in steady state.
//   - A command that fails leaves no resource behind: DMA memory allocated
//     for it is freed; a non-OK status is a *CommandError wrapping Status.
//   - DMABuf.PageAddrs and DMABuf.GPA are the only places that turn buffer
//     offsets into guest-physical addresses, so a transport whose buffers
//     are not physically contiguous changes only them.
//
// Lock order: Context.cmdMu and Context.evMu are taken alone; a QP's sqMu
// or rqMu and a CQ's mu are leaf locks (never held across a command);
// Context.objMu is a leaf lock.
