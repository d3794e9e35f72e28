// Package rc is the RoCEv2 reliable-connection (RC) transport of one queue
// pair, independent of the engine, of sockets and of guest memory: the
// requester, responder and completer of an RNIC (the cut of Linux rxe's
// rxe_req.c, rxe_resp.c and rxe_comp.c), speaking the packets of package
// roce (docs/wire.md). Package udp carries its packets over UDP port 4791.
//
// # What the owner provides
//
// A QP is New(Config, Host, Port). The Host is the device around the QP:
// Resolve checks an rkey, an address range and an access right and returns
// a Region (an MR object: WriteAt, ReadAt, Atomic), TakeRecv consumes a
// posted receive (none: RNR NAK), RecvDone and SendDone take completions
// with the ABI's typed status (abi.WCStatus). Local memory of a send work
// request is a Buffer (Gather, Scatter), given in the SendWR. The Port sends
// a packet (BTH to ICRC; the Port seals the ICRC, which covers the IP and
// UDP headers only it knows), flushes a batch, and is asked to Wake the
// owner when the QP stopped after Config.Burst packets with more to send.
// A Port that is an InPlacePort (package udp's) lends the QP the memory a
// packet leaves from, and the payload of a SEND, WRITE or READ response is
// copied once, from the local memory straight into it.
// The owner calls Receive for each packet (parsed, ICRC verified), Flush
// after a batch of packets, Pump after a Wake, Tick periodically, Post for
// work requests and Close to flush everything.
//
// # The protocol
//
//   - Requester: a work request is cut into PMTU packets (FIRST, MIDDLE,
//     LAST or ONLY; RETH on the first WRITE packet, ImmDt or IETH on the
//     last), a
//     READ is one request that takes one PSN per response packet, an
//     atomic one request. PSNs are 24-bit and wrap (roce.PSN). A packet
//     asks for an ACK (AckReq) at the end of each message and every
//     quarter window (at most every 64 packets). At most MaxRdAtomic READs
//     and atomics are outstanding; Fence waits for them.
//   - Responder: packets of another partition than the default (P_Key
//     0xffff or 0x7fff) or breaking the path MTU rules are dropped. Then
//     the expected PSN decides. A duplicate SEND or WRITE is
//     acknowledged again; a duplicate READ is answered again only if it is
//     (the tail of) a READ among the last MaxDestRdAtomic READs and
//     atomics, so made-up duplicates draw nothing; a duplicate atomic is answered from the
//     replay cache and never executed twice (IBA C9-150). A request beyond
//     the expected PSN is dropped and NAKed with a PSN sequence error once
//     per gap (again when the requester visibly starts over). A SEND, or a
//     WRITE with immediate, without a posted receive gets an RNR NAK with
//     Config.MinRNRTimer. A SEND with invalidate has Host.Invalidate free
//     the IETH's key when its last packet arrives (a one-packet message is
//     checked before its receive is taken); a key it refuses is an invalid
//     request. Protocol violations (opcode out of order, lengths
//     against the RETH or the receive, bad rkey or range or access) are
//     NAKed (invalid request, remote access, remote operational error) and
//     put the QP in the error state. READ responses and atomic ACKs leave
//     from a bounded queue in PSN order; the ACK the responder owes is
//     coalesced (one per Flush, never ahead of queued responses).
//   - Completer: ACKs complete work requests in order; a READ or atomic
//     completes when its response arrives. A NAK sequence error makes the
//     requester go back to the NAK's PSN (go-back-N: every later packet is
//     sent again with its original PSN); so does an ACK or response that
//     shows a READ response lost (once per missing PSN: a fast
//     retransmit). The retransmit timer (Config.Timeout, restarted on
//     progress) goes back to the oldest unacknowledged PSN; after RetryCnt
//     expiries without progress the head work request fails with
//     WCRetryExcErr. An RNR NAK waits the NAK's RNR time and goes back to
//     its PSN; after RNRRetry of them (7: without limit) WCRNRRetryExcErr.
//     Any error completes the head work request with its status and
//     flushes the rest (WCWRFlushErr); the QP stays in the error state.
//
// Deviations from IBA and rxe, and why:
//
//   - A PSN sequence NAK does not use up retry_cnt: it proves the
//     responder alive, and the timer, which restarts only on progress,
//     still bounds a connection that makes none.
//   - A congestion window (TCP Reno's rules: slow start, about one packet
//     per window above ssthresh, halved on a sequence NAK, down to 4 on a
//     timeout, never above Config.Window) bounds the packets in flight.
//     Go-back-N resends whole windows; without it a receiver that drops
//     for lack of socket buffer sees the same burst again and again.
//   - On a duplicate READ or atomic the responder drops the responses it
//     queued from that PSN on: the requester went back and asks for them
//     again.
//
// # Invariants and bounds
//
// Every packet is O(its size): no loop over the send queue on the fast
// path (the go-back-N seek and a duplicate's lookups are bounded by
// SQSize and MaxDestRdAtomic), and nothing is allocated per packet (the QP
// owns one packet and one payload buffer, for a Port that is not an
// InPlacePort; Host and Port implementations should not allocate either). Memory is fixed at New: SQSize work
// requests, MaxDestRdAtomic queued responses and remembered READs and
// atomics. Packets that break the protocol are counted (Counters) and
// dropped or NAKed; they change nothing outside this QP. A response can
// only complete what was sent: its PSN must lie in [una-1, high).
//
// # Handover (state.go, restore.go)
//
// A QP's state can be taken out as data and taken up by another process
// (live upgrade of vrdmad): Freeze stops the QP (nothing sent or received,
// Post and Start fail with ErrFrozen; Thaw undoes it) and returns a
// ConnState — attributes, the requester's PSNs and outstanding work
// requests, the responder's expected PSN, MSN, message in progress,
// queued responses and replay cache. Restore validates it as hostile
// input and rebuilds the QP: local memory through the Host (a Rebuilder),
// remote regions through Host.Resolve; the requester goes back to its
// oldest unacknowledged PSN (go-back-N, as after a timeout) and the
// responder re-acknowledges its last PSN, so the peer sees only duplicates.
// The congestion window, retry counts, timers and counters start afresh.
// Freezer is what a transport that can be carried implements (*QP and
// package udp's Conn; the spray transport does not).
//
// # Concurrency
//
// All methods are safe for concurrent use and take QP.mu, the only lock;
// Host and Port are called with it held, so they must not call back into
// the QP (lock order: QP.mu, then whatever the Host and Port take). The
// one exception is Port.Flush, which Post, Tick, Pump and Flush call after
// releasing QP.mu (a system call there does not hold up the QP's other
// callers); the packets Receive lets out wait for the owner's Flush, and
// those of a Pump that asked for a Wake for the Pump that follows, so
// that a long run leaves in large batches. Counters are atomics, read
// without the lock.
//
// Non-goals: UC, UD, XRC; memory windows are the Host's (Resolve and
// Invalidate see keys, the QP does not). The
// multipath spray extension (docs/wire.md § 9) is package spray's, which
// falls back to this package's QP for a peer that does not speak it.
package rc
