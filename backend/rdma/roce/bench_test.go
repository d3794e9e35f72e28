package roce

import (
	"hash/crc32"
	"testing"
)

// benchPacket is a sealed SEND_ONLY with a 4 KiB payload: 4112 bytes.
func benchPacket(b *testing.B) []byte {
	p := samplePacket(OpSendOnly, MaxPayload)
	buf, err := p.Append(nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := Seal(testIPv4, testSrcPort, UDPPort, buf); err != nil {
		b.Fatal(err)
	}
	return buf
}

// BenchmarkICRC computes the ICRC of a 4 KiB packet; compare it with
// BenchmarkCRC32Baseline over the same bytes.
func BenchmarkICRC(b *testing.B) {
	buf := benchPacket(b)
	body := buf[:len(buf)-ICRCLen]
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var sink uint32
	for b.Loop() {
		sink ^= ICRC(testIPv4, testSrcPort, UDPPort, body)
	}
	_ = sink
}

// BenchmarkCRC32Baseline is hash/crc32's IEEE CRC of the same bytes as
// BenchmarkICRC, without the pseudo header.
func BenchmarkCRC32Baseline(b *testing.B) {
	buf := benchPacket(b)
	body := buf[:len(buf)-ICRCLen]
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	var sink uint32
	for b.Loop() {
		sink ^= crc32.ChecksumIEEE(body)
	}
	_ = sink
}

// BenchmarkParseVerify is the receive path of one 4 KiB packet.
func BenchmarkParseVerify(b *testing.B) {
	buf := benchPacket(b)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(buf); err != nil {
			b.Fatal(err)
		}
		if err := Verify(testIPv4, testSrcPort, UDPPort, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendSeal is the send path of one 4 KiB packet.
func BenchmarkAppendSeal(b *testing.B) {
	p := samplePacket(OpSendOnly, MaxPayload)
	buf := make([]byte, 0, p.Len())
	b.SetBytes(int64(p.Len()))
	b.ReportAllocs()
	for b.Loop() {
		out, err := p.Append(buf[:0])
		if err != nil {
			b.Fatal(err)
		}
		if err := Seal(testIPv4, testSrcPort, UDPPort, out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRecoverIPv4ID is the fallback for a 4 KiB IPv4 packet from rxe.
func BenchmarkRecoverIPv4ID(b *testing.B) {
	buf := benchPacket(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := RecoverIPv4ID(testIPv4, testSrcPort, UDPPort, buf); !ok {
			b.Fatal("no ID")
		}
	}
}

// BenchmarkFlowICRC is BenchmarkICRC's work for a 1 KiB packet (the
// path MTU of a 1500-byte link) with the pseudo header precomputed
// (Flow), beside ICRC computing it each time.
func BenchmarkFlowICRC(b *testing.B) {
	p := samplePacket(OpWriteMiddle, 1024)
	buf, err := p.Append(nil)
	if err != nil {
		b.Fatal(err)
	}
	body := buf[:len(buf)-ICRCLen]
	for _, ip := range []IPHeader{testIPv4, testIPv6} {
		name := "v4"
		if !ip.Is4() {
			name = "v6"
		}
		b.Run(name+"-flow", func(b *testing.B) {
			f := NewFlow(ip, testSrcPort, UDPPort)
			b.SetBytes(int64(len(body)))
			var sink uint32
			for b.Loop() {
				sink ^= f.ICRC(body)
			}
			_ = sink
		})
		b.Run(name+"-icrc", func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			var sink uint32
			for b.Loop() {
				sink ^= ICRC(ip, testSrcPort, UDPPort, body)
			}
			_ = sink
		})
	}
}
