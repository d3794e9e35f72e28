package pftexchange

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// A key message as perftest 6.06 prints it (rxe, an IPv4-mapped GID).
const rxeKeys = "0000:0010:000011:a1b2c3:00001234:000055d5e0a3c000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:c8:4d:02:00000000:"

func TestParseKeys(t *testing.T) {
	m := make([]byte, KeyLen)
	copy(m, rxeKeys)
	k, err := ParseKeys(m)
	if err != nil {
		t.Fatal(err)
	}
	want := Keys{OutReads: 16, QPN: 0x11, PSN: 0xa1b2c3, RKey: 0x1234, VAddr: 0x55d5e0a3c000,
		GID: [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 200, 14: 77, 15: 2}}
	if k != want {
		t.Fatalf("got %+v, want %+v", k, want)
	}
	if got := string(trimNUL(k.Marshal())); got != rxeKeys {
		t.Fatalf("Marshal: got %q, want %q", got, rxeKeys)
	}
	for _, bad := range []string{"", "0000:0010", strings.Replace(rxeKeys, "000011", "1000011", 1), strings.Replace(rxeKeys, ":ff:", ":fff:", 1),
		strings.Replace(rxeKeys, "a1b2c3", "xyz", 1)} {
		if k, err := ParseKeys([]byte(bad)); !errors.Is(err, ErrKeys) || k != (Keys{}) {
			t.Errorf("ParseKeys(%q) = %+v, %v; want zero, ErrKeys", bad, k, err)
		}
	}
}

func FuzzParseKeys(f *testing.F) {
	f.Add([]byte(rxeKeys))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := ParseKeys(b)
		if err != nil {
			if k != (Keys{}) {
				t.Fatalf("error %v with keys %+v", err, k)
			}
			return
		}
		k2, err := ParseKeys(k.Marshal())
		if err != nil || k2 != k {
			t.Fatalf("round trip of %+v: %+v, %v", k, k2, err)
		}
	})
}

// fakePeer records the seams.
type fakePeer struct {
	connected Keys
	calls     []string
	fail      error
}

func (p *fakePeer) Connect(k Keys) error {
	p.connected = k
	p.calls = append(p.calls, "connect")
	return nil
}

func (p *fakePeer) Test(context.Context) error {
	p.calls = append(p.calls, "test")
	return p.fail
}

func TestServeRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	server := Keys{OutReads: 16, QPN: 0x100, PSN: 7, RKey: 0x5a17, VAddr: 0x7e5500000000, GID: [16]byte{10: 0xff, 11: 0xff, 12: 10}}
	client := Keys{OutReads: 16, QPN: 0x22, PSN: 9, RKey: 0x3c00, VAddr: 0x1000, GID: [16]byte{10: 0xff, 11: 0xff, 12: 11}}
	for _, tc := range []struct {
		op                  Op
		version             string
		serverCalls, client []string
	}{
		{WriteBW, "6.06", []string{"connect"}, []string{"connect", "test"}},
		{ReadBW, "5.70", []string{"connect"}, []string{"connect", "test"}},
		{AtomicBW, "5.32", []string{"connect"}, []string{"connect", "test"}},
		{SendBW, "6.06", []string{"connect", "test"}, []string{"connect", "test"}},
		{WriteLat, "6.06", []string{"connect", "test"}, []string{"connect", "test"}},
	} {
		t.Run(string(tc.op)+"-"+tc.version, func(t *testing.T) {
			a, b := tcpPair(t)
			sp, cp := &fakePeer{}, &fakePeer{}
			type out struct {
				r   Result
				err error
			}
			done := make(chan out, 1)
			go func() {
				r, err := Serve(ctx, a, tc.op, server, sp)
				done <- out{r, err}
			}()
			cr, err := Run(ctx, b, tc.op, tc.version, client, cp, Report{Size: 65536, Iters: 200})
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if tc.op != WriteLat {
				// The server writes "done" and returns; read it.
				buf := make([]byte, 5)
				if _, err := b.Read(buf); err != nil || string(buf) != "done\x00" {
					t.Fatalf("after close: %q, %v", buf, err)
				}
			}
			s := <-done
			if s.err != nil {
				t.Fatalf("Serve: %v", s.err)
			}
			if s.r.Version != tc.version || cr.Version != tc.version {
				t.Errorf("versions: server saw %q, client %q; want %q", s.r.Version, cr.Version, tc.version)
			}
			if s.r.Peer != client || cr.Peer != server || sp.connected != client || cp.connected != server {
				t.Errorf("keys: server got %+v, client got %+v", s.r.Peer, cr.Peer)
			}
			wantReport := Report{}
			if tc.op == WriteBW || tc.op == ReadBW || tc.op == AtomicBW {
				wantReport = Report{Size: 65536, Iters: 200}
			}
			if s.r.Report != wantReport {
				t.Errorf("report: got %+v, want %+v", s.r.Report, wantReport)
			}
			if strings.Join(sp.calls, ",") != strings.Join(tc.serverCalls, ",") || strings.Join(cp.calls, ",") != strings.Join(tc.client, ",") {
				t.Errorf("calls: server %v, client %v; want %v, %v", sp.calls, cp.calls, tc.serverCalls, tc.client)
			}
		})
	}
}

// tcpPair returns both ends of a loopback TCP connection (buffered, unlike
// net.Pipe: both sides write "done" at once).
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if server, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func TestServeErrors(t *testing.T) {
	ctx := context.Background()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, err := Serve(ctx, a, "read_lat", Keys{}, &fakePeer{}); !errors.Is(err, ErrOp) {
		t.Fatalf("read_lat: got %v, want ErrOp", err)
	}
	go b.Write([]byte("not a version\x00\x00\x00"))
	if _, err := Serve(ctx, a, WriteBW, Keys{}, &fakePeer{}); !errors.Is(err, ErrVersion) {
		t.Fatalf("bad version: got %v, want ErrVersion", err)
	}
}
