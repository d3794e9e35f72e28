package pcapfile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// packets are three frames with distinct times and lengths, the last one
// captured short.
func packets() []Packet {
	t0 := time.Date(2025, 12, 3, 18, 0, 0, 123456789, time.UTC)
	return []Packet{
		{Time: t0, Data: bytes.Repeat([]byte{0xaa}, 60), OrigLen: 60},
		{Time: t0.Add(1500 * time.Microsecond), Data: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x08, 0x00}},
		{Time: t0.Add(2 * time.Second), Data: bytes.Repeat([]byte{0x55}, 100), OrigLen: 1514},
	}
}

func write(t testing.TB, snap uint32, nano bool, ps []Packet) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := NewWriter(&b, snap, nano)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if err := w.WritePacket(p); err != nil {
			t.Fatal(err)
		}
	}
	return b.Bytes()
}

func TestRoundTrip(t *testing.T) {
	for _, nano := range []bool{false, true} {
		in := packets()
		b := write(t, 0, nano, in)
		h, out, err := ReadAll(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("nano=%v: %v", nano, err)
		}
		want := Header{SnapLen: DefaultSnapLen, LinkType: LinkTypeEthernet, Nanosecond: nano,
			ByteOrder: binary.LittleEndian, VersionMajor: 2, VersionMinor: 4}
		if h != want {
			t.Errorf("nano=%v: header %+v, want %+v", nano, h, want)
		}
		if len(out) != len(in) {
			t.Fatalf("nano=%v: %d packets, want %d", nano, len(out), len(in))
		}
		for i := range in {
			wt := in[i].Time
			if !nano {
				wt = wt.Truncate(time.Microsecond)
			}
			wo := in[i].OrigLen
			if wo == 0 {
				wo = len(in[i].Data)
			}
			if !out[i].Time.Equal(wt) || !bytes.Equal(out[i].Data, in[i].Data) || out[i].OrigLen != wo {
				t.Errorf("nano=%v: packet %d = %v %x %d, want %v %x %d", nano, i,
					out[i].Time, out[i].Data, out[i].OrigLen, wt, in[i].Data, wo)
			}
			if out[i].Truncated() != (wo > len(in[i].Data)) {
				t.Errorf("nano=%v: packet %d: Truncated() = %v", nano, i, out[i].Truncated())
			}
		}
	}
}

func TestFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.pcap")
	if err := WriteFile(p, 1600, false, packets()); err != nil {
		t.Fatal(err)
	}
	h, ps, err := ReadFile(p)
	if err != nil || h.SnapLen != 1600 || len(ps) != 3 {
		t.Fatalf("ReadFile: %+v, %d packets, %v", h, len(ps), err)
	}
	if _, _, err := ReadFile(filepath.Join(t.TempDir(), "missing.pcap")); err == nil {
		t.Error("ReadFile of a missing file: no error")
	}
	if err := WriteFile(p, 10, false, packets()); !errors.Is(err, ErrTooLong) {
		t.Errorf("WriteFile with a short snapshot length: %v, want ErrTooLong", err)
	}
}

// TestText2pcap reads a file written by Wireshark 4.0's text2pcap -F pcap
// (2 frames, microsecond magic, little-endian, snaplen 262144).
func TestText2pcap(t *testing.T) {
	b := unhex(t, `d4c3b2a1 0200 0400 00000000 00000000 00000400 01000000
		bdec116b 01000000 0e000000 0e000000  ffffffffffff 525400000001 0806
		bdec116b 02000000 03000000 03000000  010203`)
	h, ps, err := ReadAll(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if h.SnapLen != MaxSnapLen || h.Nanosecond || len(ps) != 2 {
		t.Fatalf("header %+v, %d packets", h, len(ps))
	}
	const sec = 0x6b11ecbd
	if ps[0].Time != time.Unix(sec, 1000).UTC() || len(ps[0].Data) != 14 || ps[0].Data[12] != 8 || ps[0].Data[13] != 6 {
		t.Errorf("packet 1: %v %x", ps[0].Time, ps[0].Data)
	}
	if ps[1].Time != time.Unix(sec, 2000).UTC() || !bytes.Equal(ps[1].Data, []byte{1, 2, 3}) {
		t.Errorf("packet 2: %v %x", ps[1].Time, ps[1].Data)
	}
}

func TestBigEndianNanosecond(t *testing.T) {
	b := unhex(t, `a1b23c4d 0002 0004 00000000 00000000 0000ffff 00000001
		00000005 3b9ac9ff 00000002 00000040  abcd`)
	h, ps, err := ReadAll(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if h.ByteOrder != binary.BigEndian || !h.Nanosecond || h.SnapLen != 65535 || len(ps) != 1 {
		t.Fatalf("header %+v, %d packets", h, len(ps))
	}
	p := ps[0]
	if p.Time != time.Unix(5, 999999999).UTC() || !bytes.Equal(p.Data, []byte{0xab, 0xcd}) || p.OrigLen != 64 || !p.Truncated() {
		t.Errorf("packet %+v", p)
	}
	// The same file big-endian with the microsecond magic.
	b = unhex(t, `a1b2c3d4 0002 0004 00000000 00000000 0000ffff 00000001
		00000005 000f423f 00000002 00000002  abcd`)
	h, ps, err = ReadAll(bytes.NewReader(b))
	if err != nil || h.Nanosecond || len(ps) != 1 || ps[0].Time != time.Unix(5, 999999000).UTC() {
		t.Fatalf("microsecond big-endian: %+v %+v %v", h, ps, err)
	}
}

func TestBadHeader(t *testing.T) {
	good := write(t, 0, false, nil)
	for _, tc := range []struct {
		name string
		mod  func(b []byte) []byte
		want error
	}{
		{"empty", func(b []byte) []byte { return nil }, ErrTruncated},
		{"short", func(b []byte) []byte { return b[:23] }, ErrTruncated},
		{"magic", func(b []byte) []byte { b[0] = 0; return b }, ErrFormat},
		{"pcapng", func(b []byte) []byte { copy(b, []byte{0x0a, 0x0d, 0x0d, 0x0a}); return b }, ErrFormat},
		{"version", func(b []byte) []byte { b[4] = 1; return b }, ErrFormat},
		{"snaplen 0", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[16:], 0); return b }, ErrFormat},
		{"snaplen huge", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[16:], MaxSnapLen+1); return b }, ErrFormat},
		{"linktype", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[20:], 113); return b }, ErrFormat},
	} {
		b := tc.mod(append([]byte(nil), good...))
		r, err := NewReader(bytes.NewReader(b))
		if !errors.Is(err, tc.want) || r != nil {
			t.Errorf("%s: NewReader = %v, %v; want %v", tc.name, r, err, tc.want)
		}
	}
	if _, err := NewReader(bytes.NewReader(good)); err != nil {
		t.Errorf("good header: %v", err)
	}
}

func TestBadRecords(t *testing.T) {
	one := write(t, 100, false, packets()[1:2]) // 24 + 16 + 14 bytes
	le := binary.LittleEndian
	for _, tc := range []struct {
		name string
		mod  func(b []byte) []byte
		want error
	}{
		{"header cut", func(b []byte) []byte { return b[:24+7] }, ErrTruncated},
		{"data cut", func(b []byte) []byte { return b[:len(b)-1] }, ErrTruncated},
		{"data missing", func(b []byte) []byte { return b[:24+16] }, ErrTruncated},
		{"incl > snaplen", func(b []byte) []byte { le.PutUint32(b[24+8:], 101); le.PutUint32(b[24+12:], 101); return b }, ErrFormat},
		{"incl huge", func(b []byte) []byte { le.PutUint32(b[24+8:], 1<<31); le.PutUint32(b[24+12:], 1<<31); return b }, ErrFormat},
		{"orig < incl", func(b []byte) []byte { le.PutUint32(b[24+12:], 13); return b }, ErrFormat},
		{"usec range", func(b []byte) []byte { le.PutUint32(b[24+4:], 1000000); return b }, ErrFormat},
	} {
		b := tc.mod(append([]byte(nil), one...))
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		p, err := r.Next()
		if !errors.Is(err, tc.want) || p.Data != nil || p.OrigLen != 0 || !p.Time.IsZero() {
			t.Errorf("%s: Next = %+v, %v; want no packet and %v", tc.name, p, err, tc.want)
		}
		// Errors stick.
		if _, err2 := r.Next(); err2 != err {
			t.Errorf("%s: second Next = %v, want %v", tc.name, err2, err)
		}
	}
	// The unmodified file: one packet, then a clean io.EOF (again and again).
	r, _ := NewReader(bytes.NewReader(one))
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("end: %v, want io.EOF", err)
		}
	}
	// ReadAll returns the packets before a bad record with the error.
	two := write(t, 100, false, packets()[:2])
	_, ps, err := ReadAll(bytes.NewReader(two[:len(two)-1]))
	if len(ps) != 1 || !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), "record 2") {
		t.Errorf("ReadAll of a cut file: %d packets, %v", len(ps), err)
	}
}

func TestWriterErrors(t *testing.T) {
	if _, err := NewWriter(io.Discard, MaxSnapLen+1, false); err == nil {
		t.Error("NewWriter above MaxSnapLen: no error")
	}
	w, err := NewWriter(io.Discard, 64, true)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1700000000, 0)
	for _, tc := range []struct {
		name string
		p    Packet
	}{
		{"too long", Packet{Time: now, Data: make([]byte, 65)}},
		{"orig < len", Packet{Time: now, Data: make([]byte, 10), OrigLen: 9}},
		{"orig negative", Packet{Time: now, Data: nil, OrigLen: -1}},
		{"before 1970", Packet{Time: time.Unix(-1, 0), Data: make([]byte, 10)}},
		{"after 2106", Packet{Time: time.Unix(1<<32, 0), Data: make([]byte, 10)}},
	} {
		if err := w.WritePacket(tc.p); err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	if err := w.WritePacket(Packet{Time: now, Data: make([]byte, 64)}); err != nil {
		t.Errorf("a packet of the snapshot length: %v", err)
	}
	if _, err := NewWriter(failWriter{}, 0, false); err == nil {
		t.Error("NewWriter on a failing writer: no error")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("no space") }

// unhex decodes hex digits, ignoring white space.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	s = strings.Join(strings.Fields(s), "")
	if len(s)%2 != 0 {
		t.Fatalf("odd hex %q", s)
	}
	b := make([]byte, len(s)/2)
	for i := range b {
		var v byte
		for _, c := range s[2*i : 2*i+2] {
			v <<= 4
			switch {
			case c >= '0' && c <= '9':
				v |= byte(c - '0')
			case c >= 'a' && c <= 'f':
				v |= byte(c - 'a' + 10)
			default:
				t.Fatalf("bad hex digit %q", c)
			}
		}
		b[i] = v
	}
	return b
}
