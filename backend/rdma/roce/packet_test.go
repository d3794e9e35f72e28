package roce

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// payloadBytes returns n bytes of a recognisable pattern.
func payloadBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// samplePacket returns a packet of opcode op with every header it carries
// set to distinctive values and an n-byte payload (n ignored without one).
func samplePacket(op Opcode, n int) Packet {
	p := Packet{BTH: BTH{
		Opcode: op, SE: true, M: true, PKey: 0xffff, FECN: true,
		DestQP: 0xabcdef, AckReq: true, PSN: 0xfffffe,
	}}
	ext := op.Ext()
	if ext&ExtRETH != 0 {
		p.RETH = RETH{VA: 0x1122334455667788, RKey: 0xdeadbeef, DMALen: 0x10000}
	}
	if ext&ExtAtomicETH != 0 {
		p.AtomicETH = AtomicETH{VA: 0x7f0000001000, RKey: 0x1234, SwapAdd: 0xa5a5a5a5a5a5a5a5, Compare: 42}
	}
	if ext&ExtAETH != 0 {
		p.AETH = AETH{Syndrome: ACKSyndrome(CreditsInvalid), MSN: 0x123456}
	}
	if ext&ExtAtomicAckETH != 0 {
		p.AtomicAckETH = AtomicAckETH{OrigData: 0x0102030405060708}
	}
	if ext&ExtImmDt != 0 {
		p.ImmDt = 0xcafef00d
	}
	if ext&ExtDETH != 0 {
		p.DETH = DETH{QKey: 0x80010203, SrcQP: 0x123456}
	}
	if ext&ExtIETH != 0 {
		p.IETH = 0x00c0ff1e
	}
	if op.HasPayload() {
		p.Payload = payloadBytes(n)
	}
	return p
}

// testOpcodes are the implemented opcodes.
var testOpcodes = func() []Opcode {
	var ops []Opcode
	for op := range 256 {
		if Opcode(op).Valid() {
			ops = append(ops, Opcode(op))
		}
	}
	return ops
}()

// payloadSizes returns the payload lengths to try for op.
func payloadSizes(op Opcode) []int {
	switch {
	case !op.HasPayload():
		return []int{0}
	case op.Segment() == SegmentFirst || op.Segment() == SegmentMiddle:
		return []int{256, 1024, 4096}
	case op.Segment() == SegmentLast:
		return []int{1, 2, 3, 4, 1023, 4096}
	default:
		return []int{0, 1, 5, 1024, 4095, 4096}
	}
}

func samePacket(t *testing.T, got, want Packet) {
	t.Helper()
	if !bytes.Equal(got.Payload, want.Payload) {
		t.Fatalf("payload: got %d bytes, want %d (or different content)", len(got.Payload), len(want.Payload))
	}
	got.Payload, want.Payload = nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got  %+v\nwant %+v", got, want)
	}
}

func TestRoundTripEveryOpcode(t *testing.T) {
	for _, op := range testOpcodes {
		for _, n := range payloadSizes(op) {
			p := samplePacket(op, n)
			p.ICRC = 0x01020304
			b, err := p.Append([]byte("prefix"))
			if err != nil {
				t.Fatalf("%v/%d: Append: %v", op, n, err)
			}
			if string(b[:6]) != "prefix" {
				t.Fatalf("%v/%d: Append overwrote the prefix", op, n)
			}
			b = b[6:]
			if len(b) != p.Len() || len(b)%4 != 0 {
				t.Fatalf("%v/%d: got %d bytes, want Len %d, a multiple of 4", op, n, len(b), p.Len())
			}
			if !bytes.Equal(b[len(b)-4:], []byte{4, 3, 2, 1}) {
				t.Fatalf("%v/%d: ICRC field % x, want little-endian 04 03 02 01", op, n, b[len(b)-4:])
			}
			got, err := Parse(b)
			if err != nil {
				t.Fatalf("%v/%d: Parse: %v", op, n, err)
			}
			want := p
			want.BTH.PadCount = uint8(padLen(n))
			if !op.HasPayload() {
				want.BTH.PadCount = 0
			}
			samePacket(t, got, want)
			pmtu := MTU4096
			if seg := op.Segment(); seg == SegmentFirst || seg == SegmentMiddle {
				pmtu = MTU(n)
			}
			if err := got.CheckPMTU(pmtu); err != nil {
				t.Fatalf("%v/%d: CheckPMTU(%d): %v", op, n, pmtu, err)
			}
			again, err := got.Append(nil)
			if err != nil || !bytes.Equal(again, b) {
				t.Fatalf("%v/%d: re-encode: got % x, %v, want % x", op, n, again, err, b)
			}
		}
	}
}

func TestOpcodeTable(t *testing.T) {
	// Header lengths from rxe_opcode.c's .length, per opcode.
	want := map[Opcode]int{
		OpSendFirst: 12, OpSendMiddle: 12, OpSendLast: 12, OpSendLastWithImmediate: 16,
		OpSendOnly: 12, OpSendOnlyWithImmediate: 16, OpWriteFirst: 28, OpWriteMiddle: 12,
		OpWriteLast: 12, OpWriteLastWithImmediate: 16, OpWriteOnly: 28, OpWriteOnlyWithImmediate: 32,
		OpReadRequest: 28, OpReadResponseFirst: 16, OpReadResponseMiddle: 12, OpReadResponseLast: 16,
		OpReadResponseOnly: 16, OpAcknowledge: 16, OpAtomicAcknowledge: 24, OpCompareSwap: 40,
		OpFetchAdd: 40, OpSendLastWithInvalidate: 16, OpSendOnlyWithInvalidate: 16,
		OpUDSendOnly: 20, OpUDSendOnlyWithImmediate: 24,
	}
	for _, op := range testOpcodes {
		if got := op.HeaderLen(); got != want[op] {
			t.Errorf("%v: got header length %d, want %d", op, got, want[op])
		}
		noPayload := op == OpReadRequest || op == OpAcknowledge || op == OpAtomicAcknowledge ||
			op == OpCompareSwap || op == OpFetchAdd
		if op.HasPayload() == noPayload {
			t.Errorf("%v: got HasPayload %t", op, op.HasPayload())
		}
	}
	for _, op := range []Opcode{0x15, 0x18, 0x19, 0x1c, 0x1d, 0x20, 0x24, 0x60, 0x66, 0x81, 0xff} {
		if op.Valid() || op.HeaderLen() != 0 || op.HasPayload() || op.Ext() != 0 {
			t.Errorf("%v: got valid", op)
		}
	}
	if got := OpWriteOnlyWithImmediate.String(); got != "RDMA_WRITE_ONLY_WITH_IMMEDIATE" {
		t.Errorf("got %q", got)
	}
	if got := Opcode(0x81).String(); got != "Opcode(0x81)" {
		t.Errorf("got %q", got)
	}
}

// TestIETHLayout pins the bytes of SEND_ONLY_WITH_INVALIDATE as rxe lays
// them out (rxe_opcode.c: the IETH at offset 12, the payload at 16): the
// R_Key big-endian right after the BTH, then the payload and its pad.
func TestIETHLayout(t *testing.T) {
	p := Packet{BTH: BTH{Opcode: OpSendOnlyWithInvalidate, PKey: 0xffff, DestQP: 0x11, AckReq: true, PSN: 7},
		IETH: 0x12345678, Payload: []byte{0xaa, 0xbb, 0xcc}}
	b := encode(t, p)
	want := []byte{
		0x17, 0x10, 0xff, 0xff, 0, 0, 0, 0x11, 0x80, 0, 0, 7, // BTH, pad count 1
		0x12, 0x34, 0x56, 0x78, // IETH
		0xaa, 0xbb, 0xcc, 0, // payload, pad
		0, 0, 0, 0, // ICRC placeholder
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("got  % x\nwant % x", b, want)
	}
	got, err := Parse(b)
	if err != nil || got.IETH != 0x12345678 || !bytes.Equal(got.Payload, p.Payload) {
		t.Fatalf("Parse: got IETH %#x payload % x, %v", got.IETH, got.Payload, err)
	}
	// Without room for the IETH the packet is truncated, not a SEND.
	if _, err := Parse(b[:BTHLen+ICRCLen]); !errors.Is(err, ErrTruncated) {
		t.Fatalf("IETH missing: got %v, want ErrTruncated", err)
	}
	// Only the SEND opcodes that end a message carry it.
	for _, op := range testOpcodes {
		inv := op == OpSendLastWithInvalidate || op == OpSendOnlyWithInvalidate
		if (op.Ext()&ExtIETH != 0) != inv {
			t.Errorf("%v: IETH %t", op, !inv)
		}
	}
}

// mutate returns a copy of b with f applied.
func mutate(b []byte, f func([]byte) []byte) []byte {
	return f(append([]byte(nil), b...))
}

func encode(t *testing.T, p Packet) []byte {
	t.Helper()
	b, err := p.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseErrors(t *testing.T) {
	send := encode(t, samplePacket(OpSendOnly, 8))
	ack := encode(t, samplePacket(OpAcknowledge, 0))
	read := encode(t, samplePacket(OpReadRequest, 0))
	first := encode(t, samplePacket(OpSendFirst, 1024))
	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"15 bytes", send[:15], ErrTruncated},
		{"reserved RC opcode", mutate(send, func(b []byte) []byte { b[0] = 0x15; return b }), ErrOpcode},
		{"FLUSH", mutate(send, func(b []byte) []byte { b[0] = 0x18; return b }), ErrOpcode},
		{"UC SEND_ONLY", mutate(send, func(b []byte) []byte { b[0] = 0x24; return b }), ErrOpcode},
		{"CNP", mutate(send, func(b []byte) []byte { b[0] = 0x81; return b }), ErrOpcode},
		{"TVer 1", mutate(send, func(b []byte) []byte { b[1] |= 1; return b }), ErrVersion},
		{"READ without RETH", read[:BTHLen+ICRCLen], ErrTruncated},
		{"READ with half a RETH", read[:BTHLen+8+ICRCLen], ErrTruncated},
		{"ACK with payload", append(append([]byte(nil), ack...), 0, 0, 0, 0), ErrLength},
		{"ACK with pad", mutate(ack, func(b []byte) []byte { b[1] |= 1 << 4; return b }), ErrPad},
		{"payload not 4-aligned", send[:len(send)-1], ErrPad},
		{"pad beyond payload", mutate(send[:BTHLen+ICRCLen], func(b []byte) []byte { b[1] |= 3 << 4; return b }), ErrPad},
		{"payload above 4096", encodeRaw(OpSendOnly, 4100), ErrLength},
		{"FIRST not a path MTU", first[:len(first)-8], ErrLength},
		{"MIDDLE of 1000", encodeRaw(OpSendMiddle, 1000), ErrLength},
		{"syndrome type reserved", mutate(ack, func(b []byte) []byte { b[BTHLen] = 0x40; return b }), ErrSyndrome},
		{"syndrome bit 7", mutate(ack, func(b []byte) []byte { b[BTHLen] = 0x80; return b }), ErrSyndrome},
		{"NAK code 5", mutate(ack, func(b []byte) []byte { b[BTHLen] = 0x65; return b }), ErrSyndrome},
	}
	sentinels := []error{ErrTruncated, ErrOpcode, ErrVersion, ErrPad, ErrLength, ErrPMTU, ErrSyndrome, ErrICRC, ErrInvalid}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(tt.b)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
			for _, s := range sentinels {
				if s != tt.want && errors.Is(err, s) {
					t.Errorf("error %v also matches %v", err, s)
				}
			}
			var pe *PacketError
			if !errors.As(err, &pe) || pe.Reason == "" {
				t.Errorf("got %#v, want a *PacketError with a reason", err)
			}
			if !reflect.DeepEqual(p, Packet{}) {
				t.Errorf("got packet %+v with the error, want the zero Packet", p)
			}
		})
	}
}

// encodeRaw returns a packet of opcode op with an n-byte payload, built
// without Append's checks.
func encodeRaw(op Opcode, n int) []byte {
	p := samplePacket(op, 0)
	var b []byte
	b = p.BTH.append(b, uint8(padLen(n)))
	b = append(b, make([]byte, op.HeaderLen()-BTHLen+n+padLen(n)+ICRCLen)...)
	return b
}

func TestParseKeepsReservedBits(t *testing.T) {
	b := encode(t, samplePacket(OpSendOnly, 5))
	b[4] |= 0x15       // resv6a
	b[8] |= 0x2a       // resv7
	b[BTHLen+5] = 0xee // a pad byte
	p, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Payload) != 5 || cap(p.Payload) != 5 || p.BTH.PadCount != 3 {
		t.Fatalf("got payload %d (cap %d), pad %d; want 5, 5, 3", len(p.Payload), cap(p.Payload), p.BTH.PadCount)
	}
	again, err := p.Append(nil)
	if err != nil || !bytes.Equal(again, b) {
		t.Fatalf("got % x, %v; want % x", again, err, b)
	}
}

func TestCheckPMTU(t *testing.T) {
	tests := []struct {
		op   Opcode
		n    int
		pmtu MTU
		want error
	}{
		{OpSendFirst, 1024, MTU1024, nil},
		{OpSendFirst, 2048, MTU1024, ErrPMTU},
		{OpWriteMiddle, 1024, MTU4096, ErrPMTU},
		{OpReadResponseMiddle, 4096, MTU4096, nil},
		{OpSendLast, 1, MTU1024, nil},
		{OpSendLast, 1024, MTU1024, nil},
		{OpSendLast, 0, MTU1024, ErrPMTU},
		{OpReadResponseLast, 1025, MTU1024, ErrPMTU},
		{OpWriteOnly, 0, MTU1024, nil},
		{OpSendOnlyWithImmediate, 1024, MTU1024, nil},
		{OpSendOnly, 1025, MTU1024, ErrPMTU},
		{OpReadResponseOnly, 2048, MTU2048, nil},
		{OpAcknowledge, 0, MTU256, nil},
		{OpSendOnly, 0, 1500, ErrInvalid},
		{OpSendOnly, 0, 0, ErrInvalid},
	}
	for _, tt := range tests {
		p := samplePacket(tt.op, tt.n)
		if err := p.CheckPMTU(tt.pmtu); !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
			t.Errorf("%v with %d bytes, PMTU %d: got %v, want %v", tt.op, tt.n, tt.pmtu, err, tt.want)
		}
	}
}

func TestAppendErrors(t *testing.T) {
	tests := []struct {
		name string
		p    Packet
	}{
		{"opcode", Packet{BTH: BTH{Opcode: 0x24}}},
		{"TVer", Packet{BTH: BTH{Opcode: OpSendOnly, TVer: 1}}},
		{"QPN", Packet{BTH: BTH{Opcode: OpSendOnly, DestQP: 1 << 24}}},
		{"PSN", Packet{BTH: BTH{Opcode: OpSendOnly, PSN: 1 << 24}}},
		{"payload on ACK", Packet{BTH: BTH{Opcode: OpAcknowledge}, Payload: []byte{1}}},
		{"payload too long", Packet{BTH: BTH{Opcode: OpSendOnly}, Payload: make([]byte, 4097)}},
		{"FIRST not a path MTU", Packet{BTH: BTH{Opcode: OpWriteFirst}, Payload: make([]byte, 1000)}},
		{"MSN", Packet{BTH: BTH{Opcode: OpAcknowledge}, AETH: AETH{MSN: 1 << 24}}},
		{"syndrome", Packet{BTH: BTH{Opcode: OpAtomicAcknowledge}, AETH: AETH{Syndrome: 0x40}}},
	}
	for _, tt := range tests {
		dst := []byte("keep")
		got, err := tt.p.Append(dst)
		if !errors.Is(err, ErrInvalid) || string(got) != "keep" {
			t.Errorf("%s: got %q, %v; want dst unchanged and ErrInvalid", tt.name, got, err)
		}
	}
}

func TestSyndrome(t *testing.T) {
	tests := []struct {
		s     Syndrome
		typ   AckType
		value uint8
		valid bool
		str   string
	}{
		{ACKSyndrome(CreditsInvalid), AckTypeACK, 0x1f, true, "ACK(credits 31)"},
		{ACKSyndrome(3), AckTypeACK, 3, true, "ACK(credits 3)"},
		{RNRNAKSyndrome(14), AckTypeRNRNAK, 14, true, "RNR NAK(timer 14)"},
		{NAKSyndrome(NAKPSNSequenceError), AckTypeNAK, 0, true, "NAK(PSN sequence error)"},
		{NAKSyndrome(NAKInvalidRequest), AckTypeNAK, 1, true, "NAK(invalid request)"},
		{NAKSyndrome(NAKRemoteAccessError), AckTypeNAK, 2, true, "NAK(remote access error)"},
		{NAKSyndrome(NAKRemoteOperationalError), AckTypeNAK, 3, true, "NAK(remote operational error)"},
		{NAKSyndrome(NAKInvalidRDRequest), AckTypeNAK, 4, true, "NAK(invalid RD request)"},
		{NAKSyndrome(5), AckTypeNAK, 5, false, "Syndrome(0x65)"},
		{0x40, AckTypeReserved, 0, false, "Syndrome(0x40)"},
		{0x80, AckTypeACK, 0, false, "Syndrome(0x80)"},
	}
	for _, tt := range tests {
		if tt.s.Type() != tt.typ || tt.s.Value() != tt.value || tt.s.Valid() != tt.valid || tt.s.String() != tt.str {
			t.Errorf("%#02x: got type %d value %d valid %t %q; want %d %d %t %q", uint8(tt.s),
				tt.s.Type(), tt.s.Value(), tt.s.Valid(), tt.s.String(), tt.typ, tt.value, tt.valid, tt.str)
		}
	}
	// The values rxe uses (rxe_hdr.h enum aeth_syndrome).
	for s, want := range map[Syndrome]uint8{
		ACKSyndrome(CreditsInvalid): 0x1f, NAKSyndrome(NAKPSNSequenceError): 0x60,
		NAKSyndrome(NAKInvalidRequest): 0x61, NAKSyndrome(NAKRemoteAccessError): 0x62,
		NAKSyndrome(NAKRemoteOperationalError): 0x63, RNRNAKSyndrome(0): 0x20,
	} {
		if uint8(s) != want {
			t.Errorf("got %#02x, want %#02x", uint8(s), want)
		}
	}
}

func TestBTHLayout(t *testing.T) {
	p := Packet{BTH: BTH{Opcode: OpReadRequest, SE: true, PKey: 0x8001, BECN: true, DestQP: 0x000011, AckReq: true, PSN: 0x800000}}
	b := encode(t, p)
	want := []byte{0x0c, 0x80, 0x80, 0x01, 0x40, 0x00, 0x00, 0x11, 0x80, 0x80, 0x00, 0x00}
	if !bytes.Equal(b[:BTHLen], want) {
		t.Fatalf("got % x, want % x", b[:BTHLen], want)
	}
}

func TestParseDoesNotAllocate(t *testing.T) {
	b := encode(t, samplePacket(OpWriteOnlyWithImmediate, 1000))
	buf := make([]byte, 0, 8192)
	p := samplePacket(OpWriteOnlyWithImmediate, 1000)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Parse(b); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Append(buf[:0]); err != nil {
			t.Fatal(err)
		}
		_ = ICRC(testIPv6, testSrcPort, UDPPort, b[:len(b)-4])
		if err := Verify(testIPv4, testSrcPort, UDPPort, b); err == nil {
			t.Fatal("verify of an unsealed packet succeeded")
		}
	})
	// Verify's failure allocates its *ICRCError; nothing else may.
	if allocs > 1 {
		t.Fatalf("got %v allocations per run, want at most 1", allocs)
	}
}

// TestEncodeInPlace: Encode over a buffer holding the payload at its place
// (and garbage elsewhere) gives Append's bytes, for every opcode and
// length; it refuses a buffer of the wrong length and what Append refuses.
func TestEncodeInPlace(t *testing.T) {
	for _, op := range testOpcodes {
		for _, n := range payloadSizes(op) {
			p := samplePacket(op, n)
			p.ICRC = 0x01020304
			want, err := p.Append(nil)
			if err != nil {
				t.Fatal(err)
			}
			b := bytes.Repeat([]byte{0xee}, len(want))
			hl := op.HeaderLen()
			copy(b[hl:], p.Payload)
			q := p
			q.Payload = nil
			if err := q.Encode(b, len(p.Payload)); err != nil {
				t.Fatalf("%v/%d: Encode: %v", op, n, err)
			}
			if !bytes.Equal(b, want) {
				t.Fatalf("%v/%d: Encode\n got % x\nwant % x", op, n, b, want)
			}
			if err := q.Encode(b[:len(b)-1], len(p.Payload)); !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v/%d: short buffer: got %v, want ErrInvalid", op, n, err)
			}
		}
	}
	p := samplePacket(OpWriteMiddle, 1000) // not a path MTU
	if err := p.Encode(make([]byte, p.Len()), 1000); !errors.Is(err, ErrInvalid) {
		t.Errorf("MIDDLE of 1000 bytes: got %v, want ErrInvalid", err)
	}
}
