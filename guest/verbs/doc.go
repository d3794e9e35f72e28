// Package verbs is the driver side of the vrdma device: a verbs library
// shaped like libibverbs. Open a Context over a Transport, then AllocPD,
// AllocBuffer + RegMR, CreateCQ, CreateQP, ConnectRC (or Modify), PostSend,
// PostRecv, Poll, ReqNotify + GetCQEvent. Shared receive queues (CreateSRQ,
// SRQ.PostRecv, ArmLimit, the SRQ_LIMIT_REACHED event) and UD QPs
// (QPInitAttr.Type, ReadyUD, CreateAH, SendWR's AH, RemoteQPN and
// RemoteQKey, ParseGRH for the 40 bytes in front of a datagram) follow
// docs/spec.md's CREATE_SRQ and "Semantics (UD)". It speaks the device ABI of
// package virtio/rdma/abi (docs/spec.md is the normative text): attributes,
// scatter/gather entries, events and every number (access flags, opcodes,
// QP states, completion statuses) are the ABI's types and constants
// (abi.QPAttr, abi.SGE, abi.Event, abi.AccessLocalWrite, abi.WROpSend, …),
// and a refused command is a *CommandError that unwraps to its abi.Status.
//
// Two transports implement Transport: guest/virtiopci inside a VM (the
// device's virtio-pci function driven from user space) and vmm/frontend on
// the host (a vhost-user "virtio-user" front-end, for tests, benchmarks and
// containers). Both hand out DMA memory addressed by abi.GPA.
//
// Non-goals: memory windows, on-demand paging, resizing an SRQ (its ring
// is sized at CreateSRQ); and anything of the host: the package never
// imports memmap, backend/... or vmm/... (internal/layout's test enforces
// it), so the guest program links no host code.
//
// Invariants:
//   - Rings, CQEs and doorbell records live in DMA memory the device also
//     writes. The library reads the device's indices (cq pi, qp sq_ci/rq_ci,
//     srq ci) with abi.LoadUint32 and publishes its own (ci, sq_pi, rq_pi,
//     srq pi) with abi.StoreUint32 (sequentially consistent: release plus a
//     full barrier). The producer indices the library writes are kept in host
//     memory and never read back; an index the device moves beyond the
//     ring is ErrProtocol, not a panic.
//   - Posting writes every WQE, then the producer index, then a fence, then
//     reads the doorbell queue's NO_NOTIFY flag and notifies only when it
//     is clear (docs/spec.md, "Doorbell queues and the data path").
//     Receives (a QP's, with RQ_NOTIFY, and an SRQ's) take that step only
//     while the record's notify word is 1.
//   - A post is all or nothing: WRs are checked and the free slots counted
//     before anything is written (ErrInvalid, ErrQueueFull).
//   - PostSend, PostRecv and Poll allocate nothing in steady state.
//   - A command that fails leaves no resource behind: DMA memory allocated
//     for it is freed; a non-OK status is a *CommandError wrapping the abi.Status.
//   - DMABuf.PageAddrs and DMABuf.GPA are the only places that turn buffer
//     offsets into guest-physical addresses, so a transport whose buffers
//     are not physically contiguous changes only them.
//
// Lock order: Context.cmdMu and Context.evMu are taken alone; a QP's sqMu
// or rqMu, an SRQ's mu and a CQ's mu are leaf locks (never held across a command);
// Context.objMu is a leaf lock.
package verbs
