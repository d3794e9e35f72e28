package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// testEnv opens devices of an in-process daemon over virtio-user instead of
// virtio-pci (same verbs library; the transport is tested in guest/virtiopci).
func testEnv(t *testing.T, sock string, stdin io.Reader, out io.Writer) *env {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return &env{stdin: stdin, stdout: out, log: logrus.NewEntry(l),
		open: func(string, *logrus.Entry) (*verbs.Context, func(), error) {
			c, f, err := frontend.OpenRDMA(context.Background(), sock, 128<<20)
			if err != nil {
				return nil, nil, err
			}
			return c, func() { c.Close(); f.Close() }, nil
		}}
}

func daemonSockets(t *testing.T) []string {
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	t.Cleanup(func() { d.Close() })
	var socks []string
	for _, id := range []string{"a", "b"} {
		s := filepath.Join(t.TempDir(), id+".sock")
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: id, Socket: s}); err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
	}
	return socks
}

func TestSelftestAndProbe(t *testing.T) {
	socks := daemonSockets(t)
	var out bytes.Buffer
	if err := testEnv(t, socks[0], nil, &out).run([]string{"selftest"}); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; last != `VRDMA-RESULT {"op":"all","role":"selftest","verified":true}` {
		t.Errorf("last line %q", last)
	}
	if len(lines) < 12 {
		t.Errorf("got %d lines, want one per step:\n%s", len(lines), out.String())
	}
	out.Reset()
	if err := testEnv(t, socks[0], nil, &out).run([]string{"probe"}); err != nil || !strings.HasPrefix(out.String(), `VRDMA-RESULT {"config":`) {
		t.Errorf("probe: %v, %q", err, out.String())
	}
}

// TestServerClient relays the EXCHANGE lines of two runs as PEER lines.
func TestServerClient(t *testing.T) {
	socks := daemonSockets(t)
	t.Run("iters", func(t *testing.T) {
		serverClient(t, socks, []string{"--op", "send", "--size", "1000", "--iters", "200", "--lat-iters", "20", "--tx-depth", "8"}, 200)
	})
	// --duration: a stream of at least --iters operations, with the
	// bytes moved and the longest gap in both results.
	t.Run("duration", func(t *testing.T) {
		serverClient(t, socks, []string{"--op", "send", "--size", "1000", "--iters", "10", "--lat-iters", "20", "--tx-depth", "8", "--duration", "200ms"}, -10)
	})
}

// serverClient runs a server and a client with args and checks both
// results: verified, iters as wantIters (negative: more than -wantIters,
// and then bytes and max_gap_ms present).
func serverClient(t *testing.T, socks []string, args []string, wantIters int) {
	sIn, sInW := io.Pipe()
	cIn, cInW := io.Pipe()
	sOut, sOutW := io.Pipe()
	cOut, cOutW := io.Pipe()
	relay := func(from io.Reader, to *io.PipeWriter, res chan<- string) {
		var all []string
		sc := newLines(from)
		for line := range sc {
			all = append(all, line)
			if rest, ok := strings.CutPrefix(line, prefixExchange); ok {
				io.WriteString(to, "console noise\n"+prefixPeer+rest+"\n")
			}
		}
		res <- strings.Join(all, "\n")
	}
	sRes, cRes := make(chan string, 1), make(chan string, 1)
	go relay(sOut, cInW, sRes)
	go relay(cOut, sInW, cRes)
	errs := make(chan error, 2)
	go func() {
		errs <- testEnv(t, socks[0], sIn, sOutW).run(append([]string{"server"}, args...))
		sOutW.Close()
	}()
	go func() {
		errs <- testEnv(t, socks[1], cIn, cOutW).run(append([]string{"client"}, args...))
		cOutW.Close()
	}()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	for _, out := range []string{<-sRes, <-cRes} {
		i := strings.Index(out, guestresult.Prefix+" ")
		if i < 0 {
			t.Fatalf("no result in %q", out)
		}
		var m map[string]any
		if err := guestresult.Decode(out[i+len(guestresult.Prefix):], &m); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"op", "size", "iters", "gbytes_per_s", "mops", "lat_us_p50", "lat_us_p99", "verified", "role"} {
			if _, ok := m[k]; !ok {
				t.Errorf("result lacks %q: %s", k, out)
			}
		}
		iters, _ := m["iters"].(float64)
		if m["verified"] != true || (wantIters >= 0 && iters != float64(wantIters)) || (wantIters < 0 && iters <= float64(-wantIters)) {
			t.Errorf("got %s, want verified and iters %d", out, wantIters)
		}
		if wantIters < 0 {
			if b, _ := m["bytes"].(float64); b != (iters+20)*1000 {
				t.Errorf("got %s, want bytes (iters + lat-iters) * 1000", out)
			}
			if g, _ := m["max_gap_ms"].(float64); g <= 0 {
				t.Errorf("got %s, want max_gap_ms > 0", out)
			}
		}
	}
}

func TestErrors(t *testing.T) {
	for _, args := range [][]string{nil, {"frob"}, {"server", "--op", "x"}, {"client", "--size", "0"}, {"probe", "extra"}} {
		e := testEnv(t, "/nonexistent", nil, io.Discard)
		if err := e.run(args); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if _, err := readPeer(strings.NewReader("noise\n")); err == nil {
		t.Error("readPeer without a peer line: no error")
	}
	ep, err := readPeer(strings.NewReader("x\r\nVRDMA-PEER {\"gid\":\"fe80::1\",\"qpn\":5}\r\n"))
	if err != nil || ep.QPN != 5 {
		t.Errorf("readPeer: %+v, %v", ep, err)
	}
}

// newLines streams the lines of r.
func newLines(r io.Reader) <-chan string {
	ch := make(chan string)
	go func() {
		defer close(ch)
		var cur []byte
		b := make([]byte, 1)
		for {
			n, err := r.Read(b)
			if n == 1 {
				if b[0] == '\n' {
					ch <- string(cur)
					cur = nil
				} else {
					cur = append(cur, b[0])
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// TestResultSchema checks that the server and client lines, which print
// internal/perftest.Result, carry every key of guestresult.Result with the
// value the harnesses read.
func TestResultSchema(t *testing.T) {
	want := perftest.Result{Op: "write", Size: 4096, Iters: 7, GBytesPerS: 1.25, Mops: 0.5, LatP50: 3.5, LatP99: 9.25,
		Verified: true, LatAvg: 4, LatIters: 3, Seconds: 2, TxDepth: 8, Slots: 2, Role: "client", MaxGapMS: 12.5, Bytes: 40960}
	var b bytes.Buffer
	if err := guestresult.Write(&b, want); err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSuffix(b.String(), "\n")
	payload, ok := strings.CutPrefix(line, guestresult.Prefix+" ")
	if !ok {
		t.Fatalf("got %q, want a result line", line)
	}
	r, err := guestresult.Parse(payload)
	if err != nil {
		t.Fatal(err)
	}
	r.Raw = nil
	if !reflect.DeepEqual(r, guestresult.Result{Role: want.Role, Op: want.Op, Size: want.Size, Iters: want.Iters, GBytesPerS: want.GBytesPerS,
		Mops: want.Mops, LatP50: want.LatP50, LatP99: want.LatP99, Verified: want.Verified, MaxGapMS: want.MaxGapMS, Bytes: want.Bytes}) {
		t.Errorf("the harness reads %+v from %s", r, line)
	}
}
