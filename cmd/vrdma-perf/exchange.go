package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"unicode/utf8"
)

// The two-process exchange (see the package comment for the layout): one
// hello each way before the run, one fin each way after it. Every message
// is a 12-byte header and a body of at most maxBody bytes; a reader never
// reads more than that, and rejects anything it does not understand.

// Exchange framing.
const (
	exchangeMagic   = "VRPX"
	exchangeVersion = 1
	headerLen       = 12
	maxBody         = 1024
	helloLen        = 80
	maxReason       = 512

	kindHello = 1
	kindFin   = 2

	flagVerify = 1 << 0
)

// errMalformed is returned (wrapped) for every message a peer sends that
// is not a well-formed vrdma-perf exchange message of this version.
var errMalformed = errors.New("malformed peer message")

// exchangeOps numbers the operations on the wire (0 is invalid).
var exchangeOps = []string{"", "write", "read", "send", "atomic"}

// hello is what each side tells the other before the run: the test it
// runs (both must agree) and its QP and buffer, as perftest's
// pingpong_dest (lid, qpn, psn, rkey, vaddr, gid) plus the buffer's size.
type hello struct {
	op       string
	verify   bool
	txDepth  uint32
	size     uint64
	iters    uint64
	latIters uint64
	qpn, psn uint32
	gid      [16]byte
	rkey     uint32
	addr     uint64
	bufSize  uint64
}

// fin is what each side tells the other after the run.
type fin struct {
	ok     bool
	reason string // why not ok; at most maxReason bytes of UTF-8
}

func putHeader(b []byte, kind byte, n int) {
	copy(b, exchangeMagic)
	b[4], b[5], b[6], b[7] = exchangeVersion, kind, 0, 0
	binary.LittleEndian.PutUint32(b[8:], uint32(n))
}

func (h *hello) encode() []byte {
	b := make([]byte, headerLen+helloLen)
	putHeader(b, kindHello, helloLen)
	p := b[headerLen:]
	le := binary.LittleEndian
	p[0] = byte(slices.Index(exchangeOps, h.op))
	if h.verify {
		p[1] = flagVerify
	}
	le.PutUint32(p[4:], h.txDepth)
	le.PutUint64(p[8:], h.size)
	le.PutUint64(p[16:], h.iters)
	le.PutUint64(p[24:], h.latIters)
	le.PutUint32(p[32:], h.qpn)
	le.PutUint32(p[36:], h.psn)
	copy(p[40:56], h.gid[:])
	le.PutUint32(p[56:], h.rkey)
	le.PutUint64(p[64:], h.addr)
	le.PutUint64(p[72:], h.bufSize)
	return b
}

func decodeHello(p []byte) (hello, error) {
	if len(p) != helloLen {
		return hello{}, fmt.Errorf("%w: hello of %d bytes, want %d", errMalformed, len(p), helloLen)
	}
	le := binary.LittleEndian
	if p[0] == 0 || int(p[0]) >= len(exchangeOps) {
		return hello{}, fmt.Errorf("%w: unknown operation %d", errMalformed, p[0])
	}
	if p[1]&^flagVerify != 0 || p[2] != 0 || p[3] != 0 || le.Uint32(p[60:]) != 0 {
		return hello{}, fmt.Errorf("%w: reserved bits set", errMalformed)
	}
	h := hello{op: exchangeOps[p[0]], verify: p[1]&flagVerify != 0, txDepth: le.Uint32(p[4:]),
		size: le.Uint64(p[8:]), iters: le.Uint64(p[16:]), latIters: le.Uint64(p[24:]),
		qpn: le.Uint32(p[32:]), psn: le.Uint32(p[36:]), gid: [16]byte(p[40:56]),
		rkey: le.Uint32(p[56:]), addr: le.Uint64(p[64:]), bufSize: le.Uint64(p[72:])}
	if h.qpn >= 1<<24 || h.psn >= 1<<24 {
		return hello{}, fmt.Errorf("%w: QPN %#x or PSN %#x wider than 24 bits", errMalformed, h.qpn, h.psn)
	}
	return h, nil
}

func (f *fin) encode() []byte {
	r := f.reason
	if len(r) > maxReason {
		r = r[:maxReason]
	}
	for !utf8.ValidString(r) { // cut inside a rune
		r = r[:len(r)-1]
	}
	b := make([]byte, headerLen+1+len(r))
	putHeader(b, kindFin, 1+len(r))
	if f.ok {
		b[headerLen] = 1
	}
	copy(b[headerLen+1:], r)
	return b
}

func decodeFin(p []byte) (fin, error) {
	if len(p) < 1 || len(p) > 1+maxReason || p[0] > 1 || !utf8.Valid(p[1:]) {
		return fin{}, fmt.Errorf("%w: bad fin (%d bytes)", errMalformed, len(p))
	}
	return fin{ok: p[0] == 1, reason: string(p[1:])}, nil
}

// readMessage reads one message: its kind and body. The caller bounds the
// time (a deadline on the connection); readMessage bounds the bytes.
func readMessage(r io.Reader) (byte, []byte, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, nil, fmt.Errorf("%w: truncated header", errMalformed)
		}
		return 0, nil, err
	}
	if string(h[:4]) != exchangeMagic {
		return 0, nil, fmt.Errorf("%w: bad magic %q (is the peer vrdma-perf?)", errMalformed, h[:4])
	}
	if h[4] != exchangeVersion {
		return 0, nil, fmt.Errorf("%w: exchange version %d, want %d", errMalformed, h[4], exchangeVersion)
	}
	if h[6] != 0 || h[7] != 0 {
		return 0, nil, fmt.Errorf("%w: reserved header bytes set", errMalformed)
	}
	n := binary.LittleEndian.Uint32(h[8:])
	if n > maxBody {
		return 0, nil, fmt.Errorf("%w: body of %d bytes, at most %d", errMalformed, n, maxBody)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, nil, fmt.Errorf("%w: truncated body: %v", errMalformed, err)
	}
	return h[5], body, nil
}

// readHello reads the peer's hello; a fin instead is the peer's refusal.
func readHello(r io.Reader) (hello, error) {
	kind, body, err := readMessage(r)
	if err != nil {
		return hello{}, err
	}
	switch kind {
	case kindHello:
		return decodeHello(body)
	case kindFin:
		f, err := decodeFin(body)
		if err != nil {
			return hello{}, err
		}
		return hello{}, fmt.Errorf("peer refused: %s", f.reason)
	}
	return hello{}, fmt.Errorf("%w: message kind %d, want hello", errMalformed, kind)
}

// readFin reads the peer's fin.
func readFin(r io.Reader) (fin, error) {
	kind, body, err := readMessage(r)
	if err != nil {
		return fin{}, err
	}
	if kind != kindFin {
		return fin{}, fmt.Errorf("%w: message kind %d, want fin", errMalformed, kind)
	}
	return decodeFin(body)
}
