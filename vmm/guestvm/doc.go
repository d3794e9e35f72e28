// Package guestvm boots vrdma guests — QEMU VMs running the project's guest
// images (scripts/guest-image.sh: Debian's cloud kernel, busybox and the
// static vrdma-guest program; scripts/guest-stack-image.sh: the standard
// RDMA stack) with vrdma devices attached over vhost-user — and talks to
// the program inside over a serial line.
//
// A guest's /init (guest/init) reads its job from the kernel command line
// (vrdma.run, vrdma.args, vrdma.hugepages, vrdma.console), runs
// `/bin/vrdma-guest RUN ARGS` with stdin and stdout on the protocol line,
// prints "VRDMA-EXIT <code>" and powers the machine off. Boot puts that line
// on the guest's second UART (ttyS1), wired to a unix-socket chardev this
// package connects to, so the harness both reads the guest's lines and
// writes lines to it; the kernel log stays on ttyS0, which package
// vmm/qemu keeps (qemu.VM.Serial).
//
// Line protocol (one line each, prefix then a space):
//
//	VRDMA-INIT <kernel release>   init started
//	VRDMA-RESULT <json>           a result (Result); any number
//	VRDMA-EXCHANGE <json>         an endpoint to hand to the peer guest
//	VRDMA-PEER <json>             written by the harness: the peer's endpoint
//	VRDMA-ERROR <message>         a failure, with its reason
//	VRDMA-EXIT <code>             vrdma-guest's exit status; the guest powers off
//
// Pair runs a server guest and a client guest and relays each one's
// VRDMA-EXCHANGE line to the other as VRDMA-PEER.
//
// Stack guests. BootStack boots the standard-RDMA-stack image instead
// (scripts/guest-stack-image.sh: the vrdma kernel driver, libibverbs with
// the vrdma provider, perftest, ibverbs-utils, iproute2, strace), whose
// /init (guest/stack-init) runs one shell command (StackConfig.Command,
// base64 on the kernel command line) and speaks the same protocol with more
// lines:
//
//	VRDMA-WAIT                    (StackConfig.Gate) waiting for VRDMA-GO
//	VRDMA-GO                      written by the harness (Release)
//	VRDMA-CMD-START <uptime>      the command starts; its output follows
//	VRDMA-LISTEN <port>           (AnnounceListen) a TCP socket listens
//	VRDMA-CMD-EXIT <code>         the command's exit status
//	VRDMA-RMMOD ok|failed: ...    rmmod vrdma after the command
//	VRDMA-KERNEL-WARNING <line>   a kernel log line that looks like trouble
//	VRDMA-EXIT <code>             the command's status again; power off
//
// Guest.RunCommand follows that to the end (CommandResult). A stack guest
// has a virtio-net NIC (StackConfig.NIC, qemu.NIC) whose MAC the vrdma
// device's node GUID mirrors (abi.GUIDOfMAC in virtio/rdma/abi), so the driver binds its RoCE
// port to eth0. StackPair boots a server and a client joined by a private
// NIC link, lets the client's command start once the server's listens, and
// stops one side PeerGrace after the other failed; StackPairResult.ExitCode
// is `vrdma-vmtest exec-pair`'s exit status.
//
// Live migration (migrate.go). Guest.StartMigration starts a second QEMU
// with the guest's machine (qemu.Config.Incoming), its own console socket
// and the devices MigrateConfig names (back-ends ready to take the
// source's over: vrdmad's incoming devices), and migrates the guest there;
// Migration.Wait follows it to the end and, once the destination runs,
// switches the Guest over: VM returns the destination, WriteLine writes to
// its console, and the console reader reads the source's console to its
// end (the source QEMU quits) and goes on with the destination's, so the
// line log, WaitResult and Lines readers never notice (a line cut by the
// switch-over is whole). Migration.Cancel cancels one in flight; a
// failed or cancelled migration kills the destination, and the guest runs
// on in the source. Guest.Migrate is both steps.
//
// Non-goals: building the guest images, running the back-end (vrdmad) and
// speaking vhost-user; a guest's devices must already be listening.
//
// Invariants:
//   - QEMU never outlives its Guest: Close kills it, and the destination
//     of a migration in flight (vmm/qemu starts both with Pdeathsig, so
//     they die with this process too). Boot and StartMigration leave
//     nothing behind on failure.
//   - Everything the guest prints is kept (the newest 16 MiB) for failure
//     reports (Guest.Log); a line longer than 64 KiB is cut there. Guest
//     output is untrusted: lines are parsed defensively and never panic.
//   - Lines and WaitResult each read the whole line log from its start with
//     their own cursor: readers never steal lines from each other, and a
//     slow reader never stalls the console.
//
// Lock order: Migration.mu, then Guest.vmMu (the QEMU, its directory, the
// migration in flight), then Guest.wmu (writes to the console, and the
// connection they go to). The line log's mutex and consoleStream.mu are
// leaves.
package guestvm
