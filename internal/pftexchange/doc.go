// Package pftexchange plays perftest's out-of-band TCP exchange
// (linux-rdma/perftest, src/perftest_communication.c; the 6.06 that the rxe
// image's Debian 12 ships and the 5.x it stays compatible with), in either
// role, so that a Go program with its own RC QP can stand in for
// perftest's server (a perftest client connects to it) or for its client
// (it connects to a perftest server). The QP is the caller's: a Go RC QP
// of backend/rdma/roce/rc, or a vrdma device's QP through guest/verbs.
//
// Over one TCP connection to port 18515 the client always writes a
// message first and the server answers with one of the same size:
//
//  1. the version string, 16 bytes (the server echoes the client's: the
//     client refuses versions below 5.70, check_version_compatibility);
//  2. from 5.32 on, the cycle buffer and cache line sizes, 4 bytes each,
//     big-endian (check_sys_data);
//  3. from 5.1 on, the MTU as a decimal ibv_mtu string, 2 bytes from 5.31
//     on, 4 before (check_mtu; both sides say "3", IBV_MTU_1024);
//  4. three key messages (ctx_hand_shake: the keys, again once printed,
//     again after RTR; write_lat has a fourth, its pre-test sync), each
//     the 108 bytes of "%04x:%04x:%06x:%06x:%08x:%016llx:" (LID,
//     out_reads, QPN, PSN, rkey, VA) + 16 "%02x:" GID bytes + "%08x:"
//     (SRQN) + NUL;
//  5. the test. send_bw's server posts its receives and then answers one
//     more key message (the client waits for it before sending);
//     write_bw, read_bw and atomic_bw's half-duplex server waits for the
//     next key message, which the client sends when done; write_lat's
//     ping-pong ends the connection's exchange;
//  6. (write_bw, read_bw, atomic_bw) the bandwidth report: size (8),
//     iterations (8 from 5.33 on, else 4), peak, average bandwidth and
//     message rate (8 each) (xchg_bw_reports);
//  7. (all but write_lat) ctx_close_connection: a last key message, then
//     both sides write "done" (5 bytes) and close.
//
// Serve plays the server's half, Run the client's; both call the caller's
// Peer at the seams where perftest touches its QP: Connect with the peer's
// keys after the first key message, Test where its side runs the test.
//
// Non-goals: perftest's RDMA-CM exchange (-R), UD, several QPs per
// connection (-q), bidirectional runs (-b), duration runs (-D). The report
// we send carries size and iterations only (the bandwidth fields are
// zero): perftest prints its own measurement, not ours.
package pftexchange
