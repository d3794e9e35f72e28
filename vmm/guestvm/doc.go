// Package guestvm boots vrdma guests — QEMU VMs running the project's guest
// image (scripts/guest-image.sh: Debian's cloud kernel, busybox and the
// static vrdma-guest program) with vrdma devices attached over vhost-user —
// and talks to the program inside over a serial line.
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
// Non-goals: building the guest image, running the back-end (vrdmad) and
// speaking vhost-user; a guest's devices must already be listening.
//
// Invariants:
//   - QEMU never outlives its Guest: Close kills it (and vmm/qemu starts it
//     with Pdeathsig, so it dies with this process too). Boot leaves nothing
//     behind on failure.
//   - Everything the guest prints is kept (the newest 16 MiB) for failure
//     reports (Guest.Log); a line longer than 64 KiB is cut there. Guest
//     output is untrusted: lines are parsed defensively and never panic.
//   - Lines and WaitResult each read the whole line log from its start with
//     their own cursor: readers never steal lines from each other, and a
//     slow reader never stalls the console.
//
// Lock order: Guest.mu (the line log) is a leaf; Guest.wmu (writes to the
// console) is a leaf and never held with mu.
package guestvm
