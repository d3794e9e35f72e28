// Package hostniclab proves vrdmad's verbs RNIC (vrdmad --rnic
// verbs:DEVICE: the host's RDMA NIC through rdma-core, issue 26) with a
// real kernel RDMA device. This machine's kernel loads no modules, so the
// "host NIC" is Linux rxe inside a TCG guest: `vrdma-vmtest hostnic` and
// tests/hostnic_test.go boot two guests from the rxe image (bin/rxe,
// scripts/rxe-image.sh: Debian's generic kernel with rdma_rxe, Debian's
// user space with glibc, libibverbs, the rxe provider, perftest and the
// rdma tool) joined by one virtio-net link (QEMU -netdev dgram over two
// UDP ports of 127.0.0.1, as internal/rxepair's pairs; no namespaces, no
// root):
//
//   - guest A, the "host" (HostIP): guest/rxe-init's exec mode loads
//     rdma_rxe, creates rxe0 on eth0 and runs /extra/job.sh, which starts
//     the agent (RunAgent; vrdma-vmtest's hidden hostnic-agent). The agent
//     counts rxe0's objects (`rdma resource show`: the baseline), starts
//     vrdmad (internal/vrdmadproc) with the RNIC's flags (RNICArgs) and one
//     device (two for local pairs and the kill scenario), and runs each job
//     with client processes (RunClient; hidden hostnic-client): a
//     virtio-user front-end on the device's socket driven with guest/verbs,
//     exactly internal/roceinterop's OpenDevice, Serve/Client and Run,
//     speaking perftest's TCP exchange (internal/pftexchange).
//   - guest B, the peer (PeerIP): guest/rxe-init's perftest mode, Debian's
//     perftest on rxe as the server (vrdma is the requester) or, Reverse,
//     as the client.
//
// The programs reach guest A without rebuilding the image: Linux unpacks
// concatenated initramfs archives, so Run appends a newc archive
// (WriteNewc: /extra/vrdmad, /extra/vrdma-vmtest, /extra/spec.json with
// the AgentSpec, /extra/job.sh) to bin/rxe/initramfs.img. The agent binary
// must be static (CheckAgent); a dynamically linked vrdmad (cgo, the verbs
// RNIC dlopens libibverbs.so.1) is checked against the image's files
// first (CheckVrdmad: its interpreter and every DT_NEEDED library).
//
// What a run checks, per job (one VRDMA-RESULT line of role ResultRole
// each, a JobResult):
//
//   - the exchange: the peer learns our QPN, rkey and address and reads
//     and writes there (pftexchange's keys; the result carries both
//     sides');
//   - the data: between two vrdma devices (LocalPair) both memories must
//     be exactly what the op leaves (Expect models write, write with
//     immediate, read, send and atomic from the two seeds; the clients
//     report SHA-256 of their memory); against perftest, whose buffers are
//     random, roceinterop's local checks (completions in order, READs all
//     alike, FETCH_ADDs consecutive, receives complete) and what our
//     memory shows (checkAgainstPerftest: WRITEs and SENDs landed where we
//     advertised and nowhere else, READs brought the peer's bytes);
//   - the RNIC's objects (RDMADev, with a verbs RNIC): while a client's
//     objects exist rxe0 holds more MRs and QPs than the baseline (the
//     listing, `rdma resource show mr`, is in the result); once the client
//     ended its counts are again what they were with vrdmad up before the
//     first client (within Settle: vrdmad tears down what a front-end
//     leaves when its connection drops), and after vrdmad stopped what
//     they were before it started; vrdmad's own counts (the control API)
//     are zero;
//   - the kill scenario (KillJob): a local pair's requester gets SIGKILL
//     mid-transfer; the RNIC and vrdmad must then hold nothing of it, and a
//     new job on the same devices must pass.
//
// For cmd/vrdma-bench's verbs section a run can also measure: Plain
// (with Reverse) serves each job alternately by Debian's perftest on rxe0
// in guest A itself, without vrdma, and by the vrdma client, so guest B's
// perftest figures compare the NIC with and without the para-virtual
// layer; LocalJobs add local pairs to the same boot; Account makes vrdmad
// serve its metrics on a unix socket and each vrdma requester sample, just
// before its first post and after its last completion, vrdmad's CPU time
// (ProcCPU) and the NIC's counters (vrdma_hostnic_*: WQEs posted, time in
// ibv_post_send/recv), with the guest's speed (Calibrate) beside them
// (JobResult.Window).
//
// The soft RNIC (SoftRNIC: vrdmad --roce-bind HostIP) runs the same jobs
// without rxe in guest A (rdma_rxe's kernel socket would hold UDP port
// 4791): the baseline that works without the verbs RNIC.
//
// Non-goals: latency ops (write_lat), several QPs per job, impairment, a
// capture of the link (internal/roceinterop's interop lab has one), and
// WRITE with immediate against perftest (Debian 12's perftest 6.06 has no
// --write_with_imm: it runs between two vrdma devices only).
//
// Concurrency: Run drives both guests from its goroutine and one more per
// guest; the agent runs one job at a time, a local pair's two client
// processes at once. Nothing here is shared between Runs.
package hostniclab
