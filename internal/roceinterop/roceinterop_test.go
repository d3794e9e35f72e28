package roceinterop

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vrdma/vrdma/internal/pcapfile"
	"github.com/vrdma/vrdma/internal/pftexchange"
)

func TestParseJob(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want Job
		ok   bool
	}{
		{"write_bw:65536:200", Job{pftexchange.WriteBW, 65536, 200}, true},
		{"atomic_bw:8:100", Job{pftexchange.AtomicBW, 8, 100}, true},
		{"write_lat:64:5", Job{pftexchange.WriteLat, 64, 5}, true},
		{"atomic_bw:16:100", Job{}, false},
		{"read_lat:64:100", Job{}, false},
		{"write_bw:65536:4", Job{}, false},
		{"write_bw:0:10", Job{}, false},
		{"write_bw:65536:100000", Job{}, false}, // beyond MaxJobBytes
		{"write_bw:65536", Job{}, false},
	} {
		got, err := ParseJob(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseJob(%q) = %+v, %v; want %+v, ok %t", tt.in, got, err, tt.want, tt.ok)
		}
		if tt.ok && got.String() != tt.in {
			t.Errorf("String() = %q, want %q", got.String(), tt.in)
		}
	}
}

// rxeCaptures are Linux rxe's own frames (TestRxeCapture records them).
const rxeCaptures = "../../backend/rdma/roce/testdata/rxe"

func TestReadCaptureRxe(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(rxeCaptures, "ipv4-*.pcap"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no rxe captures in %s: %v", rxeCaptures, err)
	}
	for _, f := range files {
		frames, err := ReadCapture(f)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(f), err)
		}
		if len(frames) == 0 {
			t.Fatalf("%s: no RoCE frames", filepath.Base(f))
		}
		for _, fr := range frames {
			if !fr.Src.Is4() || !fr.Dst.Is4() || fr.IPv6 {
				t.Fatalf("%s: frame %s→%s", filepath.Base(f), fr.Src, fr.Dst)
			}
		}
	}
}

func TestReadCaptureBadICRC(t *testing.T) {
	src := filepath.Join(rxeCaptures, "ipv4-write_bw-4096.pcap")
	hdr, pkts, err := pcapfile.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	// Flip a payload byte of the first RoCE frame: its ICRC no longer
	// matches.
	for i := range pkts {
		if _, ok, _ := parseFrame(pkts[i]); ok {
			pkts[i].Data[len(pkts[i].Data)-8] ^= 0x40
			break
		}
	}
	out := filepath.Join(t.TempDir(), "bad.pcap")
	w, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	pw, err := pcapfile.NewWriter(w, hdr.SnapLen, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pkts {
		if err := pw.WritePacket(p); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()
	if _, err := ReadCapture(out); !errors.Is(err, ErrICRC) {
		t.Fatalf("got %v, want ErrICRC", err)
	}
}
