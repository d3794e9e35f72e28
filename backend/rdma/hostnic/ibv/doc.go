// Package ibv is a thin binding of the host's libibverbs (rdma-core) for
// vrdmad's "verbs" RNIC (issue 26), which drives a real RDMA NIC: guest
// memory is registered with ibv_reg_mr_iova2 at the guest's own
// addresses, guest QPs and CQs are host QPs and CQs, and the doorbell
// engine posts guest WQEs to host QPs in chains and turns host
// completions into guest CQEs in batches.
//
// # dlopen, not a link
//
// The package uses cgo but does not link against libibverbs: one vrdmad
// binary must start on hosts without rdma-core. Load (called by every
// entry point, once) dlopens "libibverbs.so.1" with RTLD_NOW|RTLD_LOCAL
// and resolves every exported function it uses with dlsym into a table
// (shim.c), committed only when all are found; a failure is a *LoadError
// (ErrLoad) that quotes dlerror() and names the Debian packages to
// install, libibverbs1 and ibverbs-providers. dlsym returns each symbol's
// default version (ibv_create_cq@@IBVERBS_1.1, not the 1.0 compat one).
// The data-path verbs of verbs.h (ibv_post_send, ibv_post_recv,
// ibv_poll_cq, ibv_req_notify_cq) are static inlines through
// context->ops and reference no symbol, so the C helpers call them as
// they are; ibv_query_port is a macro over an inline that falls back to
// the exported compat ibv_query_port, so shim.c repeats that inline with
// the resolved pointer. ibv_query_gid_ex (the inline over
// _ibv_query_gid_ex, rdma-core 32+) gives GID types; without it GIDType
// reads sysfs. Nothing names an exported ibv_ function outside
// __typeof__, so an accidental call fails the link, and
// TestNoLibibverbsLink checks the test binary needs neither the library
// nor an ibv_ symbol. Building needs gcc and libibverbs-dev (headers
// only); running needs libibverbs1 and a provider.
//
// Built without cgo (CGO_ENABLED=0) or off Linux, the package has the
// same API and every entry point returns ErrNoCgo (stub.go;
// TestStubMatchesAPI keeps the two in step).
//
// # Constants
//
// The IBV_* values are generated from the installed verbs.h by
// mkconst.go (go generate) into zconst.go, usable in both builds;
// zconst_check.go, compiled in every cgo build, fails to compile if a
// value differs from the header's.
//
// # No allocation on the data path
//
// PostSend and PostRecv take caller-owned slices of SendWR/RecvWR (a
// compact fixed layout mirrored by struct vibv_send_wr/vibv_recv_wr in
// shim.h) and of SGE (laid out as struct ibv_sge); a WR's scatter list is
// a FirstSGE/NumSGE window of the SGE slice. One cgo call checks every WR
// (its window inside the slice, NumSGE within the QP's max; an invalid WR
// rejects the whole batch before anything is posted), converts the batch
// into an ibv_send_wr chain in C scratch memory allocated once per QP at
// create time (the actual max_send_wr, at most 4096, × max SGE), posts
// it with ibv_post_send (longer batches in chunks, in the same call), and
// returns how many WRs were posted; on a provider error that is the
// index of bad_wr. CQ.Poll has ibv_poll_cq write straight into the
// caller's []WC, whose layout is struct ibv_wc. None of the three
// allocates (TestHotPathNoAlloc). Go memory is passed to C only for the
// duration of a call and holds no Go pointer; C never keeps it.
// TestLayouts checks every mirrored offset against the C compiler's.
//
// # Byte orders
//
// SendWR.Imm and WC.ImmData are __be32: the four bytes as they are on
// the wire, loaded as a native uint32 (Htonl/Ntohl convert numbers);
// imm data a guest wrote in wire order passes through unchanged. GIDs are
// 16 bytes in network order. DeviceInfo.GUID and DeviceAttr.NodeGUID are
// numbers (converted from big endian). SGE addresses, remote addresses,
// keys, lengths and atomic operands are host-order numbers.
//
// # Concurrency
//
// libibverbs allows concurrent verbs on different objects, and the
// package adds no global lock: any goroutine may post to one QP while
// another polls a CQ or posts to another QP. A QP's send WR scratch is
// guarded by the QP's send mutex and its receive scratch by its receive
// mutex, so concurrent PostSend calls on one QP are safe (serialised);
// the intended use is one poster per QP, for which the mutex is
// uncontended. One goroutine polls a CQ at a time. GetCQEvent and
// GetAsyncEvent park in Go's netpoller (the channel and async fds are
// made non-blocking; a close-on-exec dup of each is an *os.File), so no
// OS thread blocks in read; TryGetCQEvent/TryGetAsyncEvent are the
// non-blocking forms for a caller with its own poll loop on Fd/AsyncFd.
// Closing a channel or context wakes its waiters with ErrClosed.
//
// Objects are destroyed children first: QPs, then CQs and MRs, then PDs
// and channels, then the Context. Destroy/Close of an object must not run
// concurrently with other use of it (PostSend/PostRecv/Modify/Query after
// QP.Destroy return ErrClosed; Poll after CQ.Destroy is a use after
// free). CQ events returned by GetCQEvent must be acknowledged with
// CQ.AckEvents (batched is fine); CQ.Destroy acknowledges what is left,
// as ibv_destroy_cq waits for it. Async events are acknowledged before
// GetAsyncEvent returns. Lock order: QP send mutex, then receive mutex.
//
// # Non-goals
//
// UD, UC, XRC, SRQs, memory windows, address handles, the extended verbs
// (ibv_wr_*, ibv_create_cq_ex, ibv_query_device_ex), on-demand paging
// beyond passing AccessOnDemand, and ibv_fork_init (vrdmad does not fork
// with registered memory; Go's os/exec uses vfork semantics). No policy:
// choosing a GID, an MTU or timeouts is the caller's.
package ibv

//go:generate go run mkconst.go
