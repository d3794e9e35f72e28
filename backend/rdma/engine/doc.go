// Package engine is the software RNIC embedded in vrdmad: it executes RC
// and UD work requests directly between the guest memories of two
// devices, with receive WQEs from a QP's own receive queue or from a
// shared receive queue (SRQ).
//
// The control path (package backend/rdma) builds the objects (MR, CQ, QP, SRQ)
// from control commands and registers them with the device's RNIC; RNICs
// register on a daemon-wide Fabric by GID, so a QP reaches its peer by (GID, QP
// number). The Fabric also keeps each device's GID table (ADD_GID and
// DEL_GID fill it; entry 0 starts as the port GID): a peer is found by any
// GID of its table, and a GID belongs to one device. The engine reads send WQEs from the guest's rings, checks keys,
// PDs, access rights and bounds as docs/spec.md § Semantics requires,
// copies between the two guests' memories with copy() over host views
// (no intermediate buffer, no allocation per WQE), writes CQEs and raises
// events (CQ_COMPLETION, CQ_ERROR, QP_FATAL) through an EventSink.
//
// # Other hosts
//
// A fabric may have a Network (Fabric.SetNetwork; package roce/udp carries
// it as RoCEv2). The GIDs of the host addresses it sends from are every
// device's network GIDs (entries 1, 2, … of its table, shared by all
// devices rather than owned, or a device's own: RNIC.SetNetGIDs). At
// INIT→RTR a dgid that no device of the fabric owns, from an sgid_index
// naming a network GID, connects the QP through the Network: a transport
// (rc.Conn; network.go) made in RTR, started at RTR→RTS, closed when the
// QP flushes (ERR: its outstanding WQEs complete first, with WR_FLUSH_ERR),
// resets or is destroyed (nothing completes then). The requester's pass
// posts such a QP's WQEs to the transport instead of running them: the WQE
// is copied (SGEs checked, MRs resolved, inline bytes kept), sq_ci
// advances, and the completion comes later from the transport's goroutine
// (SendDone), in posting order; a WQE that fails its local checks while
// others are outstanding waits for them, so completions keep that order.
// Incoming requests reach the QP through the same object (rc.Host): keys
// are checked against the QP's PD and access flags as on this host,
// receive WQEs are consumed under rqMu, and every guest-memory access
// acquires the device's table and contains faults itself (containFault).
// QP numbers are unique on the fabric, because a peer on the network names
// a QP by number alone.
//
// # Shared receive queues
//
// An SRQ (srq.go) is a receive ring several QPs of its device take their
// receive WQEs from (QP.SRQ). Whichever QP a message arrives for, on
// whichever engine or transport goroutine, the WQE is taken by one
// function, QP.takeRecvWQE, which the same-host responder, UD delivery and
// the network transport (netQP.TakeRecv) share: from an SRQ it copies the
// next WQE and advances the SRQ's ci in one step under SRQ.mu, so an SRQ's
// WQEs are consumed one at a time in ring order; the message is placed
// into the copy afterwards, in parallel with other QPs'. The SRQ limit
// event fires there. An empty SRQ is receiver-not-ready: the requester is
// recorded as a waiter, the record's notify word says so, and the poll of
// the SRQ's doorbell queue (PollBudget), woken by the driver's
// notification, kicks the waiters. A pi more than max_wr ahead stops the
// SRQ for good. A QP with an SRQ flushes only its send queue in ERR, then
// posts QP_LAST_WQE_REACHED once; a WQE it consumed for a message its
// requester abandoned is kept for it (stash) and flushed then.
//
// # UD
//
// A UD QP (QP.UD; ud.go) sends SEND and SEND_WITH_IMM datagrams to the
// WQE's AH (of the QP's PD), QP number and Q_Key: the engine resolves the
// AH's dgid on the fabric and delivers to that QP under its rqMu, writing
// the 40-byte network header (IPv4 for two IPv4-mapped GIDs, else IPv6)
// before the payload. Anything the receiver does not take (not UD, not in
// RTR/RTS, another Q_Key, no receive WQE, no such QP) is dropped and
// counted (Stats.UDDropped); a UD sender never waits RNR and learns
// nothing of the receiver. A datagram to an AH on another host (a network
// sgid, a dgid no device owns) leaves as one RoCEv2 packet through the
// fabric's network when it carries UD (UDNetwork; netud.go): a UD QP is
// attached to its device's host addresses at INIT→RTR and detached at
// RESET and destroy, and what arrives for it is delivered under its rqMu
// by the same rules, with the GRH built from the arriving IP header.
// udNet.Receive runs on the network's receive goroutines and takes
// QP.rqMu, QP.mu and CQ.mu as a same-host delivery does; sending holds
// sqMu and takes only the network's leaf locks. A send WQE may carry its
// destination (flag AV) instead of naming an AH; it is checked as
// CREATE_AH checks (ResolveAH) and sent by the same path.
//
// # The GSI QP and DMA MRs
//
// A device has at most one GSI QP (QP.GSI, RNIC.GSI; AddQP refuses a
// second): a UD QP that peers address as QP 1 — on this host through
// udTarget, on the network by its attachment as QP number 1 at its
// device's host addresses — and whose datagrams carry source QP 1
// (srcQPN); its own number reaches nothing. A DMA MR (MR.DMA) has no
// extents: its addresses are guest-physical, checked whole against the
// device's current table where an SGE is checked (MR.Local) and
// translated through it at each access (MR.Range); MR.Remote refuses it
// to every remote access (remoteMR, netQP.Resolve).
//
// # Memory windows and fast registration
//
// An MW (mw.go) and an ALLOC_MR MR (FRMR) are found by their key's index
// (bits 8–31) and honoured only with their current key byte. BIND_MW,
// REG_MR and LOCAL_INV WQEs (memops.go) run on the QP's own device in
// send queue order (a network QP's after its outstanding WQEs); a
// fast registration is an MR (MR.Fast) built from the page list when the
// WQE runs, pinning nothing and checked against the current table as a
// DMA MR is. The state of either object is an immutable value swapped
// under its mu; the data path loads it without a lock, and key cache
// entries stay valid only while it is unchanged (keyCache). A window
// counts in its MR (MR.windows): DEREG_MR is BUSY and a fast registration
// is not invalidated while one is bound. remoteKey resolves an rkey for
// the same-host responder and for netQP.Resolve alike, and invalidate
// answers SEND_WITH_INV for both (sendInv; netQP.Invalidate, which the RC
// transport calls for a SEND_LAST/ONLY_WITH_INVALIDATE's IETH).
//
// # Resource views and error counters
//
// An operator lists a device's objects (snapshot.go: QPViews, CQViews,
// MRViews, …, as `rdma resource show` lists an RNIC's): the registry is
// read under RNIC.mu to collect them, and each is then copied under its
// own lock (QP.mu, CQ.mu, SRQ.mu, MR.bindMu; a CQ's record is read under
// memmap.Guard), so a listing never holds the data path up for more than
// one object's copy. Each QP counts its errors (counters.go: error
// completions by status, refusals as responder, RNR NAKs, wrong peers,
// malformed WQEs, UD drops) and each CQ its error and lost CQEs, where the
// error is detected, never on a successful completion: a QP's counters
// are allocated by its first error.
//
// # Dirty logging
//
// While the front-end migrates the guest, every write the engine makes
// into a guest's memory is marked in the dirty log of the table it wrote
// through, after the write (memmap.Table.MarkDirty; dirty.go lists the
// writers): data through an MR goes through MR.RangeWrite (the mover, the
// atomics, the network transport's copies into guest memory via
// rangeFor), CQEs and a CQ's pi through CQ.push and storePILocked, record
// words through setCIOn, markCI, updateRQNotifyOn and SRQ.storeSRQ. A
// store into guest memory anywhere else is a bug. Not logging costs one
// nil check per write. A device on a host NIC does not log (the NIC's DMA
// is invisible): it refuses VHOST_F_LOG_ALL (rdma.Device.LogsDirty).
//
// # Fencing and moving an identity (same-host migration)
//
// A fenced device (RNIC.SetFence, fence.go) takes no same-host request:
// the check is made under the responder QP's rqMu (respond, deliver,
// udNet.receive), and fencing takes every QP's rqMu once, so that it
// returns when no request is writing. An RC requester whose peer is fenced
// holds its head WQE (QP.fenceHold: like RNR, but no retry is consumed)
// until woken (kickRequesters: the fence lifted, or a handoff repointed
// it) or its backstop timer fires; a UD datagram is dropped. A migration's
// destination on the same fabric takes the source's GID table and QP
// numbers in one step (Fabric.Handoff, migrate.go); the source is
// migrated out and fenced for good; Handoff.Undo gives them back after a
// failed load, Handoff.Commit repoints the source's peers (RepointPeers)
// and wakes them. A migration to another host holds the source's network
// QPs instead (RNIC.HoldNet: their transports frozen with the VM, the
// state exported frozen, restored frozen at the destination and let go
// there when the VM runs); netQP.held marks them, and export reads a held
// transport without a frozen network and leaves it frozen.
//
// # Handing a device over to another process
//
// A live upgrade of vrdmad moves every object to a new process
// (state.go). The control path rebuilds each object there with the handle
// it had (ClaimHandle) and gives it the engine's state of it: a CQ's pi,
// written count, ci_seen, arm state and overrun (CQState); an SRQ's ci,
// limit, stopped state and notify word (SRQState); a QP's attributes
// (state, PSNs, …), sgid, lost-peer and RETRY_EXC flush state, sq_ci,
// rq_ci, rnrTries, the rq_notify word, QP_LAST_WQE_REACHED and an SRQ WQE
// it stashed, and its error counters (QPState). The export runs with no
// pass on the device (Quiesced publishes what was lazy first), the import
// before any. Not carried: the scratch of an RNR wait (the head WQE is
// still in the ring at sq_ci and is read again), the RNR deadline (the
// WQE is retried at once, rnrTries kept), the waiter lists of RQs and SRQs
// (their requesters retry at once and wait again), the key cache. The peer
// of an RC QP is resolved again by dgid once every device is imported
// (ResolvePeers); a UD QP attached to the network is attached again
// (ReattachUD). A QP connected over plain RoCEv2 carries its netQP and its
// transport (state_net.go, NetQPState): the slots of the WQEs the
// transport holds (wr_id, opcode, flags; Done … Tail), the receive it is
// filling, the remote QP it claims, and the rc.ConnState, read with
// Freeze and let go at once (Thaw) while the daemon holds the network
// frozen (an export with a running network is refused: a packet accepted
// after the read would be lost). The import checks it against the QP's
// attributes, resolves every SGE's lkey again as a WQE's is checked
// (sendBuf.Describe out, netQP.SendBuffer and RecvBuffer in: rc's
// Describer and Rebuilder), claims the remote QP on the new fabric and
// restores the connection on the network the new process adopted, still
// frozen (ConnRestorer): the old process's sockets, and the requester
// resends from its oldest unacknowledged PSN once the network thaws. A
// multipath (spray) connection, memory windows and ALLOC_MR MRs are not
// transferable yet (Transferable says which).
//
// Non-goals: the control commands and their validation (backend/rdma),
// doorbell-queue notification suppression and the worker loop (the caller
// of Poll), SRQs, UD, the GSI QP or DMA MRs on a host NIC, the wire protocol
// (roce/rc, roce/udp). On this host the fabric is lossless: timeout and
// retry_cnt are informational there.
//
// # Execution model
//
// One doorbell queue of a device is polled by one caller at a time (a
// worker of the daemon's engine pool, package sched, visiting the queue's
// task) calling RNIC.PollBudget for it, holding the device's current
// memmap.Table under memmap.Guard. PollBudget owns the requester side of
// the queue's QPs: for each QP in RTS it reads the head send WQE once into
// per-QP scratch, validates the copy, runs it, completes it, and advances
// sq_ci, at most pollBudget WQEs per QP per call and none once the
// caller's Budget (engine time: payload plus a cost per WQE) is spent,
// starting at a different QP each call; for each QP in ERR it flushes both
// queues. Running a WQE (engine.go, run) checks its local side and builds
// a request — the message as the responder sees it: opcode, remote
// address and key, length, immediate, where the payload comes from — that
// the responder side answers with an outcome (respond.go: a typed
// completion status and length, or receiver-not-ready). The requester
// runs the responder side on the peer QP
// (another device's, possibly in another engine goroutine): it consumes the
// peer's receive WQEs under the peer QP's rqMu, holding a reference on the
// peer device's table for the operation, and writes the peer's CQEs. An
// empty receive queue (RNR) leaves the WQE at the head, decoded and held in
// the scratch (never read from the ring again), and retries after the
// responder's min_rnr_timer: Poll skips the QP until then and returns the
// deadline; a timer calls wake too. The responder QP remembers the waiting
// requester (rnrWaiter) and, when its RQ_NOTIFY record is used, asks its
// driver for a notification of the next receive (rq_notify); the
// responder's engine, woken by it, ends the wait at once (kickWaiter).
//
// State changes from other goroutines (Modify, a peer's remote error, CQ
// overrun, a peer device's Reset) set the state under QP.mu and call
// wake(dbq); the owning engine then flushes. Only the owning engine
// advances sq_ci; rq_ci is advanced by whoever consumes a receive WQE, under
// rqMu.
//
// # Faults in guest memory
//
// A front-end can make its guest memory fault under the engine (it shrinks
// the file behind a region: SIGBUS). Poll runs under the caller's
// memmap.Guard, so a fault in the memory of Poll's own device aborts the
// pass and breaks that doorbell queue. The responder side of an operation
// touches the peer device's memory too, and a fault there is the peer's:
// respondContained (fault.go) recovers it, tells it from the requester's
// own by the faulting address (memmap.FaultAddr; Table.MapsHost of the
// peer's table and not of the requester's, so a loopback QP's faults stay
// its own device's), completes the WR with REM_OP_ERR and moves the peer
// QP to ERR with QP_FATAL. The peer's doorbell queue breaks only when its
// own engine touches the vanished memory (flushing that QP, say). Any other
// panic is raised again unchanged. The deferred closure is open-coded: no
// allocation per WQE. RNIC.Reset, which runs on no engine and under no
// Guard, reads peers' records through a guarded load (loadSQPI).
//
// # Tenants
//
// Each device is a tenant's, and a hostile one may name any GID and QP
// number it likes. A QP answers only its peer (respond.go): the responder
// must be connected back to the requester — dest QPN, dgid equal to the
// GID the requester sends from (QP.sgid, resolved with QP.peer at INIT→RTR)
// and that GID's device — or the request is answered as one to a QP that
// does not exist, touches nothing and is counted (Stats.WrongPeer); a UD QP
// is never an RC QP's peer, and a UD datagram reaches UD QPs only, with
// their Q_Key (isolation between tenants is the Q_Key's and the random
// 24-bit QP number's, as UD defines it). QP
// numbers are drawn uniformly from 24 bits and reserved on the fabric as
// they are drawn (NewHandle), so probing finds nothing near a known one.
// Across hosts the transport keeps the same rule (roce/udp: the peer's
// address, and its source port once learned), and a remote QP has one
// peer on this host (Fabric.claimConn): the remote host tells this host's
// QPs apart by address and port alone, which they all share, so a second
// QP connecting to a remote (GID, QPN) another QP holds gets BUSY. GIDs
// are the operator's to assign (Fabric.mayHoldLocked): a device holds its
// port GID, its network GIDs and what RNIC.SetAllowedGIDs allows, never a
// host's network address. docs/security.md has the whole model.
//
// # Invariants
//
//   - Guest structures are copied once and validated as copies; ring and
//     record indices shared with the guest are read and written with the
//     memmap atomic accessors; every loop is bounded by a ring depth, a
//     SGE count, pollBudget or the number of memory regions.
//   - A producer index more than the depth ahead of a consumer index moves
//     the QP to ERR with QP_FATAL and is never used as a loop bound.
//   - CQEs are written into slot pi mod depth before pi advances; a full CQ
//     drops the CQE, enters overrun (CQ_ERROR) and moves its QPs to ERR.
//   - A requester's pass publishes (QP.publish) sq_ci, the send CQ's pi
//     (its CQEs were pushed lazily), the same-host responder's rq_ci and
//     receive CQ pi (publishPeer: a SEND's receive completion is pushed
//     lazily too) and the counters when it ends and every publishEvery
//     WQEs or publishBytes of payload, so the driver polling those words
//     sees one store per batch of small messages without waiting a whole
//     pass for its first completion. A CQE that fires an armed CQ
//     publishes pi at once, and REQ_NOTIFY_CQ publishes before it compares
//     pi with ci, so an event never precedes its entry.
//   - A consumer index is stored before any pi that shows a completion it
//     covers, whoever stores that pi (ci.go: the CQ lists the QPs with
//     lazy completions and stores their indices first), and never moves
//     backwards. Producer indices and a CQ's ci are read again only when
//     the value last read is used up (sqPISeen, rqPISeen, CQ.ciSeen): the
//     driver writes those words as it posts and polls, and a read per WQE
//     pulled their cache line across cores each time (64 B SEND +22 %).
//   - A CQ armed through its record (ARM_RECORD) is checked where pi is
//     stored, never where a CQE is merely written: every store of pi is
//     followed (StoreUint32 is a full barrier) by a load of the arm word,
//     so a driver that arms and then polls either sees the CQE or gets the
//     event, lazy publication included (CQ.storePILocked).
//   - After RemoveQP returns, no engine touches the QP's rings, record or
//     CQs: it takes sqMu (the requester's pass) and rqMu (responders).
//     RemoveMR does not wait: an operation that resolved the key before
//     may finish its copy into the (still mapped) pages.
//
// # Lock order
//
// Acquire top to bottom; hold at most one lock of each level:
//
//	QP.sqMu     (a QP's requester side: its engine pass, Modify→RESET, RemoveQP)
//	transport   (a network QP's rc.Conn lock: its goroutines call the Host with it)
//	QP.rqMu     (a QP's responder side; may be another QP than the sqMu holder's)
//	SRQ.mu      (an SRQ's consumption: taken under the consuming QP's rqMu)
//	QP.mu       (state and attributes)
//	CQ.mu
//	QP.ciMu     (a leaf: the record's consumer indices, ci.go)
//	RNIC.mu, Fabric.mu (leaves but for Fabric.qpnMu, taken under RNIC.mu
//	            and under Fabric.mu by Handoff, and MW.mu and FRMR.mu,
//	            taken under RNIC.mu by DeregMR)
//	MW.mu, FRMR.mu (a window's or ALLOC_MR MR's state changes)
//	MR.bindMu   (a leaf: the windows bound in an MR)
//
// A requester holds its own sqMu and then the peer QP's rqMu; nobody waits
// for an sqMu while holding an rqMu, so two engines sending to each other
// cannot deadlock. Locks are released by defer in code touching guest
// memory, so a fault contained by memmap.Guard leaks no lock. EventSink and
// wake are called with engine locks held: they must not block for long
// nor call back into the engine.
package engine
