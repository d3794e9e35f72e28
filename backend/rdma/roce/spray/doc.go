// Package spray is the multipath spray transport of one RC QP between two
// vrdma hosts (docs/wire.md § 9): it sprays the QP's packets over up to 64
// paths, places them out of order, acknowledges selectively, retransmits
// only what was lost, scores each path and moves traffic off a bad or dead
// one without a QP error. A peer that does not speak it (Linux rxe, a
// vrdma with the extension off) gets plain RoCEv2 RC from package rc.
//
// # For the engine
//
//	c, err := spray.New(spray.Config{RC: rcCfg, Locals: eps, Peer: peer, Paths: n}, host)
//
// at MODIFY_QP INIT→RTR (eps: one udp.Endpoint per local address of the
// device's family, eps[0] the one the QP's address vector is reached
// from; peer: the address vector's address), then c.Start(cfg) at RTR→RTS,
// c.Post, and c.Close — *Conn is an rc.Conn, used exactly as
// udp.Endpoint.NewConn's. It registers itself with every endpoint under
// the QPN (udp.PacketHandler), so the QPN must be free on each. Mode says
// what the requester speaks, Counters and Paths what happened, QP the
// plain RC QP (its counters).
//
// # Design
//
//   - Negotiation. Start sends a HELLO (opcode 0xC0, the IBA
//     manufacturer-specific range, which rxe drops on an RC QP:
//     rxe_recv.c check_type_state) from Locals[0] to Peer, listing this
//     side's addresses, receive window and first PSN; a spray peer answers
//     HELLO_ACK with its own. Both carry a token in the BTH PSN, the
//     initial RC send PSN of the HELLO's sender (its sq_psn at RTS, the
//     answerer's rq_psn at RTR): a HELLO is taken only with the QP's
//     initial rq_psn, a HELLO_ACK only after Start with its initial
//     sq_psn, so forging one is as hard as guessing a plain RC PSN
//     (docs/wire.md § 9.2, § 11). Post queues meanwhile. Without an answer
//     after HelloRetries retries (backing off from HelloTimeout), the
//     requester is plain RC for the QP's life and the queued work goes to
//     the rc.QP in order. Each direction decides alone: a HELLO answered
//     is enough for the peer to spray at us, so one side may spray while
//     the other speaks RC; the responder always takes both (plain RC from
//     the connected address only, spray from the addresses of the HELLO).
//   - Messages and packets. Requests get a message sequence number (MSN,
//     the send queue index) and, when they consume a receive (SEND, SEND
//     with immediate, WRITE with immediate), a receive sequence number
//     (RSN). Every DATA packet carries op, MSN, offset, message length,
//     RSN, immediate, rkey, VA, path and a timestamp: any packet is placed
//     on arrival (WRITE at VA+offset, SEND at offset of the RSN-th receive,
//     which the receiver takes from the Host in RSN order, so the n-th SEND
//     consumes the n-th receive whatever the arrival order). A message is
//     complete when all its packets arrived; it is retired (receive
//     completion, READ and atomic execution) in MSN order, so completions
//     are in order and a READ or atomic sees every earlier WRITE placed.
//     READ responses and atomic results are DATA packets of the responder,
//     sprayed and acknowledged like requests: each side has one send
//     window (its PSN space) carrying its requests and its responses.
//   - Reliability. Each DATA packet has a PSN of its side's space; it
//     keeps it when sent again (on any path). The receiver keeps a bitmap
//     of the PSN window and acknowledges with ACKs carrying the
//     cumulative PSN, a SACK bitmap of the window after it, the retired
//     MSN and the echo of the last packet's path and timestamp (an RTT
//     sample of that path), sent back on the path it came by, at the end
//     of a receive batch: at once after a duplicate, a retransmission, a
//     refused packet, a PROBE, a retired message or the last packet of a
//     response, else once ackEvery (32) packets are unacknowledged, and at
//     the next tick for what is left. A long message gets an ACK per 32–64
//     packets rather than one per batch (a dozen packets: ACKs were a
//     tenth of the packets sent, each costing as much as a DATA packet to
//     forward). A duplicate PSN is
//     acknowledged, never placed twice, so an atomic executes once without
//     a replay cache.
//   - Loss and paths. A path is FIFO, so what is known to have crossed
//     it tells what was lost on it: a packet in flight is lost when three
//     packets sent after it on the same path were acknowledged, or when a
//     transmission sent on that path more than a quarter of the path's
//     SRTT after it is known to have arrived — from an ACK's echo, which
//     names one transmission, or from the acknowledgement of a packet sent
//     only once (one sent again may have arrived by either copy, so it
//     tells nothing of its paths: Karn). A path whose packets in flight go
//     unanswered for its PTO (2·SRTT, at least 1 ms) gets a PROBE, a
//     tail-loss probe: the ACK echoing it shows what is missing before it,
//     so a lost tail costs a few RTTs, not a timeout. Each path has a
//     congestion window (Reno: slow start, +1/cwnd, halved once per round
//     of losses) and a loss average; packets go round robin to the paths
//     with room, so a lossy path gets less. A path silent for its RTO
//     (SRTT+4·RTTVAR, at least MinRTO, at most the larger of MinRTO and
//     the QP's Timeout) while another path was heard from is taken down:
//     what it had in flight is sent again on the others, and it is probed
//     (PROBE, answered by an ACK) with back-off up to 100 ms; the first
//     echo takes it back with a fresh window. Paths silent all together
//     are a stall of the peer or of this host, not a path failure: they
//     stay up, probed with back-off, and the QP's retry timer decides.
//   - Errors. Errors found while placing (rkey, range, receive too small)
//     are kept with the message and answered when it would retire: a NAK
//     with its MSN, so the requester completes the earlier ones and fails
//     that one with the remote error, as RC. The QP's retry timer
//     (Timeout × RetryCnt without any progress) and RNR (RNR NAK with the
//     refused PSN: it waits the RNR time, not charged to its path;
//     RNRRetry) keep their RC meaning.
//
// Deviations and choices: no RNR or credit flow control per path; the
// window is PSNs in flight (not bytes); a message's packets need not have
// consecutive PSNs, so a hostile peer could count one offset twice and
// retire a message early — only its own QP would see it (it can write that
// memory anyway). Paths differ by address pair only: UDP source ports are
// the endpoints' (4791), so an ECMP fabric between one address pair sees
// one flow.
//
// # Bounds
//
// Per Conn, fixed when the peer is known: the PSN window (Window ≤ 2048:
// the SACK bitmap covers it), Messages request messages and receives
// taken, SQSize work requests, MaxDestRdAtomic responses owed, Paths
// paths, one packet and one payload buffer. Every packet is checked
// (Parse: every field of every header; then against the windows and the
// message it claims to belong to) and dropped with a counter when it
// fails; nothing is allocated per packet. Tick scans the window once
// (O(Window) per tick); an ACK scans it for losses only when what is known
// to have crossed a path moved.
//
// # Concurrency
//
// Conn.mu protects the spray state; the endpoints' receive, timer and pump
// goroutines and the owner's Post take it. Lock order: Conn.mu, then the
// rc.QP's lock (fallback, Close), then lockedHost.mu (the Host calls of
// both sides, serialised), then the endpoints' send locks. The rc.QP is
// called without Conn.mu for its packets and ticks.
package spray
