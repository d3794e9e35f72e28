// Command vrdma-perf measures a vrdma device pair the way perftest measures
// an RNIC: it opens two virtio-user devices on a running vrdmad (one
// front-end per socket), connects RC QP pairs and runs perftest's
// bandwidth test (ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw) or
// latency test (ib_write_lat, ib_send_lat, ib_read_lat, ib_atomic_lat).
//
// Usage:
//
//	vrdma-perf --sockets S1,S2 [--op write|read|send|atomic|write_lat|…]
//	           [-s SIZE | -a] [-n ITERS | -D SECONDS] [-q QPS] [-t TX_DEPTH]
//	           [--report_gbits] [-F] [--verify] [--json] [--paths 1]
//	vrdma-perf --socket S [-p PORT] [--op write|read|send|atomic] [-s SIZE]
//	           [-n ITERS] [-t TX_DEPTH] [--verify] [--json]        (server)
//	vrdma-perf --socket S [-p PORT] [same flags] HOST              (client)
//
// The perftest flags keep perftest's meaning and defaults, and the table
// is perftest's (the format of perftest 4.5, Debian 12's): the test
// banner, the test parameters, each QP's address, then " #bytes
// #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
// (Gb/sec with --report_gbits) or, for a latency test, t_min, t_max,
// t_typical, t_avg, t_stdev and the 99% and 99.9% percentiles in usec.
// The requester is the first socket (perftest's client), the responder
// the second.
//
// SIZE accepts 4096, 4K, 64KiB, 1M, 1G (binary multiples). With --json it
// prints, instead of the table, one object per message size on a line,
// with op, size, iters, gbytes_per_s, mops, lat_us_p50, lat_us_p99 and
// verified (internal/perftest.Result). Exit status: 0 success, 1 failure,
// 2 bad usage; --help prints the usage on standard output and exits 0.
//
// # Two processes
//
// With --socket, vrdma-perf runs one side, as perftest's ib_*_bw: without
// HOST it waits as the server on TCP port 18515 (-p), with HOST it
// connects to that server (retrying for connectTimeout) and measures. One
// RC QP pair, one message size, bandwidth tests (write, read, send,
// atomic) with a latency pass of --lat-iters operations; not -q > 1, -a,
// -D or the _lat tests. Both sides print the client's measurement; both
// exit 0 only when the run completed and, with --verify, the side that
// owns each destination buffer checked every byte (write, send: the
// server; read, atomic: the client, and the server its counter). The
// measurement core is internal/perftest's (Side.Run, Side.Serve).
//
// The exchange over TCP, bounded by exchangeTimeout per step: the client
// sends a hello, the server answers with its own hello (or a fin with
// ok=0 and the reason when the tests differ); after the run each side
// sends a fin and reads the peer's. Every message, little-endian:
//
//	0  4  magic "VRPX"
//	4  1  version (1; a different version is rejected)
//	5  1  kind: 1 hello, 2 fin
//	6  2  reserved, zero
//	8  4  body length, at most 1024
//	12 …  body
//
// A hello's body is 80 bytes: op (1 write, 2 read, 3 send, 4 atomic),
// flags (bit 0 --verify), 2 reserved, tx_depth u32, size u64, iters u64,
// lat_iters u64, QPN u32, PSN u32, GID [16], rkey u32, 4 reserved,
// buffer address u64, buffer size u64 — perftest's pingpong_dest plus the
// test's parameters, which must match the peer's. A fin's body is ok (0
// or 1) and at most 512 bytes of UTF-8 reason. Anything else is a
// malformed peer: the side reports it and exits 1.
//
// --paths N (1 … 64, two-process mode) asks the device to spray the QP
// over N paths (MODIFY_QP's PATHS: the multipath extension between vrdma
// hosts, docs/wire.md § 9; the vrdmads need several --roce-bind addresses
// for several address pairs). A peer that does not spray gets plain
// RoCEv2 from this side all the same.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/units"
)

// Exit statuses.
const (
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		usage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "vrdma-perf: %v (see vrdma-perf --help)\n", err)
		return exitUsage
	}
	do := measure
	if o.socket != "" {
		do = twoProc
	}
	if o.paths > 1 && o.socket == "" {
		err = errMultipath
	} else {
		err = do(ctx, o, stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "vrdma-perf:", err)
		return exitFailure
	}
	return 0
}

// Defaults: perftest's (perftest_parameters.h), except where noted.
const (
	defaultSizeBW    = 65536     // DEF_SIZE_BW
	defaultSizeLat   = 2         // DEF_SIZE_LAT
	atomicSize       = 8         // DEF_SIZE_ATOMIC
	defaultItersWB   = 5000      // DEF_ITERS_WB: ib_write_bw
	defaultIters     = 1000      // DEF_ITERS: every other test
	defaultTxDepthBW = 128       // DEF_TX_BW
	defaultLatIters  = 1000      // vrdma-perf's latency pass after a bandwidth test (--json)
	minIters         = 5         // MIN_ITER
	maxIters         = 100000000 // MAX_ITER
	maxTxDepth       = 4096      // a vrdma QP's largest send queue (perftest: 15000)
	maxQPs           = 1024      // a vrdma device's default QP limit (perftest: 16384)
	maxAllShift      = 23        // -a: 2^1 … 2^23 bytes, as perftest
	peakItersLimit   = 20000
)

// options are the parsed command line.
type options struct {
	sockets  []string
	op       string // write, read, send or atomic
	lat      bool   // a latency test (--op OP_lat)
	sizes    []uint64
	iters    int           // per QP; 0 with a duration
	duration time.Duration // 0 with iters
	qps      int
	txDepth  int
	latIters int // bandwidth tests with --json: the latency pass
	gbits    bool
	guestMem uint64
	verify   bool
	json     bool
	paths    int  // --paths: QP paths to spray over (only 1 today)
	gidIndex uint // -x: the local GID index (two-process mode)

	// Two-process mode (--socket): host is the server to connect to;
	// empty, this side is the server.
	socket, host string
	port         int
}

// testName is perftest's program name for o ("ib_write_bw").
func (o *options) testName() string {
	if o.lat {
		return "ib_" + o.op + "_lat"
	}
	return "ib_" + o.op + "_bw"
}

// flagDoc is one option of the usage text: its names as perftest spells
// them (short first) and an argument name.
type flagDoc struct {
	names []string
	arg   string
}

// flagDocs orders the usage text; every flag of parseFlags is here.
var flagDocs = []flagDoc{
	{[]string{"sockets"}, "S1,S2"},
	{[]string{"socket"}, "S"},
	{[]string{"p", "port"}, "PORT"},
	{[]string{"paths"}, "N"},
	{[]string{"x", "gid-index"}, "INDEX"},
	{[]string{"op"}, "OP"},
	{[]string{"s", "size"}, "SIZE"},
	{[]string{"a", "all"}, ""},
	{[]string{"n", "iters"}, "ITERS"},
	{[]string{"D", "duration"}, "SECONDS"},
	{[]string{"q", "qp"}, "QPS"},
	{[]string{"t", "tx-depth"}, "TX_DEPTH"},
	{[]string{"report_gbits"}, ""},
	{[]string{"F", "CPU-freq"}, ""},
	{[]string{"verify"}, ""},
	{[]string{"json"}, ""},
	{[]string{"lat-iters"}, "N"},
	{[]string{"guest-mem"}, "SIZE"},
	{[]string{"h", "help"}, ""},
}

// rawFlags are the flags parseFlags turns into options.
type rawFlags struct {
	sockets, op, size, duration, guestMem string
	all                                   bool
}

// newFlagSet defines the flags on o and r.
func newFlagSet(o *options, r *rawFlags) *flag.FlagSet {
	sockets, op, size, duration, guestMem, all := &r.sockets, &r.op, &r.size, &r.duration, &r.guestMem, &r.all
	fs := flag.NewFlagSet("vrdma-perf", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(sockets, "sockets", "", "the two device sockets, comma-separated: requester (perftest's client), responder (its server)")
	fs.StringVar(&o.socket, "socket", "", "two-process mode: this side's device socket; with a HOST argument the client (measures), without it the server (waits on --port)")
	for _, n := range []string{"p", "port"} {
		fs.IntVar(&o.port, n, defaultPort, "two-process mode: the TCP port of the exchange")
	}
	for _, n := range []string{"x", "gid-index"} {
		fs.UintVar(&o.gidIndex, n, 0, "two-process mode: the local GID the QP sends from (perftest's -x): 1 or more is a host address's GID on a vrdmad with --roce-bind, for a peer on another host")
	}
	fs.IntVar(&o.paths, "paths", 1, "two-process mode: spray the QP over N paths to a peer on another host (1 … 64; the multipath extension between vrdma hosts)")
	fs.StringVar(op, "op", "write", "the test: write, read, send or atomic (bandwidth, as ib_OP_bw; OP_bw is the same) or write_lat, read_lat, send_lat, atomic_lat (latency, as ib_OP_lat)")
	for _, n := range []string{"s", "size"} {
		fs.StringVar(size, n, "", "message size in bytes, K and M suffixes allowed (default 65536 for bandwidth, 2 for latency; atomic: always 8)")
	}
	for _, n := range []string{"a", "all"} {
		fs.BoolVar(all, n, false, "run every message size from 2 to 2^23 bytes (8 MiB), one table row each")
	}
	for _, n := range []string{"n", "iters"} {
		fs.IntVar(&o.iters, n, 0, "iterations per QP (default 5000 for write bandwidth, else 1000)")
	}
	for _, n := range []string{"D", "duration"} {
		fs.StringVar(duration, n, "", "run for this long instead of -n: seconds (perftest), or a Go duration such as 500ms; a quarter of it, in whole seconds, is a warm-up and a cool-down margin left out of the figures")
	}
	for _, n := range []string{"q", "qp"} {
		fs.IntVar(&o.qps, n, 1, "QP pairs (bandwidth tests), each with TX_DEPTH operations in flight")
	}
	for _, n := range []string{"t", "tx-depth"} {
		fs.IntVar(&o.txDepth, n, 0, "operations in flight per QP (default 128 for bandwidth, 1 for latency)")
	}
	fs.BoolVar(&o.gbits, "report_gbits", false, "report bandwidth in Gb/sec (10^9 bits) instead of MB/sec (2^20 bytes)")
	for _, n := range []string{"F", "CPU-freq"} {
		fs.Bool(n, false, "accepted for perftest's command lines; does nothing (vrdma-perf reads a monotonic clock, not the CPU's cycle counter)")
	}
	fs.BoolVar(&o.verify, "verify", false, "fill each source buffer with a pattern per operation and check every byte that arrived")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per message size instead of the table")
	fs.IntVar(&o.latIters, "lat-iters", defaultLatIters, "bandwidth tests with --json: operations of the latency pass that fills lat_us_p50, lat_us_p99 and lat_us_avg (0: none)")
	fs.StringVar(guestMem, "guest-mem", "", "guest memory per front-end (default: what the buffers need)")
	return fs
}

// expandShort splits clusters of perftest's boolean short flags ("-aF")
// into separate flags, which the flag package needs.
func expandShort(args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		if len(a) > 2 && a[0] == '-' && a[1] != '-' && strings.Trim(a[1:], "aF") == "" {
			for _, c := range a[1:] {
				out = append(out, "-"+string(c))
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

// parseFlags turns the command line into options; flag.ErrHelp for -h.
func parseFlags(args []string) (options, error) {
	o := options{}
	var r rawFlags
	fs := newFlagSet(&o, &r)
	var pos []string // positional arguments, which may precede flags (HOST)
	for rest := expandShort(args); ; {
		if err := fs.Parse(rest); err != nil {
			return o, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos, rest = append(pos, fs.Arg(0)), fs.Args()[1:]
		if len(pos) > 1 || (len(rest) > 0 && rest[0] == "--") {
			pos = append(pos, rest...)
			break
		}
	}
	sockets, op, size, duration, guestMem, all := r.sockets, r.op, r.size, r.duration, r.guestMem, r.all
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.paths < 1 || o.paths > maxPaths {
		return o, fmt.Errorf("--paths %d: want 1 … %d", o.paths, maxPaths)
	}
	switch {
	case o.socket != "" && sockets != "":
		return o, errors.New("--sockets (both sides in one process) and --socket (one side) exclude each other")
	case o.socket != "" && len(pos) > 1:
		return o, fmt.Errorf("unexpected arguments %q: want at most one HOST", pos)
	case o.socket != "":
		if len(pos) == 1 {
			o.host = pos[0]
		}
	case len(pos) != 0:
		return o, fmt.Errorf("unexpected arguments %q (a HOST goes with --socket; --sockets runs both sides)", pos)
	case sockets == "":
		return o, errors.New("give --sockets S1,S2 (both sides in one process) or --socket S [HOST] (one side)")
	default:
		o.sockets = strings.Split(sockets, ",")
		if len(o.sockets) != 2 || o.sockets[0] == "" || o.sockets[1] == "" {
			return o, errors.New("--sockets wants two sockets, S1,S2")
		}
	}
	base, lat := strings.CutSuffix(op, "_lat")
	if !lat {
		base = strings.TrimSuffix(op, "_bw")
	}
	switch base {
	case "write", "read", "send", "atomic":
	default:
		return o, fmt.Errorf("--op %q: want write, read, send or atomic, or one of them with _bw or _lat", op)
	}
	o.op, o.lat = base, lat

	if duration != "" {
		d, err := parseDuration(duration)
		if err != nil {
			return o, err
		}
		o.duration = d
	}
	switch {
	case (set["n"] || set["iters"]) && o.duration != 0:
		return o, errors.New("-n (--iters) and -D (--duration) exclude each other")
	case (set["n"] || set["iters"]) && (o.iters < minIters || o.iters > maxIters):
		return o, fmt.Errorf("-n %d: want %d … %d", o.iters, minIters, maxIters)
	case o.iters == 0 && o.duration == 0:
		o.iters = defaultIters
		if o.op == "write" && !o.lat {
			o.iters = defaultItersWB
		}
	}

	switch {
	case all && (set["s"] || set["size"]):
		return o, errors.New("-a (--all) and -s (--size) exclude each other")
	case all && o.op == "atomic":
		return o, errors.New("-a (--all): atomic messages are always 8 bytes")
	case all && o.duration != 0:
		return o, errors.New("-a (--all) with -D (--duration): perftest's duration mode runs one size")
	case all:
		for i := 1; i <= maxAllShift; i++ {
			o.sizes = append(o.sizes, 1<<i)
		}
	case o.op == "atomic":
		o.sizes = []uint64{atomicSize}
	case size == "" && o.lat:
		o.sizes = []uint64{defaultSizeLat}
	case size == "":
		o.sizes = []uint64{defaultSizeBW}
	default:
		n, err := units.ParseBytes(size)
		if err != nil {
			return o, fmt.Errorf("-s: %w", err)
		}
		if n == 0 || n > 1<<31 {
			return o, fmt.Errorf("-s %d: want 1 … 2 GiB", n)
		}
		o.sizes = []uint64{n}
	}

	if o.qps < 1 || o.qps > maxQPs {
		return o, fmt.Errorf("-q %d: want 1 … %d", o.qps, maxQPs)
	}
	if o.lat && o.qps != 1 {
		return o, errors.New("-q: multiple QPs only in bandwidth tests (as perftest)")
	}
	switch {
	case o.txDepth == 0 && o.lat:
		o.txDepth = 1
	case o.txDepth == 0:
		o.txDepth = defaultTxDepthBW
	case o.txDepth < 0 || o.txDepth > maxTxDepth:
		return o, fmt.Errorf("-t %d: want 1 … %d", o.txDepth, maxTxDepth)
	}
	if o.latIters < 0 {
		return o, fmt.Errorf("--lat-iters %d: want 0 or more", o.latIters)
	}
	if guestMem != "" {
		n, err := units.ParseBytes(guestMem)
		if err != nil {
			return o, fmt.Errorf("--guest-mem: %w", err)
		}
		o.guestMem = n
	}
	if o.socket != "" {
		if err := o.checkTwoProc(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// parseDuration reads -D: whole seconds as perftest takes them, or a Go
// duration ("500ms", "1m").
func parseDuration(s string) (time.Duration, error) {
	var d time.Duration
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		d = time.Duration(n) * time.Second
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, fmt.Errorf("-D %q: want seconds or a duration such as 500ms", s)
	}
	if d <= 0 || d > 24*time.Hour {
		return 0, fmt.Errorf("-D %q: want more than 0 and at most 24h", s)
	}
	return d, nil
}

// usage prints the help text: generated from the flag definitions, in the
// form help2man turns into the manual page.
func usage(w io.Writer) {
	fs := newFlagSet(&options{}, &rawFlags{})
	fmt.Fprint(w, `Usage: vrdma-perf --sockets S1,S2 [OPTIONS]
       vrdma-perf --socket S [OPTIONS]          (server)
       vrdma-perf --socket S [OPTIONS] HOST     (client)

Measure a pair of vrdma devices as perftest measures a pair of RNICs: open
both devices on a running vrdmad as virtio-user front-ends, connect RC QPs
and run ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw or a latency test
(ib_write_lat, ib_send_lat, ib_read_lat, ib_atomic_lat), printing
perftest's table. perftest's flags keep their meaning and defaults. With
--socket it runs one side of a bandwidth test, as perftest's server (no
HOST) or client (HOST), exchanging QPN, PSN, GID, rkey and buffer over TCP
(--port); both sides' vrdmads must share a host today.

Options:
`)
	for _, d := range flagDocs {
		var names []string
		for _, n := range d.names {
			if len(n) == 1 {
				names = append(names, "-"+n)
			} else {
				names = append(names, "--"+n)
			}
		}
		head := strings.Join(names, ", ")
		if d.arg != "" {
			head += " " + d.arg
		}
		help := "print this help and exit"
		if f := fs.Lookup(d.names[len(d.names)-1]); f != nil {
			help = f.Usage
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
				help += " (default " + f.DefValue + ")"
			}
		}
		fmt.Fprintf(w, "  %s\n      %s\n", head, help)
	}
	fmt.Fprint(w, `
Bandwidth is measured from the first post to the last completion (perftest's
BW average), and BW peak is the best rate over any run of consecutive
operations (0 with -D or beyond 20000 iterations, as perftest). Latency
tests run one operation at a time on one QP: write_lat and send_lat
ping-pong between the two devices and report half the round trip, read_lat
and atomic_lat the time from post to completion, as perftest does.

Exit status: 0 success, 1 failure (a device, a work completion or --verify),
2 bad usage.

Examples:
  vrdma-perf --sockets /run/vrdma/a.sock,/run/vrdma/b.sock -s 65536 -D 5 --report_gbits
  vrdma-perf --sockets A,B --op read -a -F
  vrdma-perf --sockets A,B --op write_lat -s 64 -n 10000
  vrdma-perf --sockets A,B --op send -q 4 --verify --json
  vrdma-perf --socket A --op write --verify            # server
  vrdma-perf --socket B --op write --verify 127.0.0.1  # client
`)
}
