package roce

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// FuzzParse feeds bytes to Parse. Nothing may panic; an error must come
// with the zero Packet and match exactly one sentinel; a parsed packet must
// re-encode to the same bytes, pass or fail CheckPMTU with a sentinel, and
// survive Verify and RecoverIPv4ID. Seeded with sealed packets of every
// opcode, kept small: Go's minimizer is quadratic in the input length.
func FuzzParse(f *testing.F) {
	for _, op := range testOpcodes {
		sizes := []int{0, 5} // 0 is dropped for opcodes without payload
		if seg := op.Segment(); seg == SegmentFirst || seg == SegmentMiddle {
			sizes = []int{int(MTU256)}
		}
		for _, n := range sizes {
			p := samplePacket(op, n)
			b, err := p.Append(nil)
			if err != nil {
				f.Fatal(err)
			}
			if err := Seal(testIPv4, testSrcPort, UDPPort, b); err != nil {
				f.Fatal(err)
			}
			f.Add(b)
		}
	}
	sentinels := []error{ErrTruncated, ErrOpcode, ErrVersion, ErrPad, ErrLength, ErrSyndrome}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if !reflect.DeepEqual(p, Packet{}) {
				t.Fatalf("got packet %+v with error %v", p, err)
			}
			n := 0
			for _, s := range sentinels {
				if errors.Is(err, s) {
					n++
				}
			}
			var pe *PacketError
			if n != 1 || !errors.As(err, &pe) {
				t.Fatalf("got %v, want a *PacketError matching one Parse sentinel", err)
			}
			return
		}
		b, err := p.Append(nil)
		if err != nil {
			t.Fatalf("re-encode of %+v: %v", p.BTH, err)
		}
		if !bytes.Equal(b, data) {
			t.Fatalf("re-encoded to\n% x\nwant\n% x", b, data)
		}
		if len(p.Payload) > MaxPayload || !p.BTH.PSN.Valid() || p.BTH.DestQP > QPNMask || p.Len() != len(data) {
			t.Fatalf("out of range: %+v, payload %d", p.BTH, len(p.Payload))
		}
		for _, m := range []MTU{MTU256, MTU1024, MTU4096} {
			if err := p.CheckPMTU(m); err != nil && !errors.Is(err, ErrPMTU) {
				t.Fatalf("CheckPMTU(%d): got %v", m, err)
			}
		}
		if err := Verify(testIPv6, testSrcPort, UDPPort, data); err != nil && !errors.Is(err, ErrICRC) {
			t.Fatalf("Verify: got %v", err)
		}
		if id, ok := RecoverIPv4ID(testIPv4, testSrcPort, UDPPort, data); ok {
			ip := testIPv4
			ip.ID = id
			if err := Verify(ip, testSrcPort, UDPPort, data); err != nil {
				t.Fatalf("recovered ID %#04x does not verify: %v", id, err)
			}
		}
	})
}
