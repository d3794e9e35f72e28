// Package roceinterop runs vrdma's RoCEv2 against Linux soft-RoCE (rxe):
// the topology (two network namespaces: g holds the rxe guest's tap,
// bridged to a veth whose other end, in h, carries our address), the rxe
// guest (bin/rxe: Debian's generic kernel, rdma_rxe, perftest and
// guest/perftest-jobs) booted in g with QEMU's filter-dump recording its
// link, a vrdmad started in h with --roce-bind, the capture's checks (every
// RoCE frame's ICRC through backend/rdma/roce, tshark finds nothing
// malformed), and the vrdma side of perftest (Device, Serve, Run): a vrdma
// device opened on vrdmad's socket as a virtio-user front-end
// (vmm/frontend) and driven with guest/verbs, speaking perftest's TCP
// exchange (internal/pftexchange) as its server or its client, and
// verifying the data against its own memory and the capture.
//
// tests/ (TestRoCEInterop, TestRoCEInteropReverse, TestRoCEInteropVrdmad)
// and `vrdma-vmtest interop` use it.
//
// Non-goals: IPv6 (rxe's GID of eth0's IPv4 address only), impairment,
// several QPs per job, perftest programs beyond pftexchange's.
//
// Needs: root (namespaces, a tap), QEMU, bin/rxe (make rxe-image); tshark
// for the capture's dissection (CheckTshark). Functions that need a
// namespace (RunGuest, Listen, Dial) enter it with netlab's NS.Do; QEMU,
// started there, is tied to that thread (Pdeathsig), so the guest's whole
// life runs inside Do. vrdmad enters h through `ip netns exec`
// (vrdmadproc's NetNS) from a thread StartVrdmad keeps locked until Stop,
// for the same reason: a thread netlab's Do leaves ends, and the children
// it forked get SIGKILL (see StartVrdmad).
//
// Concurrency: a Lab's methods may be called from several goroutines (the
// guest runs while the perftest peer serves); a Device is used by one job
// at a time.
package roceinterop
