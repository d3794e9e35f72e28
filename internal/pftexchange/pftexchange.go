package pftexchange

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

const (
	// Port is perftest's default TCP port.
	Port = 18515
	// KeyLen is the size of a key message.
	KeyLen = 108
	// Version is what Run announces by default: the rxe image's perftest.
	Version = "6.06"
	// DefaultTimeout bounds a whole connection's exchange when the
	// context has no deadline (the test runs inside it).
	DefaultTimeout = 5 * time.Minute
)

// Op is a perftest program, named as guest/perftest-jobs names its jobs.
type Op string

// The programs this package plays.
const (
	WriteBW  Op = "write_bw"
	ReadBW   Op = "read_bw"
	SendBW   Op = "send_bw"
	AtomicBW Op = "atomic_bw"
	WriteLat Op = "write_lat"
	// WriteImmBW is RDMA WRITE with immediate, which the rxe image's
	// perftest 6.06 has no program for (ib_write_bw --write_with_imm came
	// later): both sides are Go programs (internal/hostniclab's two vrdma
	// devices), and the exchange is send_bw's, since each WRITE with
	// immediate consumes a receive the server posts first.
	WriteImmBW Op = "write_imm_bw"
)

// Ops are the programs in the order the interop tests run them.
var Ops = []Op{WriteBW, ReadBW, AtomicBW, SendBW, WriteLat}

// Valid reports whether the package plays op: one of Ops, or WriteImmBW.
func (op Op) Valid() bool {
	for _, o := range Ops {
		if o == op {
			return true
		}
	}
	return op == WriteImmBW
}

// postsReceives reports whether op's server posts receives before the
// test (send_bw's extra key message).
func (op Op) postsReceives() bool { return op == SendBW || op == WriteImmBW }

// keyMessages is how many key messages come before the test.
func (op Op) keyMessages() int {
	if op == WriteLat {
		return 4
	}
	return 3
}

var (
	// ErrVersion is a version string that is not a number.
	ErrVersion = errors.New("bad perftest version")
	// ErrKeys is a key message that does not parse.
	ErrKeys = errors.New("bad perftest key message")
	// ErrOp is a program this package does not play.
	ErrOp = errors.New("unsupported perftest program")
)

// Keys is one side's key message (perftest's struct pingpong_dest).
type Keys struct {
	LID, OutReads, QPN, PSN, RKey uint32
	VAddr                         uint64
	GID                           [16]byte
	SRQN                          uint32
}

// Marshal returns the 108-byte key message.
func (k Keys) Marshal() []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "%04x:%04x:%06x:%06x:%08x:%016x:", k.LID, k.OutReads, k.QPN, k.PSN, k.RKey, k.VAddr)
	for _, g := range k.GID {
		fmt.Fprintf(&b, "%02x:", g)
	}
	fmt.Fprintf(&b, "%08x:", k.SRQN)
	out := make([]byte, KeyLen)
	copy(out, b.String())
	return out
}

// ParseKeys parses a key message; on error the Keys are zero.
func ParseKeys(m []byte) (Keys, error) {
	s := string(trimNUL(m))
	f := strings.Split(strings.TrimSuffix(s, ":"), ":")
	if len(f) != 6+16+1 {
		return Keys{}, fmt.Errorf("%w %q: %d fields, want 23", ErrKeys, s, len(f))
	}
	var v [23]uint64
	widths := [6]int{16, 16, 24, 24, 32, 64}
	for i, x := range f {
		bits := 8
		switch {
		case i < 6:
			bits = widths[i]
		case i == 22:
			bits = 32
		}
		n, err := strconv.ParseUint(x, 16, bits)
		if err != nil {
			return Keys{}, fmt.Errorf("%w %q: field %d: %v", ErrKeys, s, i, err)
		}
		v[i] = n
	}
	k := Keys{LID: uint32(v[0]), OutReads: uint32(v[1]), QPN: uint32(v[2]), PSN: uint32(v[3]), RKey: uint32(v[4]),
		VAddr: v[5], SRQN: uint32(v[22])}
	for i := range k.GID {
		k.GID[i] = byte(v[6+i])
	}
	return k, nil
}

// Report is the bandwidth report of a run as the client sent it.
type Report struct {
	Size, Iters uint64
}

// Peer is the caller's QP, driven at the exchange's seams.
type Peer interface {
	// Connect brings our QP to RTR and RTS towards the peer's keys (its
	// first key message). It runs before the second key message.
	Connect(peer Keys) error
	// Test runs our side's part of the test: the client's work requests
	// (Run calls it for every program), the receives of send_bw's server
	// (posted before the server tells the client to go), either side's
	// half of write_lat's ping-pong. Serve does not call it for write_bw,
	// read_bw and atomic_bw, whose server is passive.
	Test(ctx context.Context) error
}

// Result is what an exchange learnt.
type Result struct {
	// Version is the peer's version string.
	Version string
	// Peer is the peer's first key message.
	Peer Keys
	// Report is the client's bandwidth report (Serve of write_bw, read_bw,
	// atomic_bw; zero otherwise).
	Report Report
}

// conn is one connection's message layer.
type conn struct {
	c      net.Conn
	server bool
}

// xchg sends out and receives as many bytes, in the role's order.
func (c *conn) xchg(out []byte) ([]byte, error) {
	in := make([]byte, len(out))
	if c.server {
		if _, err := io.ReadFull(c.c, in); err != nil {
			return nil, fmt.Errorf("read %d bytes: %w", len(in), err)
		}
	}
	if _, err := c.c.Write(out); err != nil {
		return nil, fmt.Errorf("write %d bytes: %w", len(out), err)
	}
	if !c.server {
		if _, err := io.ReadFull(c.c, in); err != nil {
			return nil, fmt.Errorf("read %d bytes: %w", len(in), err)
		}
	}
	return in, nil
}

// readN reads an n-byte message (the server's side of an echo).
func (c *conn) readN(n int) ([]byte, error) {
	in := make([]byte, n)
	if _, err := io.ReadFull(c.c, in); err != nil {
		return nil, fmt.Errorf("read %d bytes: %w", n, err)
	}
	return in, nil
}

func (c *conn) write(out []byte) error {
	if _, err := c.c.Write(out); err != nil {
		return fmt.Errorf("write %d bytes: %w", len(out), err)
	}
	return nil
}

func parseVersion(b []byte) (float64, string, error) {
	s := string(trimNUL(b))
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, s, fmt.Errorf("%w %q", ErrVersion, s)
	}
	return v, s, nil
}

// preamble exchanges version, system data and MTU; it returns the
// version both sides decide by and the peer's version string.
func (c *conn) preamble(version string) (float64, string, error) {
	var ver float64
	var peer string
	if c.server {
		got, err := c.readN(16)
		if err != nil {
			return 0, "", fmt.Errorf("version: %w", err)
		}
		if ver, peer, err = parseVersion(got); err != nil {
			return 0, "", err
		}
		if err := c.write(got); err != nil { // the server echoes it
			return 0, "", fmt.Errorf("version: %w", err)
		}
	} else {
		v := make([]byte, 16)
		copy(v, version)
		mine, _, err := parseVersion(v)
		if err != nil {
			return 0, "", err
		}
		got, err := c.xchg(v)
		if err != nil {
			return 0, "", fmt.Errorf("version: %w", err)
		}
		if ver, peer, err = parseVersion(got); err != nil {
			return 0, "", err
		}
		ver = min(ver, mine) // each side decides by the other's; both are alike here
	}
	if ver >= 5.32 {
		for _, x := range []uint32{4096, 64} { // cycle buffer, cache line
			out := binary.BigEndian.AppendUint32(nil, x)
			if c.server {
				got, err := c.readN(4)
				if err != nil {
					return 0, "", fmt.Errorf("sys data: %w", err)
				}
				out = got // echoed
				if err := c.write(out); err != nil {
					return 0, "", fmt.Errorf("sys data: %w", err)
				}
				continue
			}
			if _, err := c.xchg(out); err != nil {
				return 0, "", fmt.Errorf("sys data: %w", err)
			}
		}
	}
	if ver >= 5.1 {
		n := 4
		if ver >= 5.31 {
			n = 2
		}
		mtu := make([]byte, n)
		mtu[0] = '3' // IBV_MTU_1024
		if _, err := c.xchg(mtu); err != nil {
			return 0, "", fmt.Errorf("mtu: %w", err)
		}
	}
	return ver, peer, nil
}

// keys runs the pre-test key messages and connects p after the first.
func (c *conn) keys(op Op, mine Keys, p Peer) (Keys, error) {
	var peer Keys
	for i := range op.keyMessages() {
		got, err := c.xchg(mine.Marshal())
		if err != nil {
			return Keys{}, fmt.Errorf("key message %d: %w", i, err)
		}
		if i > 0 {
			continue
		}
		if peer, err = ParseKeys(got); err != nil {
			return Keys{}, err
		}
		if err := p.Connect(peer); err != nil {
			return Keys{}, fmt.Errorf("connect: %w", err)
		}
	}
	return peer, nil
}

// report exchanges the bandwidth report; the client sends r.
func (c *conn) report(ver float64, r Report) (Report, error) {
	itersLen := 4
	if ver >= 5.33 {
		itersLen = 8
	}
	var got Report
	for i, n := range []int{8, itersLen, 8, 8, 8} {
		out := make([]byte, n)
		if !c.server {
			switch {
			case i == 0:
				binary.BigEndian.PutUint64(out, r.Size)
			case i == 1 && n == 8:
				binary.BigEndian.PutUint64(out, r.Iters)
			case i == 1:
				binary.BigEndian.PutUint32(out, uint32(r.Iters))
			}
		}
		in, err := c.xchg(out)
		if err != nil {
			return Report{}, fmt.Errorf("report field %d: %w", i, err)
		}
		if !c.server {
			continue
		}
		switch {
		case i == 0:
			got.Size = binary.BigEndian.Uint64(in)
		case i == 1 && n == 8:
			got.Iters = binary.BigEndian.Uint64(in)
		case i == 1:
			got.Iters = uint64(binary.BigEndian.Uint32(in))
		}
	}
	return got, nil
}

// close is ctx_close_connection: a last key message, then "done".
func (c *conn) close(mine Keys) error {
	if _, err := c.xchg(mine.Marshal()); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	c.c.Write([]byte("done\x00")) // the peer may close first
	return nil
}

func deadline(ctx context.Context, nc net.Conn) {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(DefaultTimeout)
	}
	nc.SetDeadline(d)
}

// Serve plays perftest's server for one client connection nc running op:
// it answers the client's messages with mine, connects p to the client's
// keys, and calls p.Test where the server runs its part (send_bw,
// write_lat). It does not close nc. The Result holds what it learnt even
// when it fails after the keys.
func Serve(ctx context.Context, nc net.Conn, op Op, mine Keys, p Peer) (Result, error) {
	if !op.Valid() {
		return Result{}, fmt.Errorf("%w %q", ErrOp, op)
	}
	deadline(ctx, nc)
	c := &conn{c: nc, server: true}
	var res Result
	ver, peerVer, err := c.preamble("")
	if err != nil {
		return res, err
	}
	res.Version = peerVer
	if res.Peer, err = c.keys(op, mine, p); err != nil {
		return res, err
	}
	switch op {
	case WriteLat:
		return res, p.Test(ctx)
	case SendBW, WriteImmBW:
		if err := p.Test(ctx); err != nil {
			return res, err
		}
		if _, err := c.xchg(mine.Marshal()); err != nil {
			return res, fmt.Errorf("receives posted: %w", err)
		}
	default:
		// The test runs; the client's next key message says it is done.
		if _, err := c.xchg(mine.Marshal()); err != nil {
			return res, fmt.Errorf("end of test: %w", err)
		}
		if res.Report, err = c.report(ver, Report{}); err != nil {
			return res, err
		}
	}
	return res, c.close(mine)
}

// Run plays perftest's client over nc (connected to a perftest server)
// running op: it announces version (empty: Version), sends mine, connects
// p to the server's keys and calls p.Test for the test; size and iters go
// into the bandwidth report. It does not close nc.
func Run(ctx context.Context, nc net.Conn, op Op, version string, mine Keys, p Peer, report Report) (Result, error) {
	if !op.Valid() {
		return Result{}, fmt.Errorf("%w %q", ErrOp, op)
	}
	if version == "" {
		version = Version
	}
	deadline(ctx, nc)
	c := &conn{c: nc}
	var res Result
	ver, peerVer, err := c.preamble(version)
	if err != nil {
		return res, err
	}
	res.Version = peerVer
	if res.Peer, err = c.keys(op, mine, p); err != nil {
		return res, err
	}
	if op.postsReceives() {
		// The server posted its receives before it answers this one.
		if _, err := c.xchg(mine.Marshal()); err != nil {
			return res, fmt.Errorf("receives posted: %w", err)
		}
	}
	if err := p.Test(ctx); err != nil || op == WriteLat {
		return res, err
	}
	if !op.postsReceives() {
		if _, err := c.xchg(mine.Marshal()); err != nil {
			return res, fmt.Errorf("end of test: %w", err)
		}
		if _, err := c.report(ver, report); err != nil {
			return res, err
		}
	}
	return res, c.close(mine)
}

func trimNUL(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}
