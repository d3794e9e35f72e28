// Package udp carries the RC QPs of package rc over a UDP socket bound to
// one host address on port 4791 (docs/wire.md): an Endpoint receives with
// recvmmsg, checks each datagram (size, roce.Parse, the ICRC with the IP
// header it reconstructs, the destination QPN, the peer's address) and
// hands it to its QP; it sends what the QPs queue with sendmmsg, runs of
// same-size packets to one peer as UDP GSO super-datagrams (IPv6). The
// ICRC's pseudo header (roce.Flow) is computed once per peer for sending
// and once per source for a run of received datagrams.
//
// # On the wire
//
// Unconnected socket, IP_MTU_DISCOVER = IP_PMTUDISC_DO (IPV6_MTU_DISCOVER
// for IPv6): every IPv4 datagram leaves with DF and Identification 0, so
// the ICRC is sealed over ID 0 (docs/wire.md § 7), and a datagram above
// the path MTU fails with EMSGSIZE instead of being fragmented (counted in
// TxErrors, recovered as a loss). Received IPv4 packets are verified with
// ID 0 and DF; Config.RecoverIPv4ID also accepts a packet whose ICRC is
// right for some other ID (roce.RecoverIPv4ID: Linux rxe sends
// unpredictable IDs), checking 16 of the 32 ICRC bits. Packets leave from
// the bound port (4791 by default).
//
// # Segmentation offload (GSO and GRO)
//
// What a flush sends is planned (planRuns): a run of queued packets to one
// destination, all of one size but the last, which may be shorter (the
// MIDDLE packets of a WRITE, SEND or READ response and its LAST; a FIRST
// with its longer RETH starts a run of its own), at most 64 packets and
// 65487 bytes, goes as one sendmmsg message whose iovecs are the packets'
// buffers and whose UDP_SEGMENT control message says the run's packet
// size: one trip through the kernel's UDP and IP layers, and through veth
// or forwarding, for up to 64 packets. Every other packet is a message of
// its own, as before. The kernel cuts the super-datagram at the segment
// size (in the NIC, at a device without offload, or in the receiver's
// socket), so each segment is exactly the datagram the packet would have
// been: its own IP and UDP headers, its own BTH, its own ICRC, sealed per
// packet as before. The bytes on the wire do not change.
//
// IPv4 endpoints never send GSO: segmentation numbers the IPv4 IDs of the
// segments from the super-datagram's (0) up, 0, 1, 2 … (inet_gso_segment
// in net/ipv4/af_inet.c: only TCP has SKB_GSO_TCP_FIXEDID), while every
// packet must carry ID 0, the ID its ICRC is sealed over (docs/wire.md §
// 7; rxe, RNICs and captures see the real ID). IPv6 has no ID.
//
// Receiving, the socket has UDP_GRO on (both families): the kernel may hand
// over several datagrams of one flow in one buffer (a super-datagram that
// crossed veths unsegmented, or what GRO coalesced), and a control message
// says their size (gso_size), the last possibly shorter. handle splits the
// buffer at that size (groSegments) and checks and delivers each datagram
// on its own, exactly as a datagram received alone; a gso_size that splits
// nothing (≤ 0, not below the buffer's length) leaves the buffer one
// datagram, one shorter than any packet counts its pieces as malformed
// without looping over them, and a buffer whose control message was cut
// off counts as truncated. The datagrams of a buffer share its source
// address and port (GRO coalesces one flow only).
//
// Fallback: Listen probes setsockopt UDP_GRO and, for IPv6, UDP_SEGMENT;
// what the kernel refuses (ENOPROTOOPT before Linux 4.18 and 5.0) is
// logged once and not used. A super-datagram the kernel refuses for want
// of GSO (EIO: a route through xfrm, or on older kernels a device without
// checksum offload; EINVAL; ENOPROTOOPT; EOPNOTSUPP) turns GSO off for the
// socket, with a log line, and the rest of the flush, that message
// included, goes a datagram at a time: nothing is lost. Any other error
// drops the message's packets, counted in TxErrors one by one, as it
// would have dropped each of them. Config.NoOffload uses neither;
// SetOffload switches them at run time (benchmarks compare).
//
// # Goroutines
//
// Three per endpoint: the receiver (recvmmsg, Config.Batch datagrams at a
// time; the QPs it touched Flush their coalesced ACKs, and the requests
// the ACKs let out, after each batch), the timer (every Config.Tick it
// calls Tick on every QP; cost O(QPs)), and the pump (QPs that stopped
// after a burst ask through Port.Wake, a channel with room for every QP,
// each queued at most once). Post, from the owner's goroutine, sends what
// the window allows at once.
//
// Sending is batched: a QP's packets are built (rc.InPlacePort: the
// payload gathered from guest memory straight into the batch's buffer, the
// one copy) and sealed in the endpoint's send batch under its lock, and the batch leaves (sendmmsg) when a QP is done
// sending for now (rc flushes after Post, Tick and the last Pump of a run,
// without the QP's lock held), after a receive batch, when the pump
// goroutine finds Config.Batch packets queued between two bursts of a QP
// that has more to send, or when the batch is full. A long run of packets
// so leaves in sendmmsg calls of Config.Batch packets or more, each run of
// one message's full-size packets one GSO super-datagram, and the system
// call rarely holds up a QP's other callers.
//
// Freeze stops the three at a clean point (the receiver after its batch:
// a read deadline in the past keeps it from calling recvmmsg again, so
// later datagrams wait in the socket), Thaw starts them again and wakes
// every QP. A handover (handover.go) passes the socket to another process
// (Dup there, Adopt here: a frozen endpoint over the inherited socket,
// checked to be UDP and bound to the configured address and port) and
// carries each connection as an rc.ConnState with its addresses and the
// peer's learned source port (Conn.Freeze, RestoreConn).
//
// # Locks
//
// runMu serialises Freeze, Thaw and Close, and comes before tableMu and
// any QP's lock. Lock order: a QP's lock (package rc), then txMu (the send batch; a full
// batch, or any Flush, goes out under it, waiting for socket buffer room
// through the runtime poller; rc flushes without its QP lock, so only a
// full batch makes a QP wait for the system call). tableMu serialises NewQP and RemoveQP, which
// publish a new QP table (copy on write, an atomic pointer): the receiver
// and the timer read it without a lock.
//
// # Bounds
//
// A send batch of Config.Batch buffers of one maximum packet each, 4 ×
// Config.Batch with GSO (1 MiB at the default batch), a receive batch of Config.Batch buffers of 64
// KiB each with UDP_GRO (4 MiB; one packet each without GRO); at most Config.MaxQPs QPs; nothing per
// datagram. A flush plans at most Config.Batch messages, a receive buffer
// splits into at most its length / 16 datagrams. Datagrams that fail a check are
// counted (Counters) by reason and dropped, never delivered to a QP: a
// packet to an unknown QPN, from an address that is not the QP's peer or
// from a source port that is not the peer's learned one, with a bad ICRC,
// truncated or malformed.
//
// # The peer's source port
//
// A QP's peer address is its remote GID, fixed at NewQP. Its source port
// is learned (SourcePort): until the QP accepts a packet (rc.QP.Receive
// reports it: a request at the expected PSN, a response that acknowledged
// or answered something outstanding), packets from the peer's address and
// any port reach it; from then on only those from the port that packet
// came from, the rest counting as RxWrongPeer. This holds for every peer,
// because every peer keeps one source port for a connection's life: a
// vrdmad sends everything from its bound port (4791), Linux rxe everything
// of a QP from qp->src_port (rxe_net.c prepare4/prepare6), which
// rxe_modify_qp sets at the address vector from the flow label, or when it
// is 0 from the QPNs (rdma_get_udp_sport, 0xc000-0xffff). The check is
// one comparison, on the receive goroutine, which alone owns the learned
// port. docs/wire.md § 11 says what it is worth.
//
// Packets with the manufacturer-specific opcodes of the multipath spray
// extension (docs/wire.md § 9) are checked as far as the BTH, the length,
// the ICRC and the QPN, then handed to the QP's PacketHandler (package
// spray), which parses the rest.
//
// Non-goals: routing (the kernel's), choosing source ports per QP (no
// entropy for ECMP yet), several addresses per endpoint (one Endpoint per
// address).
package udp
