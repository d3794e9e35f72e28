// Package roce is the RoCEv2 wire codec of vrdmad: the InfiniBand transport
// headers of reliable-connection (RC) packets as they travel in UDP
// datagrams to port 4791, their invariant CRC, and PSN arithmetic, in the
// form Linux rdma_rxe sends and accepts. docs/wire.md is the normative
// description of what vrdma puts on the network; this package implements
// it.
//
// It does not open sockets, keep QP state, retransmit, or decide what to
// send: the engine's transport does. It implements the RC opcodes
// (SEND_WITH_INVALIDATE and its IETH included) and the two UD SEND opcodes;
// no UC, RD, XRC, CNP, FLUSH or ATOMIC_WRITE.
//
// # Decoding
//
// Parse validates a whole packet once and returns a Packet value that
// references the input (the payload is a subslice); every refusal is a
// *PacketError matching one sentinel (ErrTruncated, ErrOpcode, ...) so that
// a receiver can count drops per reason. Packet.CheckPMTU adds the rules
// that need the QP's path MTU. Verify checks the ICRC, which needs the IP
// and UDP headers. Parse and Verify do not allocate on success.
//
// # Encoding
//
// Packet.Append appends the packet to a caller's buffer with a placeholder
// ICRC, and Seal fills it in. Nothing allocates when the buffer has room.
// Packet.Encode writes the headers around a payload already in place (a
// sender gathers it straight into the memory it sends from). A Flow holds
// the ICRC's pseudo header of one peer and port pair, computed once: its
// ICRC, Seal, Check and RecoverIPv4ID skip the 28 or 48 bytes of IP and
// UDP header per packet.
//
// # The IPv4 Identification field
//
// The ICRC covers the IPv4 Identification (it is not one of the masked
// fields), but a UDP socket reports neither the ID of a received datagram
// nor lets a sender choose it. What Linux puts there (include/net/ip.h,
// ip_select_ident_segs, called by __ip_make_skb in net/ipv4/ip_output.c on
// the UDP send path):
//
//   - a connected socket: a per-socket counter started at a random value;
//   - otherwise, DF set and skb->ignore_df clear: 0. ignore_df is
//     ip_sk_ignore_df(sk), clear only for IP_PMTUDISC_DO and
//     IP_PMTUDISC_PROBE, which also set DF on every datagram;
//   - otherwise (the default IP_PMTUDISC_WANT sets DF but also ignore_df):
//     __ip_select_ident, a hashed per-destination counter with random
//     increments (net/ipv4/route.c).
//
// Linux rxe builds its own IPv4 header (drivers/infiniband/sw/rxe/rxe_net.c,
// prepare_ipv4_hdr): DF set and __ip_select_ident called directly, so its
// IDs are unpredictable to the receiver; rxe itself verifies with the ID it
// receives.
//
// Hence vrdma sends from unconnected UDP sockets with IP_MTU_DISCOVER set
// to IP_PMTUDISC_DO: every IPv4 packet carries DF and ID 0 (allowed for
// atomic datagrams by RFC 6864), and its ICRC is computed with ID 0. A
// receiver verifies IPv4 packets assuming ID 0 and DF; a packet from rxe
// fails that check, and RecoverIPv4ID finds the ID that makes its ICRC
// correct, at the price of 16 of the 32 check bits. IPv6 has no ID and no
// such problem.
package roce
