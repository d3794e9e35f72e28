package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
		{"--socket a --op write_lat -D 2", "", true, "latency test with a duration"},
		{"--socket a -q 2 -a -b", "", true, "several QPs, every size, both directions"},
		{"-d vm1 -i 1 -x 1 -F -s 65536 -n 2000 --report_gbits 10.77.0.1", "10.77.0.1", true, "ib_write_bw's command line"},
		{"--socket a h1 h2", "", false, "two hosts"},
		{"--socket a --sockets a,b", "", false, "both modes"},
		{"--sockets a,b host", "", false, "host without --socket"},
		{"--socket a -d vm1,vm2", "", false, "two devices for one side"},
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
			if tt.ok && (o.host != tt.host || !o.twoProc) {
				t.Errorf("got two-process %v host %q, want two-process, %q", o.twoProc, o.host, tt.host)
			}
		})
	}
}

// TestPathsBetweenHosts: --paths > 1 is spraying between hosts, so it
// needs two-process mode; out of range it is a usage error.
func TestPathsBetweenHosts(t *testing.T) {
	if _, errs, code := perf(t, "--sockets", "a,b", "--paths", "2"); code != exitUsage || !strings.Contains(errs, "spraying is between hosts") {
		t.Errorf("--sockets with --paths 2: got exit %d, %q; want %d and the between-hosts error", code, errs, exitUsage)
	}
	if _, errs, code := perf(t, "--socket", "a", "--paths", "65"); code != exitUsage || !strings.Contains(errs, "--paths 65") {
		t.Errorf("--paths 65: got exit %d, %q; want %d", code, errs, exitUsage)
	}
}

func TestExchangeMessages(t *testing.T) {
	h := hello{op: "read", verify: true, bidir: true, txDepth: 16, size: 4096, iters: 10, latIters: 5, mtu: 1024, inline: 64,
		gid: [16]byte{0xfe, 0x80, 15: 1}, rkey: 0x205, addr: 0x7000, bufSize: 65536, qps: []qpEnd{{0x11, 0x22}, {0x33, 0xffffff}}}
	kind, body, err := readMessage(bytes.NewReader(h.encode()))
	if err != nil || kind != kindHello {
		t.Fatalf("hello: kind %d, %v", kind, err)
	}
	if got, err := decodeHello(body); err != nil || got.differs(&h, "a", "b") != "" || !slices.Equal(got.qps, h.qps) ||
		got.gid != h.gid || got.rkey != h.rkey || got.addr != h.addr || got.mtu != h.mtu || got.inline != h.inline {
		t.Errorf("hello round trip: got %+v, %v; want %+v", got, err, h)
	}
	d := done{size: 4096, figures: true, iters: 7, secs: 1.5, bps: 2e9, mps: 3e5, peak: 2.5e9, p999: 9, passIters: 3, posted: []uint64{7, 8}}
	if _, body, err := readMessage(bytes.NewReader(d.encode())); err != nil {
		t.Fatal(err)
	} else if got, err := decodeDone(body); err != nil || got.size != d.size || got.secs != d.secs || got.peak != d.peak ||
		got.p999 != d.p999 || got.passIters != 3 || !slices.Equal(got.posted, d.posted) || !got.figures || got.latDuration {
		t.Errorf("done round trip: got %+v, %v; want %+v", got, err, d)
	}
	if _, body, err := readMessage(bytes.NewReader(ready{size: 77}.encode())); err != nil {
		t.Fatal(err)
	} else if got, err := decodeReady(body); err != nil || got.size != 77 {
		t.Errorf("ready round trip: got %+v, %v", got, err)
	}
	f := fin{text: strings.Repeat("é", 600)} // cut to 1024 bytes of whole runes
	_, body, err = readMessage(bytes.NewReader(f.encode()))
	if gf, err2 := decodeFin(body); err != nil || err2 != nil || gf.ok || gf.text != strings.Repeat("é", 512) {
		t.Errorf("fin round trip: got %+v, %v %v", gf, err, err2)
	}

	bad := func(b []byte, mut func([]byte) []byte) []byte { return mut(slices.Clone(b)) }
	hb, db := h.encode(), d.encode()
	for name, b := range map[string][]byte{
		"garbage":         []byte("GET / HTTP/1.1\r\n\r\n"),
		"version 1":       bad(hb, func(b []byte) []byte { b[4] = 1; return b }),
		"kind":            bad(hb, func(b []byte) []byte { b[5] = 9; return b }),
		"too long":        bad(hb, func(b []byte) []byte { b[10] = 0xff; return b }),
		"truncated":       bad(hb, func(b []byte) []byte { return b[:40] }),
		"hello op":        bad(hb, func(b []byte) []byte { b[headerLen] = 7; return b }),
		"hello flags":     bad(hb, func(b []byte) []byte { b[headerLen+1] = 0x80; return b }),
		"hello reserved":  bad(hb, func(b []byte) []byte { b[headerLen+2] = 1; return b }),
		"hello qpn":       bad(hb, func(b []byte) []byte { b[headerLen+helloLen+3] = 1; return b }),
		"hello qp count":  bad(hb, func(b []byte) []byte { b[headerLen+60] = 3; return b }),
		"hello no qps":    bad(hb, func(b []byte) []byte { b[headerLen+60] = 0; return b[:headerLen+helloLen] }),
		"done NaN":        bad(db, func(b []byte) []byte { copy(b[headerLen+24:], []byte{0, 0, 0, 0, 0, 0, 0xf8, 0x7f}); return b }),
		"done negative":   bad(db, func(b []byte) []byte { b[headerLen+24+7] = 0xbf; return b }),
		"done flags":      bad(db, func(b []byte) []byte { b[headerLen+8] = 4; return b }),
		"done count":      bad(db, func(b []byte) []byte { b[headerLen+12] = 9; return b }),
		"ready too short": append(append([]byte(exchangeMagic), 2, kindReady, 0, 0, 4, 0, 0, 0), 1, 2, 3, 4),
	} {
		kind, body, err := readMessage(bytes.NewReader(b))
		if err == nil {
			switch kind {
			case kindHello:
				_, err = decodeHello(body)
			case kindDone:
				_, err = decodeDone(body)
			case kindReady:
				_, err = decodeReady(body)
			}
		}
		if !errors.Is(err, errMalformed) {
			t.Errorf("%s: got %v, want %v", name, err, errMalformed)
		}
	}
	if d := h.differs(&hello{op: "write", qps: h.qps[:1]}, "client", "server"); !strings.Contains(d, "--op read on the client, write on the server") || !strings.Contains(d, "-q 2 on the client, 1 on the server") {
		t.Errorf("differs: got %q", d)
	}
}

// FuzzReadMessage: any bytes decode to a well-formed message or to an
// error with nothing else, and a message re-encodes to its input.
func FuzzReadMessage(f *testing.F) {
	h := hello{op: "write", size: 8, iters: 5, latIters: 1, txDepth: 1, qps: []qpEnd{{1, 2}}}
	f.Add(h.encode())
	f.Add((&fin{ok: true, text: "x"}).encode())
	f.Add(ready{size: 8}.encode())
	f.Add((&done{size: 8, posted: []uint64{5}}).encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		kind, body, err := readMessage(bytes.NewReader(b))
		if err != nil {
			if kind != 0 || body != nil {
				t.Errorf("error %v with kind %d and a body", err, kind)
			}
			return
		}
		var re []byte
		switch kind {
		case kindHello:
			got, err := decodeHello(body)
			if err != nil {
				if got.qps != nil || got.op != "" {
					t.Errorf("error %v with a non-zero hello %+v", err, got)
				}
				return
			}
			re = got.encode()
		case kindDone:
			got, err := decodeDone(body)
			if err != nil {
				return
			}
			re = got.encode()
		case kindReady:
			got, err := decodeReady(body)
			if err != nil {
				return
			}
			re = got.encode()
		case kindFin:
			got, err := decodeFin(body)
			if err != nil {
				return
			}
			re = got.encode()
		}
		if !bytes.Equal(re, b[:headerLen+len(body)]) {
			t.Errorf("kind %d re-encodes to %x, want %x", kind, re, b[:headerLen+len(body)])
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

// pair runs a server on socks[1] and a client on socks[0] with args and
// waits for both; it fails t when either fails.
func pair(t *testing.T, bin string, socks []string, args ...string) (cli, srv *proc) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	port := freePort(t)
	common := append([]string{"-p", port}, args...)
	srv = start(t, ctx, bin, append([]string{"--socket", socks[1]}, common...)...)
	cli = start(t, ctx, bin, append(append([]string{"--socket", socks[0]}, common...), "127.0.0.1")...)
	for _, p := range []struct {
		name string
		p    *proc
	}{{"client", cli}, {"server", srv}} {
		if err := <-p.p.done; err != nil {
			t.Fatalf("%s %q: %v\nstdout:\n%s\nstderr:\n%s", p.name, args, err, p.p.out.String(), p.p.errout.String())
		}
	}
	return cli, srv
}

// TestTwoProcesses runs a server and a client process against one
// in-process vrdmad with two devices: every bandwidth and latency test,
// -D, -b, -a and -q, verified on both sides.
func TestTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs vrdma-perf processes")
	}
	bin := buildPerf(t)
	socks := startDaemon(t)
	for _, tc := range []struct {
		op, size string
		extra    []string
		iters    int // the JSON's, 0: not checked (-D)
	}{
		{"write", "4K", nil, 200}, {"send", "4K", nil, 200}, {"read", "4K", nil, 200}, {"atomic", "8", nil, 200},
		{"write", "1K", []string{"-q", "3", "-b"}, 200}, {"send", "3000", []string{"-b", "-q", "2"}, 200},
		{"write_lat", "64", nil, 200}, {"send_lat", "100", nil, 200}, {"read_lat", "4K", nil, 200}, {"atomic_lat", "8", nil, 200},
		{"write", "4K", []string{"-D", "1s"}, 0}, {"send", "4K", []string{"-D", "1s"}, 0},
		{"write_lat", "8", []string{"-D", "1s"}, 0}, {"send_lat", "8", []string{"-D", "1s"}, 0}, {"read_lat", "8", []string{"-D", "1s"}, 0},
	} {
		name := strings.Join(append([]string{tc.op, tc.size}, tc.extra...), " ")
		t.Run(name, func(t *testing.T) {
			args := append([]string{"--op", tc.op, "-s", tc.size, "--lat-iters", "20", "--json"}, tc.extra...)
			if tc.iters != 0 {
				args = append(args, "-n", strconv.Itoa(tc.iters), "--verify")
			}
			cli, srv := pair(t, bin, socks, args...)
			var rc result
			for _, p := range []struct {
				name string
				p    *proc
			}{{"client", cli}, {"server", srv}} {
				var r result
				if err := json.Unmarshal(p.p.out.Bytes(), &r); err != nil {
					t.Fatalf("%s: output %q: %v", p.name, p.p.out.String(), err)
				}
				size, _ := strconv.ParseUint(strings.TrimSuffix(tc.size, "K"), 10, 64)
				if strings.HasSuffix(tc.size, "K") {
					size <<= 10
				}
				wantOp := tc.op
				if r.Op != wantOp || r.Size != size || r.Role != p.name || r.GBytesPerS <= 0 || r.Mops <= 0 || r.Verified != (tc.iters != 0) {
					t.Errorf("%s: got %s, want op %s, %d bytes, role %s, verified %v", p.name, p.p.out.String(), wantOp, size, p.name, tc.iters != 0)
				}
				if tc.iters != 0 && r.Iters != tc.iters*qpsOf(tc.extra) {
					t.Errorf("%s: %d iterations, want %d", p.name, r.Iters, tc.iters*qpsOf(tc.extra))
				}
				if !strings.HasSuffix(tc.op, "_lat") && (r.LatP50 <= 0 || r.LatIters != 20) {
					t.Errorf("%s: latency pass %+v, want 20 operations", p.name, r)
				}
				// --verify says what each side checked, on standard error
				// beside the JSON.
				if tc.iters != 0 && !strings.Contains(p.p.errout.String(), "verified") {
					t.Errorf("%s: stderr %q says nothing verified", p.name, p.p.errout.String())
				}
				if p.name == "client" {
					rc = r
				} else if r.GBytesPerS != rc.GBytesPerS || r.Iters != rc.Iters {
					t.Errorf("server printed %+v, client %+v: want the client's figures", r, rc)
				}
			}
		})
	}
	t.Run("table", func(t *testing.T) {
		cli, srv := pair(t, bin, socks, "--op", "write", "-n", "5", "-a", "--verify")
		for _, p := range []*proc{cli, srv} {
			out := p.out.String()
			if !strings.Contains(out, "Data ex. method : Ethernet") || len(rows(out)) != maxAllShift || !strings.Contains(out, "remote address: LID") {
				t.Errorf("got %q, want perftest's table with an Ethernet exchange and a row per size", out)
			}
			if !regexp.MustCompile(`(?m)^verified( by the server)?: [0-9]+ responder buffers of 2 … 8388608 B`).MatchString(out) {
				t.Errorf("got %q, want what the server verified", out)
			}
		}
		// Both sides print the client's figures, the peak too.
		if c, s := rows(cli.out.String()), rows(srv.out.String()); !slices.Equal(c, s) {
			t.Errorf("client rows %q, server rows %q", c, s)
		}
		// The peak is filled in. A small message may round to 0.00 on a
		// loaded machine (2 B every 0.4 ms is 0.005 MB/s); the largest
		// cannot without a hang.
		rs := rows(cli.out.String())
		for i, r := range rs {
			f := strings.Fields(r)
			peak, err1 := strconv.ParseFloat(f[2], 64)
			_, err2 := strconv.ParseFloat(f[3], 64)
			switch {
			case err1 != nil || err2 != nil:
				t.Errorf("row %q: BW peak and average are not numbers", r)
			case i == len(rs)-1 && peak == 0:
				t.Errorf("row %q: no BW peak", r)
			}
		}
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
	t.Run("peer gone", func(t *testing.T) {
		// The client dies mid-run: the server, asleep until the client is
		// done, hears the connection close and fails at once.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		port := freePort(t)
		srv := start(t, ctx, bin, "--socket", socks[1], "-p", port, "-D", "30")
		cli := start(t, ctx, bin, "--socket", socks[0], "-p", port, "-D", "30", "127.0.0.1")
		time.Sleep(2 * time.Second)
		cli.cmd.Process.Kill()
		<-cli.done
		select {
		case err := <-srv.done:
			if err == nil || !strings.Contains(srv.errout.String(), "closed the connection") {
				t.Errorf("got %v, %q; want a failure saying the peer closed the connection", err, srv.errout.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatal("server still running 20 s after its client died")
		}
	})
}

func qpsOf(args []string) int {
	if i := slices.Index(args, "-q"); i >= 0 {
		n, _ := strconv.Atoi(args[i+1])
		return n
	}
	return 1
}

// TestDeviceByID: -d names a device by its vrdmad ID, found through the
// control API, in both modes; a -d that contradicts --socket, an unknown
// ID and an unreachable daemon are failures that say so.
func TestDeviceByID(t *testing.T) {
	socks, control := startDaemonControl(t)
	args := []string{"--control", control, "-s", "4K", "-n", "50", "--verify"}
	out, errs, code := perf(t, append(args, "-d", "a,b")...)
	if code != 0 || !strings.Contains(out, "Device         : a\n") {
		t.Errorf("-d a,b: exit %d, %s%s", code, out, errs)
	}
	if _, errs, code := perf(t, append(args, "-d", "b", "--sockets", strings.Join(socks, ","))...); code != exitFailure || !strings.Contains(errs, "the device's socket is "+socks[1]+", not "+socks[0]) {
		t.Errorf("-d b with a's socket: exit %d, %s", code, errs)
	}
	if _, errs, code := perf(t, append(args, "-d", "nope,b")...); code != exitFailure || !strings.Contains(errs, "has no device nope") {
		t.Errorf("-d nope: exit %d, %s", code, errs)
	}
	if _, errs, code := perf(t, "--control", filepath.Join(t.TempDir(), "none.sock"), "-d", "a,b"); code != exitFailure || !strings.Contains(errs, "--control") {
		t.Errorf("no daemon: exit %d, %s", code, errs)
	}
	// The socket's own path needs no daemon.
	if out, errs, code := perf(t, "--control", "/nonexistent", "-d", socks[0], "--sockets", strings.Join(socks, ","), "-n", "50"); code != 0 {
		t.Errorf("-d as the socket path: exit %d, %s%s", code, out, errs)
	}
	if testing.Short() {
		return
	}
	// perftest's command line, one side per process, the devices by ID.
	bin := buildPerf(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	port := freePort(t)
	line := []string{"--control", control, "-p", port, "-i", "1", "-F", "-s", "65536", "-n", "200", "--report_gbits"}
	srv := start(t, ctx, bin, append([]string{"-d", "b"}, line...)...)
	cli := start(t, ctx, bin, append(append([]string{"-d", "a"}, line...), "127.0.0.1")...)
	for _, p := range []*proc{cli, srv} {
		if err := <-p.done; err != nil {
			t.Fatalf("%v: %s", err, p.errout.String())
		}
		if out := p.out.String(); len(rows(out)) != 1 || !strings.Contains(out, "BW average[Gb/sec]") {
			t.Errorf("got %q, want a Gb/sec table with one row", out)
		}
	}
	if !strings.Contains(cli.out.String(), "Device         : a\n") || !strings.Contains(srv.out.String(), "Device         : b\n") {
		t.Errorf("the tables do not name the devices a and b:\n%s\n%s", cli.out.String(), srv.out.String())
	}
}
