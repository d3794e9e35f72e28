package udp

import (
	"net/netip"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
)

// port is a QP's rc.Port: it seals the QP's packets for its peer and
// queues them in the endpoint's send batch.
type port struct {
	e      *Endpoint      // immutable
	peer   netip.AddrPort // immutable
	flow   roce.Flow      // immutable: the ICRC's pseudo header, from the endpoint's address and port to peer
	qp     *rc.QP         // set once before the port is used
	queued atomic.Bool    // in e.ready
}

// newPort returns a port to peer, whose address is of the endpoint's
// family and whose port is set.
func (e *Endpoint) newPort(peer netip.AddrPort) *port {
	ip := roce.IPHeader{Src: e.cfg.Addr, Dst: peer.Addr(), FlagsFragment: roce.IPv4DF}
	return &port{e: e, peer: peer, flow: roce.NewFlow(ip, e.local.Port(), peer.Port())}
}

var _ rc.InPlacePort = (*port)(nil)

func (p *port) Send(pkt []byte) { p.e.send(p, pkt) }
func (p *port) Flush()          { p.e.flush() }

func (p *port) Wake() {
	if p.queued.CompareAndSwap(false, true) {
		select {
		case p.e.ready <- p:
		default: // cannot happen: ready holds MaxQPs and a port once
			p.queued.Store(false)
		}
	}
}

// Reserve locks the send batch and returns its next buffer, n bytes
// (rc.InPlacePort; at most bufSize: a larger n gets nil, which Commit
// then takes). The batch always has a free buffer: a full one leaves at
// once.
func (p *port) Reserve(n int) []byte {
	e := p.e
	e.txMu.Lock()
	if n < 0 || n > bufSize {
		return nil
	}
	return e.tx.bufs[e.txN][:n]
}

// Commit seals and queues the packet Reserve's room holds (its first
// len(pkt) bytes), or with nil queues nothing, and unlocks the batch.
func (p *port) Commit(pkt []byte) {
	e := p.e
	defer e.txMu.Unlock()
	if pkt != nil {
		e.queueLocked(p, len(pkt))
	}
}

// send seals pkt and queues it; a full batch leaves at once.
func (e *Endpoint) send(p *port, pkt []byte) {
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if len(pkt) > bufSize {
		e.ctr.txErrors.Add(1)
		return
	}
	copy(e.tx.bufs[e.txN], pkt)
	e.queueLocked(p, len(pkt))
}

// queueLocked seals the n-byte packet in the batch's next buffer and
// queues it for p's peer; a full batch leaves at once. Precondition: txMu
// held.
func (e *Endpoint) queueLocked(p *port, n int) {
	i := e.txN
	if err := p.flow.Seal(e.tx.bufs[i][:n]); err != nil {
		e.ctr.txErrors.Add(1)
		return
	}
	e.tx.setSend(i, n, p.peer)
	e.txDst[i], e.txLen[i] = p.peer, n
	e.txN++
	if e.txN == len(e.tx.hdrs) {
		e.flushLocked()
	}
}

func (e *Endpoint) flush() {
	e.txMu.Lock()
	defer e.txMu.Unlock()
	e.flushLocked()
}

// flushFrom flushes the send batch if it holds at least n packets: the
// pump goroutine's, between the bursts of a QP that has more to send (no
// QP lock held), so that a long run leaves in large sendmmsg calls and
// large GSO super-datagrams without waiting for the run's end.
func (e *Endpoint) flushFrom(n int) {
	e.txMu.Lock()
	defer e.txMu.Unlock()
	if e.txN >= n {
		e.flushLocked()
	}
}

// flushLocked sends the queued datagrams with as few sendmmsg calls as the
// kernel allows, waiting while the socket buffer is full: runs of packets
// that GSO can carry go as one super-datagram each (planRuns), the rest
// one message each. A datagram the kernel refuses (EMSGSIZE above the
// path MTU, an unreachable network) is dropped and counted, each segment
// of a refused super-datagram likewise: the protocol recovers it as a
// loss. A super-datagram refused for want of GSO (gsoRefused) turns GSO
// off for the socket, and what was not sent goes again without it.
// Every pass of the loop sends a message, drops one, or (once) turns GSO
// off. Precondition: txMu held.
func (e *Endpoint) flushLocked() {
	e.planLocked(0)
	for e.txOff < len(e.txPlan.runs) {
		if err := e.raw.Write(e.sendFn); err != nil {
			for _, r := range e.txPlan.runs[e.txOff:] {
				e.ctr.txErrors.Add(uint64(r.n))
			}
			break
		}
		e.ctr.txCalls.Add(1)
		if e.txErrno != 0 {
			r := e.txPlan.runs[e.txOff]
			if r.n > 1 && gsoRefused(e.txErrno) && e.gso.CompareAndSwap(true, false) {
				e.log.WithField("addr", e.local).WithError(e.txErrno).Warn("udp: the kernel refused a GSO super-datagram: sending a datagram at a time")
				e.planLocked(r.first)
				continue
			}
			e.ctr.txErrors.Add(uint64(r.n))
			e.warn("sendmmsg", e.txErrno)
			e.txOff++
			continue
		}
		for _, r := range e.txPlan.runs[e.txOff : e.txOff+e.txSent] {
			e.ctr.txDatagrams.Add(uint64(r.n))
			if r.n > 1 {
				e.ctr.txGSO.Add(1)
			}
		}
		e.txOff += e.txSent
	}
	e.txN = 0
}

// planLocked plans the messages of the queued packets from packet from on
// and starts the flush at the first. Precondition: txMu held.
func (e *Endpoint) planLocked(from int) {
	pl := e.txPlan
	pl.runs = planRuns(e.txLen[from:e.txN], e.txDst[from:e.txN], e.gso.Load(), pl.runs[:0])
	for k := range pl.runs {
		pl.runs[k].first += from
	}
	pl.build(e.tx)
	e.txOff = 0
}

// sendOnce is flushLocked's sendmmsg from message txOff. Precondition:
// txMu held.
func (e *Endpoint) sendOnce(fd uintptr) bool {
	for {
		e.txSent, e.txErrno = mmsg(unix.SYS_SENDMMSG, fd, e.txPlan.hdrs[e.txOff:len(e.txPlan.runs)])
		if e.txErrno != unix.EINTR {
			return e.txErrno != unix.EAGAIN
		}
	}
}

// recvOnce is the receive goroutine's recvmmsg into the whole batch.
func (e *Endpoint) recvOnce(fd uintptr) bool {
	for i := range e.rx.hdrs {
		e.rx.resetRecv(i)
	}
	for {
		e.rxGot, e.rxErrno = mmsg(unix.SYS_RECVMMSG, fd, e.rx.hdrs)
		if e.rxErrno != unix.EINTR {
			return e.rxErrno != unix.EAGAIN
		}
	}
}

var lastWarn atomic.Int64

// warn logs at most one warning a second for the whole process.
func (e *Endpoint) warn(op string, err error) {
	now := time.Now().UnixNano()
	if last := lastWarn.Load(); now-last > int64(time.Second) && lastWarn.CompareAndSwap(last, now) {
		e.log.WithField("addr", e.local).WithError(err).Warn("udp: " + op)
	}
}

// receive is the receive goroutine: recvmmsg, then each datagram to its
// QP; the QPs it touched flush their coalesced ACKs after the batch.
func (e *Endpoint) receive() {
	defer e.wg.Done()
	faultsPanic()
	var gen uint64
	for {
		if err := e.raw.Read(e.recvFn); err != nil {
			return // closed, or frozen: Freeze set a read deadline in the past
		}
		n := e.rxGot
		if e.rxErrno != 0 {
			e.warn("recvmmsg", e.rxErrno)
			continue
		}
		e.ctr.rxCalls.Add(1)
		gen++
		for i := range n {
			e.handle(i, gen)
		}
		for i, ent := range e.touched {
			ent.flush()
			e.touched[i] = nil
		}
		e.touched = e.touched[:0]
	}
}

// faultsPanic makes a memory fault on the calling goroutine a panic
// instead of the end of the process: the QPs' Hosts touch guest memory,
// which a front-end can make fault (it shrinks the file behind it), and
// recover such faults themselves (memmap.FaultAddr). It never unsets it: the
// endpoint's goroutines do nothing else.
func faultsPanic() { debug.SetPanicOnFault(true) }

// handle splits message i of the receive batch into its datagrams (one,
// or those the kernel coalesced with UDP_GRO: its control message gives
// their size, groSegments the split) and hands each to deliver. A buffer
// the kernel truncated counts as one truncated datagram, as does a
// coalesced one whose control message was cut off (MSG_CTRUNC: its
// datagrams cannot be told apart); datagrams shorter than any packet, which
// only a broken gso_size makes, count as malformed without a loop.
func (e *Endpoint) handle(i int, gen uint64) {
	h := &e.rx.hdrs[i]
	n := int(h.Len)
	if h.Hdr.Flags&unix.MSG_TRUNC != 0 || n > len(e.rx.bufs[i]) {
		e.ctr.rxDatagrams.Add(1)
		e.ctr.rxTruncated.Add(1)
		return
	}
	seg, _ := groSize(e.rx.control(i))
	if h.Hdr.Flags&unix.MSG_CTRUNC != 0 && seg == 0 {
		e.ctr.rxDatagrams.Add(1)
		e.ctr.rxTruncated.Add(1)
		return
	}
	count, size := groSegments(n, seg)
	if count > 1 {
		e.ctr.rxGRO.Add(1)
		if size < minPacket {
			e.ctr.rxDatagrams.Add(uint64(count))
			e.ctr.rxMalformed.Add(uint64(count))
			return
		}
	}
	b := e.rx.bufs[i][:n]
	src := e.rx.source(i)
	for off := 0; ; off += size { // count passes (an empty datagram: one)
		end := min(off+size, n)
		e.deliver(b[off:end], src, gen)
		if end == n {
			break
		}
	}
}

// deliver checks one datagram from src and hands it to its QP.
func (e *Endpoint) deliver(b []byte, src netip.AddrPort, gen uint64) {
	e.ctr.rxDatagrams.Add(1)
	if len(b) > bufSize {
		e.ctr.rxTruncated.Add(1)
		return
	}
	// Opcodes of the manufacturer-specific range (the multipath spray
	// extension, docs/wire.md § 9) are left to the QP's handler: here
	// only the BTH, the ICRC and the QPN are checked.
	// Only a QPN with a PacketHandler knows them: to any other QPN they
	// are as malformed as before the extension.
	vendor := len(b) > 0 && roce.Opcode(b[0]) >= VendorOpcodes
	p := &e.rxPkt // not on the stack: handlers get a pointer
	var ent *qpEntry
	if vendor {
		if vendorWellFormed(b) {
			ent = (*e.table.Load())[uint32(b[5])<<16|uint32(b[6])<<8|uint32(b[7])]
		}
		if ent == nil || ent.h == nil {
			e.ctr.rxMalformed.Add(1)
			return
		}
	} else {
		var err error
		if *p, err = roce.Parse(b); err != nil {
			e.ctr.rxMalformed.Add(1)
			return
		}
	}
	// The ICRC, without roce.Verify's error value (an allocation per
	// packet from rxe), over the source's pseudo header (rxFlow). With ID
	// recovery one CRC pass does both: the ID is 0 when the packet is
	// vrdma's.
	f := e.rxFlow(src)
	if f == nil {
		e.ctr.rxICRC.Add(1)
		return
	}
	var id uint16 // the IPv4 ID the ICRC matched with
	if e.cfg.Addr.Is4() && e.cfg.RecoverIPv4ID {
		var ok bool
		id, ok = f.RecoverIPv4ID(b)
		if !ok {
			e.ctr.rxICRC.Add(1)
			return
		}
		if id != 0 {
			e.ctr.rxRecoveredID.Add(1)
		}
	} else if !f.Check(b) {
		e.ctr.rxICRC.Add(1)
		return
	}
	if !vendor {
		ent = (*e.table.Load())[p.BTH.DestQP]
	}
	if ent == nil {
		e.ctr.rxUnknownQP.Add(1)
		return
	}
	var v Verdict
	switch {
	case vendor:
		v = ent.h.ReceiveVendor(b, src, e)
	case p.BTH.Opcode.IsUD() != (ent.ud != nil):
		// A packet of another transport than the QP's: only UD
		// QPs take UD opcodes, and only UD opcodes reach them.
		v = Malformed
	case ent.ud != nil:
		v = e.receiveUD(ent.ud, p, src, id)
	case ent.h != nil:
		v = ent.h.ReceiveRC(p, src, e)
	case src.Addr() != ent.peer || !ent.src.Allows(src.Port()):
		v = WrongPeer
	default:
		learned := ent.src.learned
		ent.src.Learn(src.Port(), ent.qp.Receive(p))
		if !learned && ent.src.learned {
			ent.srcPub.Store(1<<16 | uint32(ent.src.port))
		}
	}
	switch v {
	case WrongPeer:
		e.ctr.rxWrongPeer.Add(1)
		return
	case Malformed:
		e.ctr.rxMalformed.Add(1)
		return
	}
	e.ctr.rxDelivered.Add(1)
	if ent.ud == nil && ent.mark != gen {
		ent.mark = gen
		e.touched = append(e.touched, ent)
	}
}

// rxFlow returns the ICRC's pseudo header of a datagram from src to the
// endpoint (ID 0, DF), nil when src is not of the endpoint's family. It
// keeps the last source's: the datagrams of a GRO buffer, and most of a
// receive batch, share it. The receive goroutine's.
func (e *Endpoint) rxFlow(src netip.AddrPort) *roce.Flow {
	if !e.rxFlowOK || src != e.rxFlowSrc {
		ip := roce.IPHeader{Src: src.Addr(), Dst: e.cfg.Addr, FlagsFragment: roce.IPv4DF}
		if !ip.Valid() {
			return nil
		}
		e.rxFlowSrc, e.rxFlowOK = src, true
		e.rxFlowCur = roce.NewFlow(ip, src.Port(), e.local.Port())
	}
	return &e.rxFlowCur
}

// timers runs every QP's timers each Tick, until the endpoint is closed or
// stop is closed (Freeze).
func (e *Endpoint) timers(stop <-chan struct{}) {
	defer e.wg.Done()
	faultsPanic()
	t := time.NewTicker(e.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-stop:
			return
		case <-t.C:
			for _, ent := range *e.table.Load() {
				ent.tick(e)
			}
		}
	}
}

// pumps sends, for the QPs that asked (Port.Wake), what they could not
// send within one burst, until the endpoint is closed or stop is closed
// (Freeze: the ports still queued wait in e.ready for the next run).
func (e *Endpoint) pumps(stop <-chan struct{}) {
	defer e.wg.Done()
	faultsPanic()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-stop:
			return
		case p := <-e.ready:
			p.queued.Store(false)
			p.qp.Pump() // flushes when it is done
			if p.queued.Load() {
				e.flushFrom(e.cfg.Batch)
			}
		case f := <-e.wakes:
			f()
		}
	}
}
