// Package backend is the vhost-user back-end server: one unix socket per
// device, one session per front-end connection, the ring state machine of
// the vhost-user specification, and one worker goroutine per running ring.
//
// A device type implements Device (features, queue count, config space,
// the work on a queue, reset) and never sees the wire: session.go is the
// only code that knows vhost-user messages, in the manner of rust-vmm's
// vhost-user-backend.
//
// # Ring state machine
//
// A ring is configured by SET_VRING_NUM/ADDR/BASE while stopped, starts when
// its kick fd arrives (SET_VRING_KICK; the worker then looks for buffers at
// once, as a kick would make it), and stops at GET_VRING_BASE, which returns
// the next available index. Independently a ring is enabled or disabled
// (SET_VRING_ENABLE; enabled at once when VHOST_USER_F_PROTOCOL_FEATURES was
// not negotiated); a disabled ring's worker swallows kicks. A ring error
// (malformed chain, guest memory fault, device error) breaks that ring only:
// it is logged, the error eventfd is signalled, and the ring does nothing
// until the front-end sets it up again. RESET_DEVICE stops every ring and
// resets the device; a disconnect does the same and also unmaps memory and
// closes every fd, after which the socket accepts the next front-end.
//
// # Concurrency and lock order
//
// The session goroutine handles messages in order and is the only writer of
// session and ring configuration; it stops a ring's worker (and joins it)
// before changing what the worker reads. Queue.mu serialises work on a
// queue between its worker and a device that pushes from elsewhere
// (Queue.Run). Guest memory is a memmap.Memory: workers Acquire a table for
// each batch, so SET_MEM_TABLE swaps tables while workers run and old
// mappings go away when the last batch using them ends.
//
// Lock order: Server.mu → (none); Queue.mu → device locks; session.backendMu
// is a leaf.
//
// Non-goals: dirty logging and migration (LOG_SHMFD is not offered), packed
// rings, in-band notifications, inflight tracking.
package backend
