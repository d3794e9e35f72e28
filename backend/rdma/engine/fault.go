package engine

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Faults in another device's guest memory.
//
// An engine runs under memmap.Guard, which turns a memory fault (SIGBUS
// after a front-end shrank the file behind a region) into an error that
// breaks the engine's doorbell queue. That is right for the memory of the
// engine's own device, and wrong for the responder's: a requester also
// touches the peer's receive queue, record, CQ and MRs, and a peer whose
// memory vanished must not break the requester's queue, which did nothing
// wrong. So the responder side runs inside respondContained, which
// recovers a fault, attributes it by its address to the table whose
// mappings hold it, and handles a fault of the peer's memory as the
// peer's error (docs/spec.md § Semantics, "Memory that faults"); any other
// panic, and a fault in the requester's own memory, is raised again
// unchanged for Guard.

// respondContained is respond with a fault in the responder's guest memory
// contained: the WR then completes with REM_OP_ERR (the step moves the
// requester QP to ERR as for any error completion) and the responder QP
// moves to ERR with a QP_FATAL event on its device. The deferred closure
// is open-coded (no allocation).
func (r *request) respondContained() (o outcome) {
	defer func() {
		if v := recover(); v != nil {
			o = peerFault(v, r.t, r.pt, r.pq)
			if r.ud {
				o = succeeded(r.total) // the sender learns nothing
			}
		}
	}()
	return r.respond()
}

// peerFault handles v, a value recovered from respond. A memory fault at an
// address that the responder's table pt maps and the requester's table t
// does not (a loopback QP shares them: its faults are its own device's) is
// the responder's: pq moves to ERR with QP_FATAL and the requester's WR
// gets REM_OP_ERR. Everything else is panicked again with the same value.
// respond released its locks (by defer) before this runs.
func peerFault(v any, t, pt *memmap.Table, pq *QP) outcome {
	addr, ok := memmap.FaultAddr(v)
	if !ok || !pt.MapsHost(addr) || t.MapsHost(addr) {
		panic(v)
	}
	pq.toErr(true)
	if pq.Dev != nil {
		pq.Dev.warnFault(pq.Num, addr)
	}
	return failed(abi.WCRemOpErr)
}

// faultLogAt rate-limits the warning of peerFault to one per second for the
// daemon: any guest can trigger it.
var faultLogAt atomic.Int64

// warnFault logs (rate-limited) that the guest memory of d faulted under a
// remote operation on its QP qpn.
func (d *RNIC) warnFault(qpn uint32, addr uintptr) {
	now := monoNow() + 1 // never 0, which means "not logged yet"
	last := faultLogAt.Load()
	if (last != 0 && now-last < int64(time.Second)) || !faultLogAt.CompareAndSwap(last, now) {
		return
	}
	d.log.WithFields(logrus.Fields{"qp": qpn, "addr": fmt.Sprintf("%#x", addr)}).
		Warn("guest memory faulted under a remote operation: responder QP moved to ERR")
}

// loadSQPI reads the send producer index of pq's record on pt, the table of
// pq's device, for RNIC.Reset, which runs outside any engine and outside
// memmap.Guard: pt's memory may fault (its front-end shrank it), which
// must not take down the daemon. It reports false if the record is not in
// guest memory or faulted.
func loadSQPI(pt *memmap.Table, pq *QP) (pi uint32, ok bool) {
	rec, err := pt.Slice(pq.Record, abi.QPRecordSize)
	if err != nil {
		return 0, false
	}
	if err := memmap.Guard(func() { pi = abi.LoadUint32(rec, abi.QPRecordSQPI) }); err != nil {
		return 0, false
	}
	return pi, true
}
