// Package udp carries the RC QPs of package rc over a UDP socket bound to
// one host address on port 4791 (docs/wire.md): an Endpoint receives with
// recvmmsg, checks each datagram (size, roce.Parse, the ICRC with the IP
// header it reconstructs, the destination QPN, the peer's address) and
// hands it to its QP; it sends what the QPs queue with sendmmsg.
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
// # Goroutines
//
// Three per endpoint: the receiver (recvmmsg, Config.Batch datagrams at a
// time; the QPs it touched Flush their coalesced ACKs after each batch),
// the timer (every Config.Tick it calls Tick on every QP; cost O(QPs)), and
// the pump (QPs that stopped after a burst ask through Port.Wake, a
// channel with room for every QP, each queued at most once). Post, from
// the owner's goroutine, sends what the window allows at once.
//
// # Locks
//
// Lock order: a QP's lock (package rc), then txMu (the send batch; a full
// batch, or any Flush, goes out under it, waiting for socket buffer room
// through the runtime poller). tableMu serialises NewQP and RemoveQP, which
// publish a new QP table (copy on write, an atomic pointer): the receiver
// and the timer read it without a lock.
//
// # Bounds
//
// Two batches of Config.Batch buffers of one maximum packet each; at most
// Config.MaxQPs QPs; nothing per datagram. Datagrams that fail a check are
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
