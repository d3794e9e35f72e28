package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseTwoProc(t *testing.T) {
	tests := []struct {
		args, host string
		ok         bool
		comment    string
	}{
		{"--socket a --op write --verify", "", true, "server"},
		{"--socket a -p 9000 --op send 127.0.0.1", "127.0.0.1", true, "client, HOST last"},
		{"--socket a 10.0.0.1 --op read -s 4K", "10.0.0.1", true, "client, HOST first"},
		{"--socket a --paths 64", "", true, "paths accepted"},
		{"--socket a h1 h2", "", false, "two hosts"},
		{"--socket a --sockets a,b", "", false, "both modes"},
		{"--sockets a,b host", "", false, "host without --socket"},
		{"--socket a --op write_lat", "", false, "latency test"},
		{"--socket a -q 2", "", false, "several QPs"},
		{"--socket a -D 1", "", false, "duration"},
		{"--socket a -a", "", false, "all sizes"},
		{"--socket a -p 0", "", false, "port 0"},
		{"--socket a --paths 0", "", false, "paths 0"},
		{"--sockets a,b --paths 65", "", false, "paths 65"},
		{"", "", false, "no socket at all"},
	}
	for _, tt := range tests {
		t.Run(tt.comment, func(t *testing.T) {
			o, err := parseFlags(strings.Fields(tt.args))
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
			if tt.ok && (o.host != tt.host || o.socket != "a") {
				t.Errorf("got socket %q host %q, want a, %q", o.socket, o.host, tt.host)
			}
		})
	}
}

// TestPathsBetweenHosts: --paths > 1 is spraying between hosts, so it
// needs two-process mode; out of range it is a usage error.
func TestPathsBetweenHosts(t *testing.T) {
	if _, errs, code := perf(t, "--sockets", "a,b", "--paths", "2"); code != exitFailure || !strings.Contains(errs, "spraying is between hosts") {
		t.Errorf("--sockets with --paths 2: got exit %d, %q; want %d and the between-hosts error", code, errs, exitFailure)
	}
	if _, errs, code := perf(t, "--socket", "a", "--paths", "65"); code != exitUsage || !strings.Contains(errs, "--paths 65") {
		t.Errorf("--paths 65: got exit %d, %q; want %d", code, errs, exitUsage)
	}
}

func TestExchangeMessages(t *testing.T) {
	h := hello{op: "read", verify: true, txDepth: 16, size: 4096, iters: 10, latIters: 5, qpn: 0x11, gid: [16]byte{0xfe, 0x80, 15: 1},
		rkey: 0x205, addr: 0x7000, bufSize: 65536}
	got, err := readHello(bytes.NewReader(h.encode()))
	if err != nil || got != h {
		t.Errorf("hello round trip: got %+v, %v; want %+v", got, err, h)
	}
	f := fin{reason: strings.Repeat("é", 400)} // cut to 512 bytes of whole runes
	gf, err := readFin(bytes.NewReader(f.encode()))
	if err != nil || gf.ok || gf.reason != strings.Repeat("é", 256) {
		t.Errorf("fin round trip: got %+v, %v", gf, err)
	}
	bad := func(mut func([]byte) []byte) []byte { return mut(h.encode()) }
	for name, b := range map[string][]byte{
		"garbage":   []byte("GET / HTTP/1.1\r\n\r\n"),
		"version":   bad(func(b []byte) []byte { b[4] = 2; return b }),
		"kind":      bad(func(b []byte) []byte { b[5] = 9; return b }),
		"too long":  bad(func(b []byte) []byte { b[9] = 0xff; return b }),
		"truncated": bad(func(b []byte) []byte { return b[:40] }),
		"op":        bad(func(b []byte) []byte { b[headerLen] = 7; return b }),
		"reserved":  bad(func(b []byte) []byte { b[headerLen+2] = 1; return b }),
		"qpn":       bad(func(b []byte) []byte { b[headerLen+35] = 1; return b }),
	} {
		if _, err := readHello(bytes.NewReader(b)); !errors.Is(err, errMalformed) {
			t.Errorf("%s: got %v, want %v", name, err, errMalformed)
		}
	}
}

func FuzzReadHello(f *testing.F) {
	h := hello{op: "write", size: 8, iters: 5, latIters: 1, txDepth: 1}
	f.Add(h.encode())
	f.Add((&fin{ok: true}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := readHello(bytes.NewReader(b))
		if err != nil && got != (hello{}) {
			t.Errorf("error %v with a non-zero hello %+v", err, got)
		}
		if err == nil && !bytes.Equal(got.encode(), b[:headerLen+helloLen]) {
			t.Errorf("hello %+v does not re-encode to its input", got)
		}
	})
}

// buildPerf builds vrdma-perf into a temporary directory of t.
func buildPerf(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vrdma-perf")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build vrdma-perf: %v: %s", err, out)
	}
	return bin
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

type proc struct {
	cmd         *exec.Cmd
	out, errout bytes.Buffer
	done        chan error
}

func start(t *testing.T, ctx context.Context, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.CommandContext(ctx, bin, args...), done: make(chan error, 1)}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	return p
}

// TestTwoProcesses runs a server and a client process against one
// in-process vrdmad with two devices.
func TestTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs vrdma-perf processes")
	}
	bin := buildPerf(t)
	socks := startDaemon(t)
	for _, op := range []string{"write", "send", "read", "atomic"} {
		t.Run(op, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			port := freePort(t)
			common := []string{"-p", port, "--op", op, "-s", "4K", "-n", "200", "-t", "16", "--lat-iters", "20", "--verify", "--json"}
			srv := start(t, ctx, bin, append([]string{"--socket", socks[1]}, common...)...)
			cli := start(t, ctx, bin, append(append([]string{"--socket", socks[0]}, common...), "127.0.0.1")...)
			for _, p := range []struct {
				name string
				p    *proc
			}{{"client", cli}, {"server", srv}} {
				if err := <-p.p.done; err != nil {
					t.Fatalf("%s: %v: %s", p.name, err, p.p.errout.String())
				}
				var r result
				if err := json.Unmarshal(p.p.out.Bytes(), &r); err != nil {
					t.Fatalf("%s: output %q: %v", p.name, p.p.out.String(), err)
				}
				size := uint64(4096)
				if op == "atomic" {
					size = 8
				}
				if r.Op != op || r.Size != size || r.Iters != 200 || !r.Verified || r.Role != p.name || r.GBytesPerS <= 0 || r.LatP50 <= 0 {
					t.Errorf("%s: got %s, want op %s, %d bytes, 200 iterations, verified, role %s", p.name, p.p.out.String(), op, size, p.name)
				}
			}
		})
	}
	t.Run("table", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		port := freePort(t)
		srv := start(t, ctx, bin, "--socket", socks[1], "-p", port, "--op", "write", "-n", "50", "-s", "1K")
		cli := start(t, ctx, bin, "--socket", socks[0], "-p", port, "--op", "write", "-n", "50", "-s", "1K", "127.0.0.1")
		for _, p := range []*proc{cli, srv} {
			if err := <-p.done; err != nil {
				t.Fatalf("%v: %s", err, p.errout.String())
			}
			out := p.out.String()
			if !strings.Contains(out, "Data ex. method : Ethernet") || len(rows(out)) != 1 || !strings.Contains(out, "remote address: LID") {
				t.Errorf("got %q, want perftest's table with an Ethernet exchange and one row", out)
			}
		}
		t.Logf("client:\n%s", cli.out.String())
	})
	t.Run("different tests", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		port := freePort(t)
		srv := start(t, ctx, bin, "--socket", socks[1], "-p", port, "--op", "write", "-n", "50")
		cli := start(t, ctx, bin, "--socket", socks[0], "-p", port, "--op", "read", "-n", "50", "127.0.0.1")
		for _, p := range []*proc{srv, cli} {
			if err := <-p.done; err == nil || !strings.Contains(p.errout.String(), "different test: --op") {
				t.Errorf("got %v, %q; want a failure naming --op", err, p.errout.String())
			}
		}
	})
	t.Run("malformed peer", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		port := freePort(t)
		srv := start(t, ctx, bin, "--socket", socks[1], "-p", port, "--verify")
		var conn net.Conn
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var err error
			if conn, err = net.Dial("tcp", "127.0.0.1:"+port); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("server never listened: %v: %s", err, srv.errout.String())
			}
		}
		defer conn.Close()
		conn.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		select {
		case err := <-srv.done:
			if err == nil || !strings.Contains(srv.errout.String(), "malformed peer message: bad magic") {
				t.Errorf("got %v, %q; want a non-zero exit and a malformed-peer error", err, srv.errout.String())
			}
		case <-time.After(2 * exchangeTimeout):
			t.Fatalf("server still running %v after garbage", 2*exchangeTimeout)
		}
	})
}
