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
// # Concurrency
//
// The session goroutine handles messages in order and is the only writer of
// session and ring configuration; it stops a ring's worker (and joins it)
// before changing what the worker reads. Queue.mu serialises work on a
// queue between its worker and a device that pushes from elsewhere
// (Queue.Run). Guest memory is a memmap.Memory: workers Acquire a table for
// each batch, so SET_MEM_TABLE swaps tables while workers run and old
// mappings go away when the last batch using them ends.
//
// # Lock order
//
// Each lock may be held while taking the ones below it, never the reverse:
//
//  1. Queue.mu of the queue being worked on (by its worker around
//     HandleQueue, or by Queue.Run)
//  2. the device's own locks
//  3. Queue.mu of another queue, through Queue.Run
//  4. session.backendMu, then, after releasing it, the backend channel's
//     vu.Conn write lock (NotifyConfigChange)
//
// A device keeps one order among its queues (the rdma device runs the
// event queue from the control queue's commands, and the event queue's
// handler takes none of its locks), and never calls Queue.Run on the queue
// it is handling: the lock is not reentrant. session.backendMu is a leaf
// and nothing blocks while it is held: NotifyConfigChange copies the
// channel under it and writes after releasing it, so that teardown can
// close a channel a writer is stuck on. The session goroutine takes each
// Queue.mu alone, and never while it waits for a worker (stop joins the
// worker first, then locks). Server.mu is taken with no other lock held and
// held only around Server fields (and newSession, whose only call out is
// Device.NumQueues); Server.freezeMu, which serialises Freeze and Thaw, is
// taken before it. session.pauseMu (the pending Freeze) is a leaf, and so
// is vhostuser.Conn's pause lock under it. Lock-free: memmap.Memory (atomic table swap), Stats,
// and the ring flags (enabled, stopping, broken, wakeFd).
//
// # Errors
//
// What a front-end gets for what it sends (session.handle):
//
//   - A message the stream cannot survive closes the connection: a bad
//     header (version, payload above vu.MaxPayloadSize), EOF inside a
//     message, fds sent with the payload or in two batches, more than
//     vu.MaxFds fds. So does a request with the reply flag set, and a
//     failing request that always replies (GET_FEATURES, GET_VRING_BASE
//     of a ring out of range, GET_INFLIGHT_FD...), whose reply has no
//     failure form; GET_CONFIG is the exception and answers with an empty
//     payload.
//   - Any other request that is malformed (payload size, fd count),
//     unknown, not offered, or refused (ring index out of range, queue
//     size not a power of two up to Device.MaxQueueSize, configuration of
//     a started ring, a memory table with overlapping, empty, overflowing
//     or too many regions or a region past the end of its file, a kick,
//     call or error fd that is a regular file or a directory...) changes
//     nothing and is answered with REPLY_ACK status 1 when need_reply was
//     set and REPLY_ACK negotiated, and not at all otherwise.
//   - Ring addresses are front-end virtual addresses, translated when the
//     ring starts and again after every change of the memory table, so
//     SET_VRING_ADDR itself accepts any; a ring whose parts the table does
//     not cover wholly breaks (see above) when it starts or next runs.
//
// Every fd that came with a message and is not kept is closed. A session
// that fails affects no other session or device.
//
// SET_OWNER is recorded but not required: QEMU sends GET_FEATURES, the
// protocol features, GET_QUEUE_NUM, GET_MAX_MEM_SLOTS and
// SET_BACKEND_REQ_FD before it, and a connection has exactly one front-end,
// so requests before SET_OWNER are served as after it, as libvhost-user
// and DPDK do. RESET_OWNER resets the device as RESET_DEVICE does.
//
// # Cost of a device
//
// Measured with `vrdma-bench --only density` (vrdmad with N = 500…1660
// rdma devices, one doorbell queue, QEMU-order virtio-user front-ends in
// other processes; per device, over an empty vrdmad). A connected device
// held 11 descriptors then: its listening socket (1, also while nobody is
// connected), the vhost-user connection (1), the backend channel (1), a
// kick and an error eventfd for each of its 3 rings (6), and a call
// eventfd for the control and event queues (2). The doorbell queue's call
// eventfd is not kept (the session checks and closes it: the device is an
// Interrupter, nothing is ever pushed to a doorbell queue). Since the live
// upgrade the memory region's fd is kept too, the 12th (one per region):
// nothing else needs it after mmap (pins are mlocks of the mapping, a
// truncated file is a SIGBUS that memmap.Guard contains, INFLIGHT_SHMFD is
// not offered, a reconnecting front-end sends its fds again), but a
// handover must pass the file to the next process, and the front-end
// does not send it again. It runs 5 goroutines: the
// accept loop (also while listening), the session, and a worker per
// started ring, each parked in the netpoller on its socket or kick eventfd:
// no OS thread each (vrdmad runs ~10 threads whatever N) and no CPU while
// idle (1,660 idle devices: 0 ns in 10 s). VmRSS is ~106 KiB: ~44 KiB
// anonymous — goroutine stacks ~18 KiB, heap ~17 KiB (session, rings,
// virtqueues, eventfd files, device objects, logger fields, the control
// scratch that the first command allocates) — and ~64 KiB of the guest's
// own memfd pages, which the daemon's first reads of the rings map by
// fault-around (shared with the guest, not allocated here); page tables
// add ~4 KiB (VmPTE). A listening device costs ~14 KiB. Until now every
// device also allocated a 68 KiB control scratch at creation (85 % of the
// daemon's live heap: the GC let garbage grow to match it) and each
// vhost-user message built a log entry that nothing wrote. What is left is
// per ring by design: a worker pool waiting on every kick from one poller
// would take the 3 workers' stacks (and one accept loop could serve all
// listening sockets), but the 9 eventfds are the front-end's and stay.
//
// # Live upgrade
//
// A running Server hands its socket and its connected front-end to a new
// process (vrdmad's upgrade; the front-end notices nothing: no message,
// no reconnect, no reset). Server.Freeze stops the accept loop (a past
// deadline on the listener, which stays open and keeps its path), then
// asks the session goroutine to pause: vhostuser.Conn.Pause sets a past
// read deadline, and ReadMessage reports ErrPaused only before the first
// byte of a message (a message it began is read and handled first). On
// its goroutine the session then records instead of sending the device's
// config changes (after waiting for one being written), stops and joins
// every ring worker while keeping its device queue (vring.pause; kicks
// stay in the eventfds, Queue.Run returns ErrQueueStopped), and describes
// itself (ServerState, state.go) with dups of its descriptors: the
// connection, the backend channel, each region's file (memmap keeps it),
// each ring's eventfds; a started ring's last_avail and used index come
// from its device queue. Thaw resumes everything (each worker looks at its
// ring once). Adopt rebuilds a Server from a state and the descriptors as
// hostile input, maps the same files at new host addresses (front-end
// and guest addresses, which rings and the device use, are unchanged),
// makes the started rings' device queues at the carried indices, attaches
// the device and starts nothing; Serve then resumes the rings and the
// session and accepts. A frozen server's Close and Disconnect still end
// its session (its device is reset, its own descriptors closed, nothing is
// sent), but after a handover the old process exits instead.
//
// # Live migration
//
// A device that implements StateSaver moves its state with the VM through
// the front-end (devstate.go): the back-end offers DEVICE_STATE; with every
// ring stopped, SET_DEVICE_STATE_FD (phase stopped) gives it one end of a
// pipe. Save: the device's state is taken at once (SaveState, into memory,
// at most MaxDeviceState bytes; a refusal is the reply's failure, and the
// front-end cancels the migration) and a goroutine writes it as the
// front-end reads. Load: a goroutine reads the stream to its end, at most
// MaxDeviceState bytes (it stops reading past them). CHECK_DEVICE_STATE
// waits for the goroutine and, for a load, gives the bytes to LoadState on
// the session goroutine: 0 when all went well. The back-end never returns
// a channel of its own. The rings, memory and features are not device
// state: the destination's front-end sets them up as for any start.
//
// A device that implements Suspender learns when it is suspended: the
// GET_VRING_BASE that stops the last started ring while the driver runs
// (DRIVER_OK, when STATUS was negotiated) calls Suspend(true) before its
// reply, so that the device stops writing guest memory — the vrdma device
// fences its same-host peers — before QEMU copies the memory a last time;
// the start of a ring while none is started calls Suspend(false). Both on
// the session goroutine; a reset or teardown ends a suspension without a
// call (Device.Reset).
//
// # Dirty logging
//
// While the front-end migrates the guest it must copy every page the
// back-end writes (session_log.go). The session offers LOG_SHMFD, and
// VHOST_F_LOG_ALL for a device that says it logs all its writes
// (DirtyLogger; the vrdma device on the software RNIC does, on a host NIC
// it does not: the NIC's DMA is invisible). SET_LOG_BASE maps the log
// (memmap.MapDirtyLog; its fd is closed at once) and answers a u64: 0, or
// 1 for a log that is malformed, unmappable or does not cover the memory
// table and the logged used rings (never written). SET_LOG_FD is checked
// and closed. Logging is on while LOG_ALL is acked and a log is set: the
// session installs the log in the Memory (memmap.Memory.SetLog), so every
// table acquired from then on marks into it, and answers only once every
// worker let go of the tables from before (bounded by logDrainTimeout,
// then a warning): from the answer on, no write escapes the log. LOG_ALL
// off drops the log. SET_VRING_ADDR may change VHOST_VRING_F_LOG while the
// ring runs; the ring's used-ring stores are then marked at its
// log_guest_addr (vring.LogUsed, called by virtio.DeviceQueue after each
// store). Descriptor buffers are marked by virtio.Chain.Scatter, the
// device's engine marks its own writes (backend/rdma/engine, "Dirty
// logging"). A SET_MEM_TABLE or ADD_MEM_REG whose regions the log does not
// cover is refused.
//
// Non-goals: packed rings, in-band notifications, inflight tracking.
package backend
