// Package vhostuser implements the vhost-user wire protocol as QEMU's
// docs/interop/vhost-user.rst defines it: request numbers, protocol feature
// bits, the 12-byte header, payload codecs, per-request validation, and a
// Conn that moves whole messages with their SCM_RIGHTS fds over a unix
// stream socket. The back-end (backend, in vrdmad) and our Go front-end
// (vmm/frontend) both use it.
//
// # Non-goals
//
// No session logic lives here: which requests are allowed in which state,
// feature negotiation, ring state, memory mapping and replies to send are
// the backend's business. Check looks at one message in isolation (sizes,
// fd counts, the bits that decide fd counts); it does not judge values
// (ring index in range, region overlaps, enum values), which need session
// state. Postcopy, crypto sessions and the GPU socket are only numbered and
// size-checked.
//
// # Invariants
//
//   - Everything read from the peer is hostile. ReadMessage reads exactly
//     the header, then exactly Size <= MaxPayloadSize bytes into a fresh
//     buffer it owns; decoders check the exact length before they read and
//     return the zero value with every error.
//   - Fds arrive only with the header of a message (QEMU sends a message
//     with one sendmsg, which attaches them to its first byte). Fds with
//     the payload, a second batch, more than MaxFds, or truncated
//     control data are ErrProtocol, and every fd received is closed before
//     ReadMessage returns. Received fds are close-on-exec (package net asks
//     for MSG_CMSG_CLOEXEC).
//   - A returned Message owns its fds until TakeFd or CloseFds; Check never
//     closes them. Every fd not taken must be closed with CloseFds.
//   - ErrProtocol: the stream cannot be trusted any more; close the
//     connection. ErrInvalid: this message is bad; reply with an error (if
//     a reply is due), close its fds, and continue.
//   - Byte order is the machine's (little-endian on amd64, the only target).
//
// # Lock order
//
// Conn.callMu, then Conn.writeMu or Conn.readMu (never both at once);
// Conn.pauseMu is a leaf, taken under readMu or alone. ReadMessage may run
// concurrently with WriteMessage, and Pause and Resume with both.
package vhostuser
