// Package rdma is the device side of the vrdma device: its config space
// and its control queue, behind the backend.Device interface. The ABI lives
// in package virtio/rdma/abi and docs/spec.md.
//
// Every command is copied out of guest memory once (Chain.Gather into a
// per-device buffer) and only the copy is parsed; a malformed command gets
// an error status and changes nothing.
//
// Objects: the device's PDs, MRs, CQs, QPs, SRQs and AHs live in one
// registry, the engine's (engine.RNIC, registry.go), which also keeps
// their lifetimes (an MR, QP, SRQ or AH holds its PD; a QP holds its CQs
// and its SRQ: DESTROY_SRQ is BUSY while a QP names it; a reset destroys
// SRQs after QPs). QPs are RC, UD (qp_type 4) or the device's one GSI QP
// (qp_type 1: UD addressed as QP 1; BUSY while one exists); CREATE_QP
// takes the 88-byte request and the 80-byte one from before SRQs
// (decodeCreateQP). REG_MR with flags DMA makes a local-only MR over
// guest-physical memory that pins nothing (regDMAMR). A device on a host
// NIC has max_srq 0 and device_caps 0, and answers CREATE_SRQ, a UD, GSI
// or SRQ CREATE_QP and a DMA REG_MR with UNSUPPORTED; CREATE_AH for
// a network sgid and a dgid no device of the daemon owns names a host on
// the network (UD over RoCEv2, docs/wire.md § 12): INVALID across address
// families, UNSUPPORTED where the network does not carry UD. The
// control path validates a command, pins the guest memory it names, and
// adds or removes the object there; the engine finds it there on the data
// path. There is no second table.
//
// Concurrency: the control queue is handled by its worker with the queue
// locked, so the per-device scratch buffers need no lock of their own.
// Device.mu protects the pin accounting, the pinner and the attachment,
// and serialises commands (a command's checks and its registry update are
// one step). Each doorbell queue's worker runs the
// engine for the QPs bound to it (backend/rdma/engine has its own locks).
// Events are posted into the event queue with Queue.Run from any of these
// goroutines, without Device.mu.
//
// Lock order: control-queue lock → Device.mu → engine locks → event-queue
// lock (a leaf); doorbell-queue lock → engine locks → event-queue lock.
//
// PVDMA: REG_MR (but DMA), CREATE_CQ, CREATE_QP and CREATE_SRQ pin exactly the pages they name
// (memmap.Pinner: refcounted, released pages kept in a bounded map cache);
// destroying the object unpins them; a reset or disconnect unpins all.
// Each object's pins are recorded under the object (pin.go), in the region
// mappings of the table it was created on: a later SET_MEM_TABLE,
// ADD_MEM_REG or REM_MEM_REG neither drops them nor lets the object's
// DEREG_MR or DESTROY unpin pages another object holds. The data path
// translates through the current table, as before.
//
// Live upgrade (state.go, state_import.go, quiesce.go): a running vrdmad
// hands each device to a new process and the guest cannot tell. Quiesce
// stops the device's doorbell visits (a visit that finds the device
// quiesced only marks its queue; Unquiesce polls every queue once) and
// publishes what the engine published lazily; ExportState writes the
// device's objects as DeviceState: every object as the parameters of the
// command that created it, plus the engine's state of it (engine/state.go).
// ImportState, in the new process, rebuilds them through the same
// functions that build them for a guest's command (checkRegMR/addMR,
// checkCreateCQ/addCQ, checkCreateSRQ/addSRQ, checkCreateQP/addQP, addAH,
// addPD), with the handles they had (newHandle: engine.RNIC.ClaimHandle),
// so a state is validated exactly as a guest's commands are; it pins the
// pages again in this process (the old process keeps its own pins until
// it exits), registers QP numbers and the GID table on the new fabric,
// leaves every record in guest memory as it is, and on any error destroys
// what it made (destroyAll). FinishImport resolves same-host RC peers by
// dgid once every device is imported, and attaches UD QPs to the network
// again. Transferred: PDs, MRs (DMA MRs too), AHs, CQs (pi, arm state,
// overrun), SRQs (ci, limit), RC and UD QPs whose peers are on this host,
// RC QPs connected over RoCEv2 (the engine's side and the transport's
// rc.ConnState: engine/state_net.go; the network must be frozen for the
// export, and importQP restores the connection after the MRs, on the
// network the new process adopted, frozen until the commit), the GSI QP,
// the GID table, the handle sequence and the counters. Refused with
// ErrNotTransferable: a QP connected by multipath spray (its transport's
// state is not carried yet), memory windows and ALLOC_MR MRs (their
// bindings and fast registrations are not carried yet), a device on a host
// NIC (the NIC's objects belong to the old process). Not carried: the map
// cache of pins released but kept (the new pinner starts empty).
//
// Live migration (migrate.go): the Device is a backend.StateSaver.
// SaveState (every ring stopped) quiesces, exports the same DeviceState in
// a document of its own (MigrationState: format "vrdma-device-state",
// version 1) and runs on. QPs connected over plain RoCEv2 are carried with
// their connections when Suspend held them (the VM stopped while QEMU logs
// dirty pages: engine.RNIC.HoldNet freezes their transports, so that
// nothing arriving changes them or the copied memory); their state is
// marked frozen, the destination restores them frozen and Suspend(false),
// its first ring start, lets them go — the device's own addresses
// (roce_bind, bound with IP_FREEBIND on an incoming device) having moved
// to its host with the VM. The design choice: rather than turn a
// same-host (memory path) connection into a RoCEv2 one at the switch-over
// — two state machines to reconcile, and both daemons to signal — a QP
// that must survive a migration between hosts connects from the device's
// own address, so that it is a RoCEv2 connection from the start (through
// the host's kernel even to a peer on the same vrdmad), and the migration
// carries it as a live upgrade carries one. A memory-path QP to a peer
// not on the destination's host is refused there; a network QP migrating
// between two devices of one vrdmad is refused too (the source holds its
// connection until its front-end goes).
// LoadState decodes the document as hostile input (DecodeMigrationState),
// ImportState's it, FinishImport's it alone, and then
// engine.RNIC.RepointPeers connects the fabric's other QPs that were
// connected to the device's identity: those still pointing at the source
// device's engine on this daemon, and those imported before this device
// (both VMs of a pair migrating).
//
// Same-host migration (identity.go): the destination is a second device
// of the source's UUID on the same fabric, created incoming
// (Config.Incoming): it holds no GID, no QP number and is not registered
// until LoadState takes the identity from the source (engine.Fabric.Handoff:
// its GID table and QP numbers move in one step; a failed load gives them
// back), or, when nobody holds it, its driver starts it. The Device is a
// backend.Suspender: when its front-end stops every ring with the driver
// running (QEMU's stop), Suspend(true) fences it (engine/fence.go: its
// same-host peers hold their RC WQEs, its UD datagrams are dropped) and
// publishes the engine's indices, before the memory is copied; a ring's
// start lifts the fence, a reset ends it. A migrated-out source stays
// fenced, runs no engine pass and refuses commands (its control queue
// breaks); rings started on it again post DEVICE_FATAL. An incoming device
// started without a state while the source holds the identity breaks its
// control queue (ErrIdentityHeld). Device.mu is taken before the fabric's
// locks and the QPs' responder locks (SetFence's barrier).
package rdma
