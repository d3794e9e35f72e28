package spray

import (
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Limits and defaults.
const (
	MinWindow           = 64
	MaxWindow           = maxSACKWord * 32 // the SACK bitmap covers the whole window
	DefaultWindow       = 1024
	MaxMessages         = 4096
	DefaultMessages     = 256
	MaxMessage          = abi.MaxMsgSize
	DefaultHelloTimeout = 20 * time.Millisecond
	DefaultHelloRetries = 5
	DefaultMinRTO       = 20 * time.Millisecond
	MaxPaths            = maxPaths
	maxLocals           = MaxAddrs
	dupThresh           = 3  // later packets acknowledged on a path before an earlier one is lost
	initCwnd            = 16 // a path's congestion window at start and after it recovers
	maxProbeGap         = 100 * time.Millisecond
	minPTO              = time.Millisecond // the least tail-loss probe timeout (the endpoints tick every 1 ms)
	maxEchoAge          = 10 * time.Second // an ACK's echo older than this (or from the future) is ignored
	ackEvery            = 32               // DATA packets a receiver may leave unacknowledged at the end of a batch
)

// ErrConfig: a Config New does not accept.
var ErrConfig = errors.New("spray: invalid config")

// Config configures a spray Conn.
type Config struct {
	// RC is the QP's attributes from MODIFY_QP to RTR, as udp.NewConn
	// takes them; Start gives the requester's.
	RC rc.Config
	// Locals are the endpoints of this host's addresses, all of one
	// family (1..16). Locals[0] carries the plain RC QP and the
	// negotiation; Peer is reached from it.
	Locals []*udp.Endpoint
	// Peer is the peer's address the QP was connected to (port 0:
	// 4791), of the family of Locals.
	Peer netip.AddrPort
	// Paths is the number of paths to spray over (1..64; 0: the larger
	// of the local and the peer's address counts). Path i goes from
	// Locals[i mod L] to the peer's address i mod R.
	Paths int
	// Window is the packets this side's receiver accepts beyond its
	// cumulative point (MinWindow..MaxWindow; 0: DefaultWindow), and
	// Messages the request messages it tracks at once (1..MaxMessages;
	// 0: DefaultMessages). Memory is proportional to both.
	Window, Messages int
	// HelloTimeout (0: 20 ms) and HelloRetries (0: 5) bound the
	// negotiation: after HelloRetries+1 HELLOs without an answer the QP
	// speaks plain RC for good.
	HelloTimeout time.Duration
	HelloRetries int
	// MinRTO is the least per-path retransmission timeout, the silence
	// that takes a path down (0: 20 ms).
	MinRTO time.Duration
	// Plain disables the extension: the Conn is the plain RC QP (a spray
	// peer's HELLO is still answered, so that its requests are sprayed).
	Plain bool
}

func (c *Config) fill() error {
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	c.Window &^= 63 // the receiver's bitmap is whole words
	if c.Messages == 0 {
		c.Messages = DefaultMessages
	}
	if c.HelloTimeout == 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.HelloRetries == 0 {
		c.HelloRetries = DefaultHelloRetries
	}
	if c.MinRTO == 0 {
		c.MinRTO = DefaultMinRTO
	}
	switch {
	case len(c.Locals) < 1 || len(c.Locals) > maxLocals:
		return fmt.Errorf("%w: %d local endpoints", ErrConfig, len(c.Locals))
	case c.Paths < 0 || c.Paths > MaxPaths:
		return fmt.Errorf("%w: %d paths", ErrConfig, c.Paths)
	case c.Window < MinWindow || c.Window > MaxWindow || c.Messages < 1 || c.Messages > MaxMessages:
		return fmt.Errorf("%w: window %d, messages %d", ErrConfig, c.Window, c.Messages)
	case c.HelloTimeout < 0 || c.HelloRetries < 0 || c.HelloRetries > 100 || c.MinRTO < 0:
		return fmt.Errorf("%w: hello %v × %d, min RTO %v", ErrConfig, c.HelloTimeout, c.HelloRetries, c.MinRTO)
	}
	v4 := c.Locals[0].LocalAddr().Addr().Is4()
	for i, e := range c.Locals {
		if e == nil || e.LocalAddr().Addr().Is4() != v4 {
			return fmt.Errorf("%w: local endpoint %d", ErrConfig, i)
		}
	}
	return nil
}

// Mode is what a Conn's requester speaks.
type Mode int32

// Modes.
const (
	// Negotiating: HELLO sent, no answer yet; Post queues.
	Negotiating Mode = iota
	// Sprayed: the peer answered; requests are sprayed.
	Sprayed
	// Plain: plain RC (no answer, Config.Plain, or not started).
	Plain
)

func (m Mode) String() string {
	switch m {
	case Negotiating:
		return "negotiating"
	case Sprayed:
		return "spray"
	case Plain:
		return "plain"
	}
	return fmt.Sprintf("Mode(%d)", int32(m))
}

// Conn is one RC QP's transport: the spray extension when the peer
// speaks it, plain RC (rc.QP) otherwise. It implements rc.Conn (for the
// engine) and udp.PacketHandler (for the endpoints).
type Conn struct {
	cfg    Config           // immutable
	host   *lockedHost      // immutable
	qp     *rc.QP           // immutable: plain RC, the fallback and the responder of plain requests
	qpPort *rcPort          // immutable
	epoch  time.Time        // immutable: timestamps count µs from it
	clock  func() time.Time // immutable
	locals []netip.Addr     // immutable: addresses of cfg.Locals
	start  roce.PSN         // immutable: first PSN of this side's DATA

	ctr  counters
	mode atomic.Int32 // Mode; written under mu

	mu       sync.Mutex
	started  bool      // protected by mu
	closed   bool      // protected by mu
	failed   bool      // protected by mu: the spray side is in the error state
	rcCfg    rc.Config // protected by mu: the requester's attributes (Start)
	hellos   int       // protected by mu: HELLOs sent
	helloAt  time.Time // protected by mu: when the next HELLO is due
	peer     *peerInfo // protected by mu: set by the peer's HELLO or HELLO_ACK
	tx       sender    // protected by mu
	rx       receiver  // protected by mu
	pkt      []byte    // protected by mu: the packet being built
	data     []byte    // protected by mu: a payload being gathered
	dirty    uint32    // protected by mu: bit i: Locals[i] has queued packets
	queued   atomic.Bool
	pumpFn   func() // immutable
	rcFlush  atomic.Bool
	unlinked bool // protected by mu
	// rcSrc is the source port of the plain RC peer, learned at the
	// first packet the plain QP accepted (Linux rxe sends from a port of
	// its own per QP); Locals[0]'s receive goroutine owns it.
	rcSrc udp.SourcePort
}

var (
	_ rc.Conn           = (*Conn)(nil)
	_ udp.PacketHandler = (*Conn)(nil)
)

// peerInfo is what the peer announced, and the routes to it.
type peerInfo struct {
	hello  Hello
	routes [][]*udp.Route // [local][peer address]
}

// New makes a Conn in RTR: it answers plain RC requests and spray packets
// at once, and registers itself with every endpoint of cfg.Locals under
// cfg.RC.QPN. Start (RTR→RTS) negotiates and lets Post send.
func New(cfg Config, host rc.Host) (*Conn, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if host == nil {
		return nil, fmt.Errorf("%w: nil host", ErrConfig)
	}
	peer := cfg.Peer
	if peer.Port() == 0 {
		peer = netip.AddrPortFrom(peer.Addr(), roce.UDPPort)
	}
	cfg.Peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	route, err := cfg.Locals[0].Route(cfg.Peer)
	if err != nil {
		return nil, fmt.Errorf("spray: %w", err)
	}
	c := &Conn{cfg: cfg, host: &lockedHost{h: host}, clock: cfg.RC.Clock}
	if c.clock == nil {
		c.clock = time.Now
	}
	c.epoch = c.clock()
	// The PSN space starts where nobody can predict (docs/wire.md § 11).
	var seed [4]byte
	_, _ = crand.Read(seed[:]) // never fails on Linux (getrandom)
	c.start = roce.PSN(binary.LittleEndian.Uint32(seed[:]) & uint32(roce.PSNMask))
	for _, e := range cfg.Locals {
		c.locals = append(c.locals, e.LocalAddr().Addr())
	}
	c.qpPort = &rcPort{route: route, ep: cfg.Locals[0]}
	qp, err := rc.NewRTR(cfg.RC, c.host, c.qpPort)
	if err != nil {
		return nil, fmt.Errorf("spray: new QP %#x: %w", cfg.RC.QPN, err)
	}
	c.qp = qp
	c.qpPort.qp = qp
	c.qpPort.pumpFn = func() { c.qpPort.queued.Store(false); qp.Pump() }
	c.pumpFn = func() { c.queued.Store(false); c.Pump() }
	c.pkt = make([]byte, 0, roce.BTHLen+dataHdrLen+roce.MaxPayload+roce.ICRCLen+8)
	c.data = make([]byte, roce.MaxPayload)
	c.mode.Store(int32(Negotiating))
	if cfg.Plain {
		c.mode.Store(int32(Plain))
	}
	c.rx.init(c)
	for i, e := range cfg.Locals {
		if err := e.Register(cfg.RC.QPN, c); err != nil {
			for _, d := range cfg.Locals[:i] {
				d.Unregister(cfg.RC.QPN, c)
			}
			qp.Close()
			return nil, fmt.Errorf("spray: register QP %#x: %w", cfg.RC.QPN, err)
		}
	}
	return c, nil
}

// Mode reports what the requester speaks.
func (c *Conn) Mode() Mode { return Mode(c.mode.Load()) }

// QP returns the plain RC QP (its counters count the plain RC traffic).
func (c *Conn) QP() *rc.QP { return c.qp }

// QPN returns the local QP number.
func (c *Conn) QPN() uint32 { return c.cfg.RC.QPN }

// Start moves the Conn to RTS: the requester takes cfg's attributes (as
// rc.QP.Start), and the negotiation begins (unless Config.Plain).
func (c *Conn) Start(cfg rc.Config) error {
	if err := c.qp.Start(cfg); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	rcc := c.cfg.RC
	rcc.SQPSN, rcc.Timeout, rcc.RetryCnt, rcc.RNRRetry, rcc.MaxRdAtomic = cfg.SQPSN, cfg.Timeout, cfg.RetryCnt, cfg.RNRRetry, cfg.MaxRdAtomic
	fillRC(&rcc)
	c.rcCfg = rcc
	c.started = true
	c.tx.init(c)
	if c.Mode() == Negotiating {
		c.sendHello(OpHello)
		c.hellos = 1
		c.helloAt = c.clock().Add(c.cfg.HelloTimeout)
		c.flushLocked()
	}
	return nil
}

// fillRC sets the defaults rc.Config documents (rc validated the values).
func fillRC(r *rc.Config) {
	if r.SQSize == 0 {
		r.SQSize = rc.DefaultSQSize
	}
	if r.Timeout == 0 {
		r.Timeout = rc.DefaultTimeout
	}
	if r.MaxRdAtomic == 0 {
		r.MaxRdAtomic = rc.DefaultMaxRdAtomic
	}
	if r.MaxDestRdAtomic == 0 {
		r.MaxDestRdAtomic = rc.DefaultMaxDestRdAtomic
	}
	if r.Burst == 0 {
		r.Burst = rc.DefaultBurst
	}
}

// Post queues a send work request: on the plain RC QP, or in the spray
// send queue (while negotiating, it waits there).
func (c *Conn) Post(wr rc.SendWR) error {
	switch {
	case !wr.Opcode.Valid():
		return &rc.WRError{ID: wr.ID, Reason: "opcode " + wr.Opcode.String()}
	case wr.Length > MaxMessage:
		return &rc.WRError{ID: wr.ID, Reason: fmt.Sprintf("length %d beyond %d", wr.Length, MaxMessage)}
	case (wr.Opcode == rc.WRAtomicCmpSwp || wr.Opcode == rc.WRAtomicFetchAdd) && (wr.Length != 8 || wr.RemoteAddr%8 != 0):
		return &rc.WRError{ID: wr.ID, Reason: fmt.Sprintf("atomic of %d bytes at %#x, want 8 aligned", wr.Length, wr.RemoteAddr)}
	case wr.Length > 0 && wr.Local == nil:
		return &rc.WRError{ID: wr.ID, Reason: "no local buffer"}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.started || c.failed {
		return rc.ErrState
	}
	if c.Mode() == Plain {
		return c.qp.Post(wr)
	}
	if wr.Opcode == rc.WRSendWithInv {
		// SPRAY_DATA has no op for it (docs/wire.md § 9.3).
		return &rc.WRError{ID: wr.ID, Reason: "SEND_WITH_INV is not carried by the spray extension"}
	}
	if !c.tx.push(wr) {
		return rc.ErrQueueFull
	}
	if c.Mode() == Sprayed {
		c.pumpLocked()
	}
	return nil
}

// Close flushes the outstanding work requests (WCWRFlushErr), forgets the
// QPN on every endpoint and closes the plain RC QP. It is idempotent.
func (c *Conn) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.failLocked(abi.WCWRFlushErr)
	c.mu.Unlock()
	for _, e := range c.cfg.Locals {
		e.Unregister(c.cfg.RC.QPN, c)
	}
	c.qp.Close()
}

// failLocked puts the spray side in the error state: the head work
// request completes with status (unless WCWRFlushErr), the rest with
// WCWRFlushErr; receives taken and not completed are flushed.
func (c *Conn) failLocked(status abi.WCStatus) {
	if c.failed {
		return
	}
	c.failed = true
	c.tx.flush(c, status)
	c.rx.flush(c)
}

// fail puts the whole QP in the error state, as rc does on a fatal
// error: the plain RC QP too.
func (c *Conn) fail(status abi.WCStatus) {
	c.failLocked(status)
	c.closeQPAsync()
}

// closeQPAsync closes the plain QP without holding c.mu across its lock
// order (c.mu → qp.mu is allowed, and Close takes only qp.mu).
func (c *Conn) closeQPAsync() { c.qp.Close() }

// now returns the clock; ts the µs timestamp of t.
func (c *Conn) now() time.Time        { return c.clock() }
func (c *Conn) ts(t time.Time) uint32 { return uint32(t.Sub(c.epoch) / time.Microsecond) }

// ReceiveRC implements udp.PacketHandler: a plain RC packet goes to the
// plain QP, from the address the QP was connected to only, and once the
// plain QP accepted a packet, from the source port that packet came from
// only (udp.SourcePort, what an Endpoint checks of its own QPs).
func (c *Conn) ReceiveRC(p *roce.Packet, src netip.AddrPort, via *udp.Endpoint) udp.Verdict {
	if via != c.cfg.Locals[0] || src.Addr() != c.cfg.Peer.Addr() || !c.rcSrc.Allows(src.Port()) {
		return udp.WrongPeer
	}
	c.rcSrc.Learn(src.Port(), c.qp.Receive(p))
	c.rcFlush.Store(true)
	return udp.Delivered
}

// Flush implements udp.PacketHandler: the coalesced ACKs leave.
func (c *Conn) Flush() {
	if c.rcFlush.Swap(false) {
		c.qp.Flush()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.rx.sendAck(c)
		c.pumpLocked()
	}
	c.flushLocked()
}

// Tick implements udp.PacketHandler: the timers run on Locals[0]'s tick.
func (c *Conn) Tick(via *udp.Endpoint) {
	if via != c.cfg.Locals[0] {
		return
	}
	c.qp.Tick()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	now := c.now()
	if c.started && c.Mode() == Negotiating && !now.Before(c.helloAt) {
		if c.hellos > c.cfg.HelloRetries {
			c.fallBack()
		} else {
			c.sendHello(OpHello)
			c.hellos++
			c.helloAt = now.Add(c.cfg.HelloTimeout << min(c.hellos-1, 4))
		}
	}
	if c.rx.owed > 0 { // DATA no ACK covered yet (receiver.data): a tick late at most
		c.rx.need = true
		c.rx.sendAck(c)
	}
	if c.Mode() == Sprayed && !c.failed {
		c.tx.tick(c, now)
	}
	if c.peer != nil && !c.failed {
		c.tx.tickResponses(c, now)
	}
	c.pumpLocked()
	c.flushLocked()
}

// Pump sends what a burst left (after Wake).
func (c *Conn) Pump() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.pumpLocked()
	}
	c.flushLocked()
}

// send hands a built packet to route and notes the endpoint to flush.
func (c *Conn) send(route *udp.Route, b []byte) {
	route.Send(b)
	c.dirty |= 1 << c.localIndex(route.Endpoint())
}

// flushLocked flushes the endpoints this Conn queued packets on.
func (c *Conn) flushLocked() {
	for i := 0; c.dirty != 0; i++ {
		if c.dirty&(1<<i) != 0 {
			c.cfg.Locals[i].Flush()
			c.dirty &^= 1 << i
		}
	}
}

// pumpLocked sends up to Burst packets and asks for a Wake if more
// remain.
func (c *Conn) pumpLocked() {
	if c.failed || c.closed || c.peer == nil || c.tx.pk == nil {
		return
	}
	if c.tx.pump(c, c.burst()) {
		if c.queued.CompareAndSwap(false, true) && !c.cfg.Locals[0].Wake(c.pumpFn) {
			c.queued.Store(false) // the next Tick pumps
		}
	}
}

func (c *Conn) burst() int {
	if c.rcCfg.Burst > 0 {
		return c.rcCfg.Burst
	}
	return rc.DefaultBurst
}

// lockedHost serialises the Host calls of the spray side (under Conn.mu)
// and of the plain QP (under its own lock): the engine's Host expects one
// QP lock around them.
type lockedHost struct {
	mu sync.Mutex
	h  rc.Host
}

func (l *lockedHost) Resolve(rkey uint32, va uint64, length uint32, access rc.Access) (rc.Region, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h.Resolve(rkey, va, length, access)
}

func (l *lockedHost) TakeRecv() (rc.Recv, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h.TakeRecv()
}

func (l *lockedHost) RecvDone(r rc.RecvCompletion) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.h.RecvDone(r)
}

func (l *lockedHost) Invalidate(rkey uint32, commit bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.h.Invalidate(rkey, commit)
}

func (l *lockedHost) SendDone(s rc.Completion) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.h.SendDone(s)
}

// rcPort is the plain QP's rc.Port over Locals[0].
type rcPort struct {
	route  *udp.Route
	ep     *udp.Endpoint
	qp     *rc.QP
	queued atomic.Bool
	pumpFn func()
}

func (p *rcPort) Send(pkt []byte) { p.route.Send(pkt) }
func (p *rcPort) Flush()          { p.route.Flush() }
func (p *rcPort) Wake() {
	if p.queued.CompareAndSwap(false, true) && !p.ep.Wake(p.pumpFn) {
		p.queued.Store(false) // the next Tick pumps
	}
}
