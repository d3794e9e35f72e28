package perftest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"slices"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Ops are the operations a test measures.
var Ops = []string{"write", "read", "send", "atomic"}

// Defaults.
const (
	DefaultTxDepth  = 64
	DefaultLatIters = 1000
	DefaultTimeout  = 2 * time.Minute
	DefaultBudget   = 64 << 20 // data bytes per side
	ctrlSize        = 128      // one control message
	ctrlWRID        = 1 << 63  // WRID bit of control messages
	magic           = 0x56524d41
)

// Config describes a test; both sides must use the same one.
type Config struct {
	Op       string
	Size     uint64 // message bytes (atomic: 8)
	Iters    int    // bandwidth operations
	LatIters int    // latency operations (0: DefaultLatIters)
	TxDepth  int    // operations in flight (0: DefaultTxDepth)
	Budget   uint64 // data bytes per side (0: DefaultBudget)
	Verify   bool
	// Timeout bounds any wait without progress (0: DefaultTimeout).
	Timeout time.Duration
	// GIDIndex is the local GID the QP sends from (perftest's -x): a
	// network GID (index ≥ 1 on a daemon with --roce-bind) to reach a
	// peer on another host; it is the GID the Endpoint publishes.
	GIDIndex uint32
	// Paths asks the device to spray the QP over that many paths (0: the
	// device's default; docs/spec.md MODIFY_QP PATHS).
	Paths uint32
	// AckTimeout is the QP's local ACK timeout code (4.096 µs ×
	// 2^AckTimeout, 1 … 31; 0: verbs.DefaultTimeout): with 7 retries it
	// bounds the blackout the stream survives (a peer's live migration
	// to another host).
	AckTimeout uint8
	// Duration, when positive, makes the bandwidth pass a stream that
	// goes on until Duration has passed (and at least Iters operations
	// were done): long enough to span an event such as a live migration.
	// Both sides need it (the server of a send stream posts receives
	// until the client's done arrives, a SEND with immediate data, in a
	// data buffer: Size must hold a control message). Zero: Iters
	// operations.
	Duration time.Duration
}

// MaxDuration bounds Config.Duration.
const MaxDuration = 24 * time.Hour

func (c *Config) fill() error {
	if !slices.Contains(Ops, c.Op) {
		return fmt.Errorf("op %q: want write, read, send or atomic", c.Op)
	}
	if c.Op == "atomic" {
		c.Size = 8
	}
	if c.Size == 0 || c.Size > 1<<31 {
		return fmt.Errorf("size %d: want 1 … 2 GiB", c.Size)
	}
	if c.Iters <= 0 {
		return fmt.Errorf("iters %d: want at least 1", c.Iters)
	}
	if c.LatIters == 0 {
		c.LatIters = DefaultLatIters
	}
	if c.TxDepth == 0 {
		c.TxDepth = DefaultTxDepth
	}
	if c.Budget == 0 {
		c.Budget = DefaultBudget
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.LatIters < 0 || c.TxDepth < 1 || c.TxDepth > 4096 {
		return fmt.Errorf("lat-iters %d, tx-depth %d: out of range", c.LatIters, c.TxDepth)
	}
	if c.AckTimeout > 31 {
		return fmt.Errorf("ack timeout %d: want 0 … 31", c.AckTimeout)
	}
	if c.Duration < 0 || c.Duration > MaxDuration {
		return fmt.Errorf("duration %v: want 0 … %v", c.Duration, MaxDuration)
	}
	if c.sendStream() && c.Size < ctrlSize {
		return fmt.Errorf("size %d: a send stream (duration) needs at least %d bytes, the client's done message", c.Size, ctrlSize)
	}
	return nil
}

// sendStream reports whether the server cannot know the number of
// messages in advance: a send with a duration. It posts receives until
// the client's done message arrives in one, marked by immediate data.
func (c *Config) sendStream() bool { return c.Duration > 0 && c.Op == "send" }

// connectOpts are the QP's connection choices.
func (c *Config) connectOpts() verbs.ConnectOpts {
	return verbs.ConnectOpts{SGIDIndex: c.GIDIndex, Paths: c.Paths, Timeout: c.AckTimeout}
}

// slots is the number of message buffers per side.
func (c *Config) slots() int {
	return int(max(1, min(uint64(c.TxDepth), c.Budget/c.Size)))
}

// Endpoint is what a side publishes for its peer.
type Endpoint struct {
	GID string `json:"gid"`
	QPN uint32 `json:"qpn"`
	// PSN is the QP's initial send PSN (verbs.QP.PSN: 24 random bits);
	// the peer's responder expects it. A missing "psn" decodes as 0, what
	// an endpoint published before PSNs were random meant.
	PSN  uint32 `json:"psn"`
	RKey uint32 `json:"rkey"`
	Addr uint64 `json:"addr"`
	Size uint64 `json:"size"`
}

func (e Endpoint) gid() ([16]byte, error) {
	ip := net.ParseIP(e.GID).To16()
	if ip == nil {
		return [16]byte{}, fmt.Errorf("peer gid %q is not a GID", e.GID)
	}
	return [16]byte(ip), nil
}

// Result is one measurement; the JSON keys are a contract (vrdma-perf,
// vrdma-guest).
type Result struct {
	Op         string  `json:"op"`
	Size       uint64  `json:"size"`
	Iters      int     `json:"iters"`
	GBytesPerS float64 `json:"gbytes_per_s"`
	Mops       float64 `json:"mops"`
	LatP50     float64 `json:"lat_us_p50"`
	LatP99     float64 `json:"lat_us_p99"`
	Verified   bool    `json:"verified"`
	LatAvg     float64 `json:"lat_us_avg"`
	LatIters   int     `json:"lat_iters"`
	Seconds    float64 `json:"seconds"`
	TxDepth    int     `json:"tx_depth"`
	Slots      int     `json:"buffers"`
	Role       string  `json:"role,omitempty"`
	// MaxGapMS is the longest time between two consecutive completions
	// of the data stream, in milliseconds: the client's over all its
	// operations; the server's over its receives (send only, else 0). A
	// pause of the stream (a live migration's switch-over) shows here.
	MaxGapMS float64 `json:"max_gap_ms,omitempty"`
	// Bytes is the data the operations moved (both passes).
	Bytes uint64 `json:"bytes,omitempty"`
}

// Side is one device's resources for a test.
type Side struct {
	cfg   Config
	slots int
	depth int
	ctx   *verbs.Context
	gid   [16]byte
	pd    *verbs.PD
	cq    *verbs.CQ
	qp    *verbs.QP
	buf   *verbs.Buffer
	mr    *verbs.MR
	ctrl  uint64 // offset of the control area in mr: tx at ctrl, rx at ctrl+ctrlSize…
	wc    []verbs.WC
}

// NewSide creates a PD, CQ, QP and a registered buffer on c for cfg. A
// server side of a read test fills its buffers with the pattern the client
// checks.
func NewSide(c *verbs.Context, cfg Config, server bool) (*Side, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &Side{cfg: cfg, ctx: c, slots: cfg.slots(), wc: make([]verbs.WC, 64)}
	s.depth = min(cfg.TxDepth, s.slots)
	data := uint64(s.slots) * cfg.Size
	s.ctrl = (data + abi.PageSize - 1) &^ (abi.PageSize - 1)
	total := s.ctrl + 4*ctrlSize
	if total > 1<<40 {
		return nil, fmt.Errorf("buffers of %d bytes are too large", total)
	}
	fail := func(what string, err error) (*Side, error) {
		s.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var err error
	if s.gid, err = c.QueryGIDAt(cfg.GIDIndex); err != nil {
		return fail("query gid", err)
	}
	if s.pd, err = c.AllocPD(); err != nil {
		return fail("alloc pd", err)
	}
	if s.cq, err = c.CreateCQ(2*s.depth + 8); err != nil {
		return fail("create cq", err)
	}
	if s.qp, err = s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: s.depth + 2, MaxRecvWR: s.depth + 2, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fail("create qp", err)
	}
	if s.buf, err = c.AllocBuffer(int(total)); err != nil {
		return fail("alloc buffer", err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, 0, int(total), abi.AccessAll); err != nil {
		return fail("reg mr", err)
	}
	if server && cfg.Op == "read" {
		for k := range s.slots {
			Pattern(s.slot(uint64(k)), uint64(k))
		}
	}
	return s, nil
}

// Endpoint returns what the peer needs.
func (s *Side) Endpoint() Endpoint {
	return Endpoint{GID: net.IP(s.gid[:]).String(), QPN: s.qp.Num(), PSN: s.qp.PSN(), RKey: s.mr.RKey, Addr: s.mr.Addr,
		Size: uint64(s.slots) * s.cfg.Size}
}

// Close destroys the side's resources.
func (s *Side) Close() {
	if s.mr != nil {
		s.mr.Dereg()
	}
	if s.qp != nil {
		s.qp.Destroy()
	}
	if s.cq != nil {
		s.cq.Destroy()
	}
	if s.buf != nil {
		s.buf.Free()
	}
	if s.pd != nil {
		s.pd.Dealloc()
	}
}

// slot returns the buffer of operation i.
func (s *Side) slot(i uint64) []byte {
	k := int(i % uint64(s.slots))
	return s.mr.Bytes()[k*int(s.cfg.Size) : (k+1)*int(s.cfg.Size)]
}

func (s *Side) slotAddr(i uint64) uint64 {
	return s.mr.Addr + (i%uint64(s.slots))*s.cfg.Size
}

// ctrlBuf returns control buffer j (0: tx, 1: rx, 2: rx).
func (s *Side) ctrlBuf(j int) []byte {
	o := s.ctrl + uint64(j)*ctrlSize
	return s.mr.Bytes()[o : o+ctrlSize]
}

// ramp holds the bytes 0 … 255 twice, so that any 256 consecutive bytes
// of a pattern are one window of it.
var ramp = func() (r [512]byte) {
	for i := range r {
		r[i] = byte(i)
	}
	return r
}()

// Pattern fills b with operation i's bytes, the data --verify checks
// (vrdma-perf and vrdma-guest fill and check the same pattern): byte j is
// byte(i*131+7) + byte(j) + byte(j>>8)*3, so that a byte's position, its
// 256-byte block and the operation all show. Each 256-byte block is one
// window of ramp: the fill is a copy, as fast as the memory.
func Pattern(b []byte, i uint64) {
	x := byte(i*131 + 7)
	for j := 0; j < len(b); j += 256 {
		start := int(x + byte(j>>8)*3)
		copy(b[j:], ramp[start:start+256])
	}
}

// PatternOK checks that b holds operation i's pattern (so a stale buffer
// that happens to equal its peer is caught too).
func PatternOK(b []byte, i uint64) bool {
	x := byte(i*131 + 7)
	for j := 0; j < len(b); j += 256 {
		start := int(x + byte(j>>8)*3)
		n := min(256, len(b)-j)
		if !bytes.Equal(b[j:j+n], ramp[start:start+n]) {
			return false
		}
	}
	return true
}

// Control messages.
const (
	kindHello   = 1
	kindDone    = 2
	kindVerdict = 3
)

type message struct {
	kind, op, ok   uint32
	count, size    uint64
	lat            uint64
	gbps, mops     float64
	p50, p99, avg  float64
	secs           float64
	iters, latIter uint64
	reason         string
}

func opIndex(op string) uint32 { return uint32(slices.Index(Ops, op)) }

func (m *message) encode(b []byte) {
	clear(b)
	le := binary.LittleEndian
	le.PutUint32(b[0:], magic)
	le.PutUint32(b[4:], m.kind)
	le.PutUint32(b[8:], m.op)
	le.PutUint32(b[12:], m.ok)
	le.PutUint64(b[16:], m.count)
	le.PutUint64(b[24:], m.size)
	for i, f := range []float64{m.gbps, m.mops, m.p50, m.p99, m.avg, m.secs} {
		le.PutUint64(b[32+8*i:], math.Float64bits(f))
	}
	le.PutUint64(b[80:], m.iters)
	le.PutUint64(b[88:], m.latIter)
	copy(b[96:ctrlSize], m.reason)
}

func decode(b []byte) (message, error) {
	var raw [ctrlSize]byte
	if copy(raw[:], b) != ctrlSize || binary.LittleEndian.Uint32(raw[0:]) != magic {
		return message{}, errors.New("control message without magic")
	}
	le := binary.LittleEndian
	m := message{kind: le.Uint32(raw[4:]), op: le.Uint32(raw[8:]), ok: le.Uint32(raw[12:]),
		count: le.Uint64(raw[16:]), size: le.Uint64(raw[24:]), iters: le.Uint64(raw[80:]), latIter: le.Uint64(raw[88:])}
	fs := []*float64{&m.gbps, &m.mops, &m.p50, &m.p99, &m.avg, &m.secs}
	for i, f := range fs {
		*f = math.Float64frombits(le.Uint64(raw[32+8*i:]))
	}
	r := raw[96:ctrlSize]
	if i := slices.Index(r, 0); i >= 0 {
		r = r[:i]
	}
	m.reason = string(r)
	return m, nil
}

// postCtrlRecv posts control receive buffer j.
func (s *Side) postCtrlRecv(j int) error {
	return s.qp.PostRecv(verbs.RecvWR{WRID: ctrlWRID | uint64(j),
		SGL: []abi.SGE{s.mr.SGE(int(s.ctrl)+j*ctrlSize, ctrlSize)}})
}

// sendCtrl sends m from the control tx buffer (signaled).
func (s *Side) sendCtrl(m *message) error {
	m.encode(s.ctrlBuf(0))
	return s.postSend(verbs.SendWR{WRID: ctrlWRID, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{s.mr.SGE(int(s.ctrl), ctrlSize)}})
}

// sendDoneImm sends m like sendCtrl, as a SEND with immediate data magic:
// the done message of a send stream, which lands in one of the server's
// data buffers (Config.sendStream).
func (s *Side) sendDoneImm(m *message) error {
	m.encode(s.ctrlBuf(0))
	return s.postSend(verbs.SendWR{WRID: ctrlWRID, Opcode: abi.WROpSendWithImm, Flags: abi.WRFlagSignaled, Imm: magic,
		SGL: []abi.SGE{s.mr.SGE(int(s.ctrl), ctrlSize)}})
}

// gapMeter keeps the longest time between consecutive completions.
type gapMeter struct {
	last time.Time
	max  time.Duration
}

// start sets the time the first gap counts from.
func (g *gapMeter) start(t time.Time) { g.last = t }

// mark notes completions seen at t.
func (g *gapMeter) mark(t time.Time) {
	if !g.last.IsZero() {
		g.max = max(g.max, t.Sub(g.last))
	}
	g.last = t
}

// ms is the longest gap in milliseconds.
func (g *gapMeter) ms() float64 { return float64(g.max) / float64(time.Millisecond) }

// postSend posts wr, waiting (bounded) while the send queue is full.
func (s *Side) postSend(wr verbs.SendWR) error {
	var deadline time.Time
	for {
		err := s.qp.PostSend(wr)
		if !errors.Is(err, verbs.ErrQueueFull) {
			return err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(s.cfg.Timeout)
		} else if time.Now().After(deadline) {
			return fmt.Errorf("send queue full for %v", s.cfg.Timeout)
		}
		runtime.Gosched()
	}
}

// poll waits for at least one completion (bounded by the timeout).
func (s *Side) poll() ([]verbs.WC, error) { return s.pollFor(s.cfg.Timeout) }

// pollFor waits for at least one completion, at most d.
func (s *Side) pollFor(d time.Duration) ([]verbs.WC, error) {
	deadline := time.Now().Add(d)
	for spins := 0; ; spins++ {
		n, err := s.cq.Poll(s.wc)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			return s.wc[:n], nil
		}
		if spins&1023 == 1023 {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("no completion for %v", d)
			}
			if spins > 1<<16 {
				time.Sleep(50 * time.Microsecond)
			}
		}
		runtime.Gosched()
	}
}

// wcErr is a failed completion, its status named as libibverbs names it
// (IBV_WC_RETRY_EXC_ERR).
func wcErr(wc *verbs.WC) error {
	return fmt.Errorf("work request %#x completed with error IBV_WC_%s (status %d, vendor error %#x)", wc.WRID, wc.Status, uint8(wc.Status), wc.VendorErr)
}

// NewSideConfig checks cfg and returns it with defaults filled in.
func NewSideConfig(cfg Config) (Config, error) {
	err := cfg.fill()
	return cfg, err
}
