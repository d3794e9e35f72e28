package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"unicode/utf8"
)

// The two-process exchange (see the package comment for the layout): one
// hello each way before the run, ready and done each way per message
// size, one fin each way after it. Every message is a 12-byte header and a
// body of at most maxBody bytes; a reader never reads more than that, and
// rejects anything it does not understand.

// Exchange framing.
const (
	exchangeMagic   = "VRPX"
	exchangeVersion = 2
	headerLen       = 12
	maxBody         = 16 << 10
	helloLen        = 80 // without the QPs
	readyLen        = 8
	doneLen         = 152 // without the counts
	maxText         = 1024

	kindHello = 1
	kindFin   = 2
	kindReady = 3
	kindDone  = 4
)

// hello flags.
const (
	helloVerify = 1 << iota
	helloLat
	helloBidir
	helloAll
	helloDuration
	helloFlags = helloVerify | helloLat | helloBidir | helloAll | helloDuration
)

// done flags.
const (
	doneFigures = 1 << iota
	doneLatDuration
	doneFlags = doneFigures | doneLatDuration
)

// errMalformed is returned (wrapped) for every message a peer sends that
// is not a well-formed vrdma-perf exchange message of this version.
var errMalformed = errors.New("malformed peer message")

// exchangeOps numbers the operations on the wire (0 is invalid).
var exchangeOps = []string{"", "write", "read", "send", "atomic"}

// qpEnd is one QP's address: perftest's QPN and initial PSN.
type qpEnd struct{ qpn, psn uint32 }

// hello is what each side tells the other before the run: the test it
// runs (both must agree) and its QPs and buffer, as perftest's
// pingpong_dest (qpn, psn, rkey, vaddr, gid) per QP plus the buffer's
// size.
type hello struct {
	op                      string
	verify, lat, bidir, all bool
	txDepth                 uint32
	size                    uint64 // 0 with all
	iters                   uint64 // per QP, or nanoseconds with duration
	duration                bool   // iters is a duration
	latIters                uint64
	mtu                     uint32 // the side's path MTU in bytes: the QPs take the lower of both sides'
	inline                  uint32 // -I, as the side's device allows it
	gid                     [16]byte
	rkey                    uint32
	addr, bufSize           uint64
	qps                     []qpEnd
}

// ready says a side is ready to run size.
type ready struct{ size uint64 }

// done says a side has run size: what its requester posted on each QP so
// far (empty when it posted nothing) and, with figures, its measurement.
type done struct {
	size        uint64
	figures     bool
	latDuration bool // the figures are a -D latency run's
	iters       uint64
	// seconds, bytes/s, operations/s, peak bytes/s, the latency figures
	// (usec), transactions/s, the latency pass's p50, p99, average (usec).
	secs, bps, mps, peak                     float64
	min, max, typical, avg, stdev, p99, p999 float64
	tps, passP50, passP99, passAvg           float64
	passIters                                uint64
	posted                                   []uint64
}

// fin is what each side tells the other after the run.
type fin struct {
	ok   bool
	text string // why not ok, or what the side verified; at most maxText bytes of UTF-8
}

func putHeader(b []byte, kind byte, n int) {
	copy(b, exchangeMagic)
	b[4], b[5], b[6], b[7] = exchangeVersion, kind, 0, 0
	binary.LittleEndian.PutUint32(b[8:], uint32(n))
}

func message(kind byte, n int) ([]byte, []byte) {
	b := make([]byte, headerLen+n)
	putHeader(b, kind, n)
	return b, b[headerLen:]
}

func (h *hello) encode() []byte {
	b, p := message(kindHello, helloLen+8*len(h.qps))
	le := binary.LittleEndian
	p[0] = byte(slices.Index(exchangeOps, h.op))
	for _, f := range []struct {
		on  bool
		bit byte
	}{{h.verify, helloVerify}, {h.lat, helloLat}, {h.bidir, helloBidir}, {h.all, helloAll}, {h.duration, helloDuration}} {
		if f.on {
			p[1] |= f.bit
		}
	}
	le.PutUint32(p[4:], h.txDepth)
	le.PutUint64(p[8:], h.size)
	le.PutUint64(p[16:], h.iters)
	le.PutUint64(p[24:], h.latIters)
	le.PutUint32(p[32:], h.mtu)
	le.PutUint32(p[36:], h.inline)
	copy(p[40:56], h.gid[:])
	le.PutUint32(p[56:], h.rkey)
	le.PutUint32(p[60:], uint32(len(h.qps)))
	le.PutUint64(p[64:], h.addr)
	le.PutUint64(p[72:], h.bufSize)
	for i, q := range h.qps {
		le.PutUint32(p[helloLen+8*i:], q.qpn)
		le.PutUint32(p[helloLen+8*i+4:], q.psn)
	}
	return b
}

func decodeHello(p []byte) (hello, error) {
	le := binary.LittleEndian
	if len(p) < helloLen {
		return hello{}, fmt.Errorf("%w: hello of %d bytes, want at least %d", errMalformed, len(p), helloLen)
	}
	n := le.Uint32(p[60:])
	if n < 1 || n > maxQPs || len(p) != helloLen+8*int(n) {
		return hello{}, fmt.Errorf("%w: hello of %d bytes for %d QPs", errMalformed, len(p), n)
	}
	if p[0] == 0 || int(p[0]) >= len(exchangeOps) {
		return hello{}, fmt.Errorf("%w: unknown operation %d", errMalformed, p[0])
	}
	if p[1]&^helloFlags != 0 || p[2] != 0 || p[3] != 0 {
		return hello{}, fmt.Errorf("%w: reserved bits set", errMalformed)
	}
	h := hello{op: exchangeOps[p[0]], verify: p[1]&helloVerify != 0, lat: p[1]&helloLat != 0, bidir: p[1]&helloBidir != 0,
		all: p[1]&helloAll != 0, duration: p[1]&helloDuration != 0,
		txDepth: le.Uint32(p[4:]), size: le.Uint64(p[8:]), iters: le.Uint64(p[16:]), latIters: le.Uint64(p[24:]),
		mtu: le.Uint32(p[32:]), inline: le.Uint32(p[36:]), gid: [16]byte(p[40:56]), rkey: le.Uint32(p[56:]),
		addr: le.Uint64(p[64:]), bufSize: le.Uint64(p[72:])}
	for i := range int(n) {
		q := qpEnd{qpn: le.Uint32(p[helloLen+8*i:]), psn: le.Uint32(p[helloLen+8*i+4:])}
		if q.qpn >= 1<<24 || q.psn >= 1<<24 {
			return hello{}, fmt.Errorf("%w: QPN %#x or PSN %#x wider than 24 bits", errMalformed, q.qpn, q.psn)
		}
		h.qps = append(h.qps, q)
	}
	return h, nil
}

func (r ready) encode() []byte {
	b, p := message(kindReady, readyLen)
	binary.LittleEndian.PutUint64(p, r.size)
	return b
}

func decodeReady(p []byte) (ready, error) {
	if len(p) != readyLen {
		return ready{}, fmt.Errorf("%w: ready of %d bytes", errMalformed, len(p))
	}
	return ready{size: binary.LittleEndian.Uint64(p)}, nil
}

// doneFloats are done's figures in wire order.
func (d *done) floats() []*float64 {
	return []*float64{&d.secs, &d.bps, &d.mps, &d.peak, &d.min, &d.max, &d.typical, &d.avg, &d.stdev, &d.p99, &d.p999,
		&d.tps, &d.passP50, &d.passP99, &d.passAvg}
}

func (d *done) encode() []byte {
	b, p := message(kindDone, doneLen+8*len(d.posted))
	le := binary.LittleEndian
	le.PutUint64(p[0:], d.size)
	var fl uint32
	if d.figures {
		fl |= doneFigures
	}
	if d.latDuration {
		fl |= doneLatDuration
	}
	le.PutUint32(p[8:], fl)
	le.PutUint32(p[12:], uint32(len(d.posted)))
	le.PutUint64(p[16:], d.iters)
	for i, f := range d.floats() {
		le.PutUint64(p[24+8*i:], math.Float64bits(*f))
	}
	le.PutUint64(p[144:], d.passIters)
	for i, n := range d.posted {
		le.PutUint64(p[doneLen+8*i:], n)
	}
	return b
}

func decodeDone(p []byte) (done, error) {
	le := binary.LittleEndian
	if len(p) < doneLen {
		return done{}, fmt.Errorf("%w: done of %d bytes", errMalformed, len(p))
	}
	fl, n := le.Uint32(p[8:]), le.Uint32(p[12:])
	if fl&^doneFlags != 0 || n > maxQPs || len(p) != doneLen+8*int(n) {
		return done{}, fmt.Errorf("%w: done of %d bytes with flags %#x for %d QPs", errMalformed, len(p), fl, n)
	}
	d := done{size: le.Uint64(p[0:]), figures: fl&doneFigures != 0, latDuration: fl&doneLatDuration != 0,
		iters: le.Uint64(p[16:]), passIters: le.Uint64(p[144:])}
	for i, f := range d.floats() {
		*f = math.Float64frombits(le.Uint64(p[24+8*i:]))
		// A figure is a count, a time or a rate: never negative, never
		// infinite, never NaN.
		if math.IsNaN(*f) || math.IsInf(*f, 0) || *f < 0 {
			return done{}, fmt.Errorf("%w: done figure %d is %v", errMalformed, i, *f)
		}
	}
	for i := range int(n) {
		d.posted = append(d.posted, le.Uint64(p[doneLen+8*i:]))
	}
	return d, nil
}

func (f *fin) encode() []byte {
	r := f.text
	if len(r) > maxText {
		r = r[:maxText]
	}
	for !utf8.ValidString(r) { // cut inside a rune
		r = r[:len(r)-1]
	}
	b, p := message(kindFin, 1+len(r))
	if f.ok {
		p[0] = 1
	}
	copy(p[1:], r)
	return b
}

func decodeFin(p []byte) (fin, error) {
	if len(p) < 1 || len(p) > 1+maxText || p[0] > 1 || !utf8.Valid(p[1:]) {
		return fin{}, fmt.Errorf("%w: bad fin (%d bytes)", errMalformed, len(p))
	}
	return fin{ok: p[0] == 1, text: string(p[1:])}, nil
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
		return 0, nil, fmt.Errorf("%w: exchange version %d, want %d (vrdma-perf of another release?)", errMalformed, h[4], exchangeVersion)
	}
	if h[5] < kindHello || h[5] > kindDone {
		return 0, nil, fmt.Errorf("%w: message kind %d", errMalformed, h[5])
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
