package pcapfile

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// FuzzReader: any input either fails cleanly (an error, never a packet
// with it) or yields records within the header's bounds, and what it
// yields writes back and reads again to the same records.
func FuzzReader(f *testing.F) {
	f.Add(write(f, 0, false, packets()))
	f.Add(write(f, 128, true, packets()[1:]))
	f.Add([]byte{0xa1, 0xb2, 0x3c, 0x4d, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 1,
		0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0xab, 0xcd})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			if r != nil {
				t.Fatalf("NewReader: a reader with %v", err)
			}
			return
		}
		h := r.Header()
		if h.SnapLen == 0 || h.SnapLen > MaxSnapLen || h.LinkType != LinkTypeEthernet {
			t.Fatalf("accepted header %+v", h)
		}
		var ps []Packet
		total := 24
		for {
			p, err := r.Next()
			if err != nil {
				if p.Data != nil || p.OrigLen != 0 || !p.Time.IsZero() {
					t.Fatalf("a packet with the error %v: %+v", err, p)
				}
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrFormat) {
					t.Fatalf("unexpected error %v", err)
				}
				if errors.Is(err, io.EOF) && total != len(b) {
					t.Fatalf("io.EOF after %d of %d bytes", total, len(b))
				}
				break
			}
			if len(p.Data) > int(h.SnapLen) || p.OrigLen < len(p.Data) {
				t.Fatalf("record of %d bytes (frame %d) with snaplen %d", len(p.Data), p.OrigLen, h.SnapLen)
			}
			total += 16 + len(p.Data)
			ps = append(ps, p)
		}
		var out bytes.Buffer
		w, err := NewWriter(&out, h.SnapLen, h.Nanosecond)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if err := w.WritePacket(p); err != nil {
				t.Fatalf("write back %+v: %v", p, err)
			}
		}
		_, again, err := ReadAll(&out)
		if err != nil || len(again) != len(ps) {
			t.Fatalf("read back: %d of %d packets, %v", len(again), len(ps), err)
		}
		for i := range ps {
			if !again[i].Time.Equal(ps[i].Time) || !bytes.Equal(again[i].Data, ps[i].Data) || again[i].OrigLen != ps[i].OrigLen {
				t.Fatalf("packet %d: %+v, read back %+v", i, ps[i], again[i])
			}
		}
	})
}
