package perftest

import (
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// open starts an in-process daemon with two devices and opens both.
func open(t *testing.T) (a, b *verbs.Context) {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	t.Cleanup(func() { d.Close() })
	dir := t.TempDir()
	var ctxs []*verbs.Context
	for _, id := range []string{"a", "b"} {
		s := filepath.Join(dir, id+".sock")
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: id, Socket: s}); err != nil {
			t.Fatal(err)
		}
		c, f, err := frontend.OpenRDMA(context.Background(), s, 256<<20)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close(); f.Close() })
		ctxs = append(ctxs, c)
	}
	return ctxs[0], ctxs[1]
}

// TestServerClient runs every operation with the two sides as separate
// goroutines that share nothing but the endpoints (marshalled as JSON),
// the server starting late so the client's hello must retry.
func TestServerClient(t *testing.T) {
	ca, cb := open(t)
	for _, tc := range []struct {
		op   string
		size uint64
	}{{"write", 4096}, {"write", 100000}, {"read", 65536}, {"send", 1000}, {"atomic", 8}} {
		t.Run(tc.op, func(t *testing.T) {
			cfg := Config{Op: tc.op, Size: tc.size, Iters: 300, LatIters: 50, TxDepth: 16, Verify: true, Timeout: 20 * time.Second}
			srv, err := NewSide(ca, cfg, true)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			cli, err := NewSide(cb, cfg, false)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			relay := func(e Endpoint) Endpoint {
				b, _ := json.Marshal(e)
				var out Endpoint
				if err := json.Unmarshal(b, &out); err != nil {
					t.Fatal(err)
				}
				return out
			}
			se, ce := relay(srv.Endpoint()), relay(cli.Endpoint())
			type res struct {
				r   Result
				err error
			}
			ch := make(chan res, 1)
			go func() {
				time.Sleep(200 * time.Millisecond) // the client's hello finds no RTR QP
				r, err := srv.Serve(ce)
				ch <- res{r, err}
			}()
			cr, err := cli.Run(se)
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			sr := <-ch
			if sr.err != nil {
				t.Fatalf("server: %v", sr.err)
			}
			for _, r := range []Result{cr, sr.r} {
				if !r.Verified || r.Op != tc.op || r.Iters != 300 || r.LatIters != 50 || r.GBytesPerS <= 0 || r.LatP50 <= 0 {
					t.Errorf("%s: got %+v", r.Role, r)
				}
			}
			if sr.r.Role != "server" || cr.Role != "client" || sr.r.GBytesPerS != cr.GBytesPerS {
				t.Errorf("server %+v, client %+v", sr.r, cr)
			}
		})
	}
}

func TestConfigAndMessages(t *testing.T) {
	for _, c := range []Config{{Op: "frob", Size: 1, Iters: 1}, {Op: "write", Size: 0, Iters: 1}, {Op: "write", Size: 8, Iters: 0}, {Op: "write", Size: 8, Iters: 1, TxDepth: 5000}} {
		if err := c.fill(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
	m := message{kind: kindDone, op: 2, count: 7, size: 8, gbps: 1.5, p99: 3.25, iters: 5, latIter: 2, reason: "x"}
	b := make([]byte, ctrlSize)
	m.encode(b)
	got, err := decode(b)
	if err != nil || got != m {
		t.Errorf("round trip: got %+v, %v, want %+v", got, err, m)
	}
	if _, err := decode(make([]byte, ctrlSize)); err == nil {
		t.Error("a message without magic decoded")
	}
	if _, err := (Endpoint{GID: "nope"}).gid(); err == nil {
		t.Error("a bad GID parsed")
	}
}

func TestPattern(t *testing.T) {
	// The pattern is defined byte by byte; Pattern and PatternOK copy
	// and compare it block by block.
	for _, n := range []int{1, 255, 256, 257, 4096 + 3, 1<<16 + 700} {
		for _, op := range []uint64{0, 1, 42, 1<<40 + 3} {
			b := make([]byte, n)
			Pattern(b, op)
			for j := range b {
				if want := byte(op*131+7) + byte(j) + byte(j>>8)*3; b[j] != want {
					t.Fatalf("%d bytes, operation %d: byte %d is %d, want %d", n, op, j, b[j], want)
				}
			}
		}
	}
	for _, n := range []int{1, 255, 256, 4096 + 3} {
		b := make([]byte, n)
		Pattern(b, 42)
		if !PatternOK(b, 42) {
			t.Fatalf("%d bytes: PatternOK rejects Pattern's own bytes", n)
		}
		if PatternOK(b, 43) {
			t.Errorf("%d bytes: operation 42's pattern passes for 43", n)
		}
		b[n-1]++
		if PatternOK(b, 42) {
			t.Errorf("%d bytes: a changed last byte passes", n)
		}
		b[n-1]--
		b[0] ^= 0x80
		if PatternOK(b, 42) {
			t.Errorf("%d bytes: a changed first byte passes", n)
		}
	}
}

// BenchmarkPattern: filling and checking a 64 KiB message, which every
// operation of a --verify run does.
func BenchmarkPattern(b *testing.B) {
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for i := range b.N {
		Pattern(buf, uint64(i))
		if !PatternOK(buf, uint64(i)) {
			b.Fatal("PatternOK rejects Pattern's bytes")
		}
	}
}

// TestDurationStream runs a duration-bound stream: the client goes on past
// Iters until Duration has passed, the server of a send stream takes the
// client's done message from a data buffer, and both report the bytes
// moved and the longest gap between completions.
func TestDurationStream(t *testing.T) {
	ca, cb := open(t)
	for _, op := range []string{"write", "send"} {
		t.Run(op, func(t *testing.T) {
			const dur = 300 * time.Millisecond
			cfg := Config{Op: op, Size: 4096, Iters: 1, LatIters: 5, TxDepth: 8, Verify: true, Timeout: 20 * time.Second, Duration: dur}
			srv, err := NewSide(ca, cfg, true)
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Close()
			cli, err := NewSide(cb, cfg, false)
			if err != nil {
				t.Fatal(err)
			}
			defer cli.Close()
			type res struct {
				r   Result
				err error
			}
			ch := make(chan res, 1)
			ce := cli.Endpoint()
			go func() {
				r, err := srv.Serve(ce)
				ch <- res{r, err}
			}()
			cr, err := cli.Run(srv.Endpoint())
			if err != nil {
				t.Fatalf("client: %v", err)
			}
			sr := <-ch
			if sr.err != nil {
				t.Fatalf("server: %v", sr.err)
			}
			if !cr.Verified || !sr.r.Verified {
				t.Errorf("verified: client %v, server %v", cr.Verified, sr.r.Verified)
			}
			if cr.Seconds < dur.Seconds() || cr.Iters <= 1 {
				t.Errorf("client ran %d operations in %.3f s, want more than Iters for at least %v", cr.Iters, cr.Seconds, dur)
			}
			want := uint64(cr.Iters+cr.LatIters) * cfg.Size
			if cr.Bytes != want || sr.r.Bytes != want {
				t.Errorf("bytes: client %d, server %d, want %d", cr.Bytes, sr.r.Bytes, want)
			}
			if cr.MaxGapMS <= 0 {
				t.Errorf("client max_gap_ms %v, want > 0", cr.MaxGapMS)
			}
			if (op == "send") != (sr.r.MaxGapMS > 0) {
				t.Errorf("server max_gap_ms %v for %s, want > 0 for send only", sr.r.MaxGapMS, op)
			}
		})
	}
}

func TestDurationConfig(t *testing.T) {
	for _, c := range []Config{
		{Op: "write", Size: 8, Iters: 1, Duration: -time.Second},
		{Op: "write", Size: 8, Iters: 1, Duration: MaxDuration + 1},
		{Op: "send", Size: ctrlSize - 1, Iters: 1, Duration: time.Second},
	} {
		if err := c.fill(); err == nil {
			t.Errorf("%+v: accepted", c)
		}
	}
	for _, c := range []Config{
		{Op: "send", Size: ctrlSize, Iters: 1, Duration: time.Second},
		{Op: "send", Size: 8, Iters: 1}, // no stream: any size
		{Op: "write", Size: 8, Iters: 1, Duration: time.Second},
	} {
		if err := c.fill(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

func TestGapMeter(t *testing.T) {
	var g gapMeter
	t0 := time.Unix(100, 0)
	g.start(t0)
	for _, d := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 7 * time.Millisecond, 8 * time.Millisecond} {
		g.mark(t0.Add(d))
	}
	if got := g.ms(); got != 4 {
		t.Errorf("got %v ms, want 4 (between 1 ms and 5 ms)", got)
	}
}
