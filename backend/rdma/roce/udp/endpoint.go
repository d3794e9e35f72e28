package udp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/rc"
	"github.com/vrdma/vrdma/backend/rdma/roce/ud"
)

// Sentinels.
var (
	// ErrConfig: a Config Listen does not accept.
	ErrConfig = errors.New("udp: invalid config")
	// ErrQPN: the QPN is in use (NewQP) or unknown.
	ErrQPN = errors.New("udp: QPN in use")
	// ErrClosed: the endpoint was closed.
	ErrClosed = errors.New("udp: endpoint closed")
)

// Defaults.
const (
	DefaultBatch  = 64
	DefaultTick   = time.Millisecond
	DefaultMaxQPs = 4096
	DefaultBuffer = 4 << 20
	// txBatches is the send batch in receive batches: room for a QP's
	// bursts to gather while the pump goroutine sends (package doc, §
	// Goroutines).
	txBatches = 4
	// bufSize holds the largest packet with IPv6 headers' worth of slack:
	// a datagram that does not fit is truncated and dropped.
	bufSize = roce.BTHLen + roce.RETHLen + roce.ImmDtLen + roce.MaxPayload + roce.ICRCLen + 64
)

// Config configures an Endpoint.
type Config struct {
	// Addr is the host address to bind, IPv4 or IPv6 (not unspecified:
	// the ICRC covers the destination address, so the endpoint must know
	// it).
	Addr netip.Addr
	// Port is the UDP port (0: roce.UDPPort, 4791). Packets leave from
	// it too.
	Port uint16
	// RecoverIPv4ID accepts an IPv4 packet whose ICRC is wrong for ID 0
	// but right for some ID (roce.RecoverIPv4ID): what Linux rxe sends.
	// It checks 16 of the ICRC's 32 bits for such packets.
	RecoverIPv4ID bool
	// Batch is the datagrams per recvmmsg (0: 64). The send batch holds
	// as many packets, txBatches times as many on an endpoint with GSO;
	// the pump goroutine flushes it once it holds Batch (with GSO a
	// sendmmsg carries from Batch packets, in as many messages as GSO
	// needs, to the whole send batch).
	Batch int
	// Tick is the period of the QPs' timers (0: 1 ms).
	Tick time.Duration
	// MaxQPs bounds the QPs (0: 4096).
	MaxQPs int
	// SocketBuffer sets SO_RCVBUF and SO_SNDBUF (0: 4 MiB).
	SocketBuffer int
	// NoOffload keeps the socket off UDP segmentation and coalescing
	// offload (no UDP_SEGMENT, no UDP_GRO): every datagram is one entry
	// of a sendmmsg or recvmmsg, and the receive buffers hold one packet
	// each instead of 64 KiB. False: GRO where the kernel has it, GSO
	// too for IPv6 (see the package documentation).
	NoOffload bool
	// FreeBind binds Addr even when no interface has it yet
	// (IP_FREEBIND, IPV6_FREEBIND): a live migration's destination opens
	// the address that moves with its VM before it arrives. Until then
	// nothing arrives and sends fail (counted in TxErrors; RC
	// retransmits).
	FreeBind bool
	// Logger gets warnings (rate-limited); nil discards.
	Logger *logrus.Entry
}

// Counters count the endpoint's datagrams. Every received datagram ends in
// exactly one of RxDelivered, RxTruncated, RxMalformed, RxICRC,
// RxUnknownQP and RxWrongPeer; RxRecoveredID counts, besides, the IPv4
// packets whose ICRC matched only with a recovered ID. A datagram is one
// packet on the wire: the segments of a GSO super-datagram count in
// TxDatagrams one by one, those of a GRO buffer in RxDatagrams.
type Counters struct {
	RxDatagrams   uint64
	RxDelivered   uint64 // handed to a QP
	RxTruncated   uint64 // larger than a packet can be
	RxMalformed   uint64 // refused by roce.Parse
	RxICRC        uint64 // ICRC mismatch
	RxRecoveredID uint64 // IPv4 accepted with a recovered ID
	RxUnknownQP   uint64
	RxWrongPeer   uint64 // from an address that is not the QP's peer, or a port that is not its learned one
	TxDatagrams   uint64
	TxErrors      uint64 // datagrams the kernel refused (dropped)
	TxCalls       uint64 // sendmmsg calls
	RxCalls       uint64 // recvmmsg calls
	TxGSO         uint64 // GSO super-datagrams sent (UDP_SEGMENT: two or more datagrams each)
	RxGRO         uint64 // GRO buffers received (UDP_GRO: two or more datagrams each)
}

type counters struct {
	rxDatagrams, rxDelivered, rxTruncated, rxMalformed, rxICRC, rxRecoveredID atomic.Uint64
	rxUnknownQP, rxWrongPeer, txDatagrams, txErrors, txCalls, rxCalls         atomic.Uint64
	txGSO, rxGRO                                                              atomic.Uint64
}

// qpEntry is a QP and its port, or a PacketHandler (Register); immutable
// once in the table, but mark and src, which only the receive goroutine
// touches.
type qpEntry struct {
	qp   *rc.QP
	port *port         // qp's
	peer netip.Addr    // the only source address accepted (qp)
	h    PacketHandler // instead of qp and peer when not nil
	ud   ud.Host       // instead of qp and peer when not nil: a UD QP (ud.go)
	mark uint64
	src  SourcePort // the peer's source port (qp)
	// srcPub publishes src once learned, for Conn.Freeze: 1<<16 | port
	// (atomic; 0 while none is learned).
	srcPub atomic.Uint32
}

// SourcePort is the source UDP port a connection's peer sends from,
// learned from the first packet its QP accepted (rc.QP.Receive: a request
// at the expected PSN, a response that acknowledged something); until
// then every port is let through. A vrdmad sends from its bound port,
// Linux rxe from one port per QP (rdma_get_udp_sport at MODIFY_QP with an
// address vector); neither changes during a connection. Its zero value
// has learned nothing. It is not safe for concurrent use: one receive
// goroutine owns it.
type SourcePort struct {
	port    uint16
	learned bool
}

// Allows reports whether a packet from port may reach the QP: any port
// before one was learned, the learned one after.
func (s *SourcePort) Allows(port uint16) bool { return !s.learned || port == s.port }

// Learn records port if none was learned yet and the QP accepted the
// packet that came from it.
func (s *SourcePort) Learn(port uint16, accepted bool) {
	if accepted && !s.learned {
		s.port, s.learned = port, true
	}
}

// Learned returns the learned port, if any.
func (s *SourcePort) Learned() (port uint16, ok bool) { return s.port, s.learned }

// Endpoint is one bound UDP socket and the QPs reached through it.
type Endpoint struct {
	cfg   Config // immutable, defaults filled in
	log   *logrus.Entry
	conn  *net.UDPConn
	raw   syscall.RawConn
	local netip.AddrPort

	ctr counters

	tableMu sync.Mutex                          // serialises writers of table
	table   atomic.Pointer[map[uint32]*qpEntry] // copy on write

	txMu sync.Mutex // protects tx, txN, txDst, txPlan and the sendmmsg call's state below
	tx   *batch     // the queued packets, one a message
	txN  int
	// txDst and txLen are each queued packet's destination and length;
	// txPlan the messages of one flush (gso.go).
	txDst  []netip.AddrPort
	txLen  []int
	txPlan *sendPlan
	// One sendmmsg (sendFn, built once: a closure per call would be an
	// allocation per batch): from message txOff of txPlan, it sets
	// txSent and txErrno.
	txOff, txSent int
	txErrno       unix.Errno
	sendFn        func(fd uintptr) bool
	// One recvmmsg, likewise (the receive goroutine's).
	rxGot   int
	rxErrno unix.Errno
	recvFn  func(fd uintptr) bool

	// gso: send runs of packets as UDP_SEGMENT super-datagrams (IPv6
	// only); cleared for good when the kernel refuses one. gro: the
	// socket has UDP_GRO on. Both atomic (SetOffload).
	gso, gro atomic.Bool
	// groCapable: the receive buffers are 64 KiB with room for the
	// UDP_GRO control message (immutable).
	groCapable bool

	rx      *batch      // the receive goroutine's
	rxPkt   roce.Packet // the receive goroutine's: the packet it handles
	rxUD    ud.Arrival  // the receive goroutine's: the UD datagram it hands over
	touched []*qpEntry  // the receive goroutine's
	// The receive goroutine's: the pseudo header of the last source
	// (rxFlow).
	rxFlowSrc netip.AddrPort
	rxFlowCur roce.Flow
	rxFlowOK  bool

	ready  chan *port
	wakes  chan func() // Wake's; room for MaxQPs
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the running goroutines
	once   sync.Once

	// runMu serialises starting and stopping the goroutines (Freeze,
	// Thaw, Close; handover.go). Lock order: runMu, then tableMu, then
	// a QP's lock.
	runMu  sync.Mutex
	frozen bool          // protected by runMu: the goroutines are stopped (or not started)
	stop   chan struct{} // protected by runMu: closed to stop the timer and pump goroutines
}

// Listen binds cfg.Addr and starts the endpoint's goroutines: one
// receiving, one running the QPs' timers, one sending what QPs could not
// send at once. The socket is created in the caller's network namespace.
func Listen(cfg Config) (*Endpoint, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	network := "udp4"
	if cfg.Addr.Is6() {
		network = "udp6"
	}
	var lc net.ListenConfig
	if cfg.FreeBind {
		lc.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if cfg.Addr.Is4() {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_FREEBIND, 1)
				} else {
					serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_FREEBIND, 1)
				}
			})
			return errors.Join(err, serr)
		}
	}
	pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(cfg.Addr, cfg.Port).String())
	if err != nil {
		return nil, fmt.Errorf("udp: bind %v: %w", cfg.Addr, err)
	}
	conn := pc.(*net.UDPConn)
	e, err := newEndpoint(cfg, conn)
	if err != nil {
		return nil, err
	}
	e.runMu.Lock()
	e.startLocked()
	e.runMu.Unlock()
	return e, nil
}

// fill checks cfg and fills in its defaults.
func (cfg *Config) fill() error {
	if !cfg.Addr.IsValid() || cfg.Addr.IsUnspecified() {
		return fmt.Errorf("%w: address %v", ErrConfig, cfg.Addr)
	}
	cfg.Addr = cfg.Addr.Unmap()
	if cfg.Port == 0 {
		cfg.Port = roce.UDPPort
	}
	if cfg.Batch == 0 {
		cfg.Batch = DefaultBatch
	}
	if cfg.Tick == 0 {
		cfg.Tick = DefaultTick
	}
	if cfg.MaxQPs == 0 {
		cfg.MaxQPs = DefaultMaxQPs
	}
	if cfg.SocketBuffer == 0 {
		cfg.SocketBuffer = DefaultBuffer
	}
	if cfg.Batch < 1 || cfg.Batch > 1024 || cfg.Tick < 0 || cfg.MaxQPs < 1 || cfg.SocketBuffer < 0 {
		return fmt.Errorf("%w: batch %d, tick %v, max QPs %d", ErrConfig, cfg.Batch, cfg.Tick, cfg.MaxQPs)
	}
	if cfg.Logger == nil {
		l := logrus.New()
		l.SetOutput(nopWriter{})
		cfg.Logger = logrus.NewEntry(l)
	}
	return nil
}

// newEndpoint sets up the bound socket conn (cfg filled) and returns its
// endpoint, frozen: startLocked starts its goroutines. It closes conn on
// error.
func newEndpoint(cfg Config, conn *net.UDPConn) (*Endpoint, error) {
	log := cfg.Logger
	raw, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("udp: raw conn: %w", err)
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		// DF on every datagram and, for IPv4, ID 0 (docs/wire.md § 7).
		if cfg.Addr.Is4() {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
		}
		if serr != nil {
			serr = fmt.Errorf("udp: set path MTU discovery: %w", serr)
			return
		}
		// Best effort: the *FORCE options need CAP_NET_ADMIN; the
		// others are capped at net.core.rmem_max and wmem_max.
		for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], cfg.SocketBuffer) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], cfg.SocketBuffer)
			}
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	gso, gro := false, false
	if !cfg.NoOffload {
		gso, gro = probeOffload(raw, cfg.Addr.Is6(), log)
	}
	rxSize, rxCtl := bufSize, 0
	if gro {
		rxSize, rxCtl = groBufSize, rxCtlSpace
	}
	txCap := cfg.Batch
	if gso {
		// Room for a few GSO runs a sendmmsg. Without GSO a larger
		// batch only spreads the packets over more cache: a sendmmsg
		// of Batch single datagrams is as good.
		txCap *= txBatches
	}
	e := &Endpoint{
		cfg: cfg, log: log, conn: conn, raw: raw,
		local:      conn.LocalAddr().(*net.UDPAddr).AddrPort(),
		tx:         newBatch(txCap, bufSize, 0),
		txDst:      make([]netip.AddrPort, txCap),
		txLen:      make([]int, txCap),
		txPlan:     newSendPlan(txCap),
		rx:         newBatch(cfg.Batch, rxSize, rxCtl),
		groCapable: gro,
		touched:    make([]*qpEntry, 0, cfg.Batch),
		ready:      make(chan *port, cfg.MaxQPs),
		wakes:      make(chan func(), cfg.MaxQPs),
		frozen:     true,
	}
	e.gso.Store(gso)
	e.gro.Store(gro)
	e.local = netip.AddrPortFrom(e.local.Addr().Unmap(), e.local.Port())
	e.sendFn, e.recvFn = e.sendOnce, e.recvOnce
	empty := map[uint32]*qpEntry{}
	e.table.Store(&empty)
	e.ctx, e.cancel = context.WithCancel(context.Background())
	return e, nil
}

// startLocked starts the goroutines of a frozen endpoint. Precondition:
// runMu held, frozen, not closed.
func (e *Endpoint) startLocked() {
	e.frozen = false
	e.stop = make(chan struct{})
	e.wg.Add(3)
	go e.receive()
	go e.timers(e.stop)
	go e.pumps(e.stop)
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

// LocalAddr returns the bound address and port.
func (e *Endpoint) LocalAddr() netip.AddrPort { return e.local }

// Counters returns a snapshot of the endpoint's counters.
func (e *Endpoint) Counters() Counters {
	c := &e.ctr
	return Counters{
		RxDatagrams: c.rxDatagrams.Load(), RxDelivered: c.rxDelivered.Load(), RxTruncated: c.rxTruncated.Load(),
		RxMalformed: c.rxMalformed.Load(), RxICRC: c.rxICRC.Load(), RxRecoveredID: c.rxRecoveredID.Load(),
		RxUnknownQP: c.rxUnknownQP.Load(), RxWrongPeer: c.rxWrongPeer.Load(), TxDatagrams: c.txDatagrams.Load(),
		TxErrors: c.txErrors.Load(), TxCalls: c.txCalls.Load(), RxCalls: c.rxCalls.Load(),
		TxGSO: c.txGSO.Load(), RxGRO: c.rxGRO.Load(),
	}
}

// NewQP creates a connected QP (rc.New) whose packets go to peer (port 0:
// roce.UDPPort) and registers it under cfg.QPN. peer must be of the
// endpoint's address family.
func (e *Endpoint) NewQP(cfg rc.Config, peer netip.AddrPort, host rc.Host) (*rc.QP, error) {
	return e.newQP(cfg, peer, host, rc.New)
}

// Conn is an RC QP of an endpoint as the engine drives it (rc.Conn): made
// in RTR by NewConn, started by Start, and removed from the endpoint by
// Close.
type Conn struct {
	*rc.QP
	e *Endpoint
}

var _ rc.Conn = (*Conn)(nil)

// NewConn is NewQP for a QP in RTR (rc.NewRTR): it answers requests at
// once and sends once Start gave it the requester's attributes.
func (e *Endpoint) NewConn(cfg rc.Config, peer netip.AddrPort, host rc.Host) (*Conn, error) {
	qp, err := e.newQP(cfg, peer, host, rc.NewRTR)
	if err != nil {
		return nil, err
	}
	return &Conn{QP: qp, e: e}, nil
}

// Close closes the QP and forgets it (RemoveQP).
func (c *Conn) Close() { _ = c.e.RemoveQP(c.QPN()) }

func (e *Endpoint) newQP(cfg rc.Config, peer netip.AddrPort, host rc.Host,
	mk func(rc.Config, rc.Host, rc.Port) (*rc.QP, error)) (*rc.QP, error) {
	peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	if peer.Port() == 0 {
		peer = netip.AddrPortFrom(peer.Addr(), roce.UDPPort)
	}
	if !peer.Addr().IsValid() || peer.Addr().Is4() != e.cfg.Addr.Is4() {
		return nil, fmt.Errorf("%w: peer %v for an endpoint on %v", ErrConfig, peer, e.cfg.Addr)
	}
	p := e.newPort(peer)
	qp, err := mk(cfg, host, p)
	if err != nil {
		return nil, fmt.Errorf("udp: new QP %#x: %w", cfg.QPN, err)
	}
	p.qp = qp
	if err := e.insert(cfg.QPN, &qpEntry{qp: qp, port: p, peer: peer.Addr()}); err != nil {
		return nil, err
	}
	return qp, nil
}

// insert publishes ent under qpn.
func (e *Endpoint) insert(qpn uint32, ent *qpEntry) error {
	e.tableMu.Lock()
	defer e.tableMu.Unlock()
	if e.ctx.Err() != nil {
		return ErrClosed
	}
	old := *e.table.Load()
	if _, ok := old[qpn]; ok {
		return fmt.Errorf("%w: %#x", ErrQPN, qpn)
	}
	if len(old) >= e.cfg.MaxQPs {
		return fmt.Errorf("%w: %d QPs", ErrConfig, len(old))
	}
	m := make(map[uint32]*qpEntry, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[qpn] = ent
	e.table.Store(&m)
	return nil
}

// RemoveQP closes the QP (rc.QP.Close: its work requests are flushed) and
// forgets it; later packets for it count as RxUnknownQP.
func (e *Endpoint) RemoveQP(qpn uint32) error {
	e.tableMu.Lock()
	old := *e.table.Load()
	ent, ok := old[qpn]
	if !ok {
		e.tableMu.Unlock()
		return fmt.Errorf("%w: %#x unknown", ErrQPN, qpn)
	}
	m := make(map[uint32]*qpEntry, len(old))
	for k, v := range old {
		if k != qpn {
			m[k] = v
		}
	}
	e.table.Store(&m)
	e.tableMu.Unlock()
	ent.close()
	return nil
}

// Close stops the goroutines, closes the socket and every QP. It is
// idempotent.
func (e *Endpoint) Close() error {
	var err error
	e.once.Do(func() {
		e.runMu.Lock()
		defer e.runMu.Unlock()
		e.tableMu.Lock()
		e.cancel()
		e.tableMu.Unlock()
		err = e.conn.Close()
		e.wg.Wait()
		for _, ent := range *e.table.Load() {
			ent.close()
		}
	})
	return err
}
