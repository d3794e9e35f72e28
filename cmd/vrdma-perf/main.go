// Command vrdma-perf measures a vrdma device pair the way perftest measures
// an RNIC: it opens vrdma devices on a running vrdmad as virtio-user
// front-ends, connects RC QP pairs and runs perftest's bandwidth test
// (ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw) or latency test
// (ib_write_lat, ib_send_lat, ib_read_lat, ib_atomic_lat).
//
// Usage:
//
//	vrdma-perf --sockets S1,S2 | -d ID1,ID2 [--op write|read|send|atomic|write_lat|…]
//	           [-s SIZE | -a] [-n ITERS | -D SECONDS] [-q QPS] [-t TX_DEPTH] [-b]
//	           [-m MTU] [-I SIZE] [--report_gbits] [--output WHAT] [-F] [--verify] [--json]
//	vrdma-perf --socket S | -d ID [-p PORT] [the same flags]          (server)
//	vrdma-perf --socket S | -d ID [-p PORT] [the same flags] HOST     (client)
//
// perftest's flags keep perftest's spellings, meaning and defaults, so its
// command lines run as they are: `vrdma-perf -d vm1 -i 1 -x 1 -F -s 65536
// -n 2000 --report_gbits HOST` is ib_write_bw's. -d names a device by its
// vrdmad ID, which vrdma-perf looks up through vrdmad's control API
// (--control, default $VRDMA_CONTROL, else /run/vrdma/control.sock); with
// --socket or --sockets it must name the same devices. -i takes the
// device's one port, 1; -c takes RC; -m sets the QPs' path MTU; -I the
// inline size (write and send, up to the device's max_inline_data); -b runs
// both directions at once; --output prints one figure per size; -F is
// accepted and ignored (no cycle counter to check). perftest's options a
// vrdma device cannot run (-c UC/UD/XRC/DC, -R, -i 2) are refused as "not
// supported" with exit status 1.
//
// The table is perftest's (the format of perftest 4.5, Debian 12's): the
// test banner, the test parameters, each QP's address, then " #bytes
// #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
// (Gb/sec with --report_gbits) or, for a latency test, t_min, t_max,
// t_typical, t_avg, t_stdev and the 99% and 99.9% percentiles in usec.
// BW peak is perftest's: the size over the least time per operation of
// any run of consecutive operations, from the first one's post to the
// last one's completion. The requester is the first socket (perftest's
// client), the responder the second.
//
// SIZE accepts 4096, 4K, 64KiB, 1M, 1G (binary multiples). With --json it
// prints, instead of the table, one object per message size on a line,
// with op, size, iters, gbytes_per_s, mops, lat_us_p50, lat_us_p99 and
// verified (internal/perftest.Result). With --verify it says, after the
// table (on standard error with --json), what it checked. Exit status: 0
// success, 1 failure or a perftest option a vrdma device does not
// support, 2 bad usage; --help prints the usage on standard output and
// exits 0.
//
// # Two processes
//
// With --socket (or one -d ID), vrdma-perf runs one side, as perftest's
// ib_* programs: without HOST it waits as the server on TCP port 18515
// (-p), with HOST it connects to that server (retrying for connectTimeout)
// and measures. Every test runs this way too — bandwidth and latency, -n
// or -D, -a, -q, -b — with the same loops as one process: a side that has
// nothing to post (a write, read or atomic server) sleeps on the TCP
// connection until the peer is done instead of spinning, and every
// polling loop (in either mode) gives its CPU away after a short spin
// without progress, so that on a machine with fewer CPUs than busy threads
// the engine and the peer run: two processes on one vrdmad measure what
// one process does. Both sides print the
// client's figures (with -b, the sum of both directions, as perftest's
// duplex report). With --verify the side that owns each destination
// buffer checks it (write, send: the responder; read, atomic: the
// requester, and the responder its counter) and both sides say what
// either checked.
//
// The exchange over TCP, bounded by exchangeTimeout per step (a wait for
// the peer's end of a run by the run's own bound): the client sends a
// hello, the server answers with its own (or a fin with ok=0 and the
// reason when the tests differ); then, per message size, each side sends
// ready, runs, and sends done with its counts and figures, reading the
// peer's after each; at the end each side sends a fin. Every message,
// little-endian:
//
//	0  4  magic "VRPX"
//	4  1  version (2; a different version is rejected)
//	5  1  kind: 1 hello, 2 fin, 3 ready, 4 done
//	6  2  reserved, zero
//	8  4  body length, at most 16384
//	12 …  body
//
// A hello's body: op (1 write, 2 read, 3 send, 4 atomic), flags (bit 0
// --verify, 1 latency test, 2 -b, 3 -a, 4 -D), 2 reserved, tx_depth u32,
// size u64 (0 with -a), iterations u64 (nanoseconds with -D), lat_iters
// u64, path MTU u32 (bytes: -m or the port's; the QPs take the lower of
// the two sides'), inline size u32, GID [16], rkey u32, QP count n u32,
// buffer address u64, buffer size u64, then n × (QPN u32, PSN u32):
// perftest's pingpong_dest per QP plus the test's parameters, which must
// match the peer's. ready: the size u64. done: the size u64,
// flags u32 (bit 0 figures follow, 1 a latency -D run), n u32, iterations
// u64, then f64s: seconds, bytes/s, operations/s, peak bytes/s, t_min,
// t_max, t_typical, t_avg, t_stdev, 99% and 99.9% (usec), transactions/s,
// the latency pass's p50, p99 and average (usec), its operations u64, then
// n × the operations this side posted on each QP so far (u64). A fin's
// body is ok (0 or 1) and at most 1024 bytes of UTF-8: the reason, or what
// the side verified. Anything else is a malformed peer: the side reports
// it and exits 1.
//
// --paths N (1 … 64, two-process mode) asks the device to spray each QP
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
	"time"

	"github.com/vrdma/vrdma/internal/version"
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
	var unsup *unsupportedError
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage(stdout)
		return 0
	case errors.Is(err, errVersion):
		fmt.Fprintln(stdout, "vrdma-perf", version.String())
		return 0
	case errors.As(err, &unsup):
		fmt.Fprintln(stderr, "vrdma-perf:", err)
		return exitFailure
	case err != nil:
		fmt.Fprintf(stderr, "vrdma-perf: %v (see vrdma-perf --help)\n", err)
		return exitUsage
	}
	o.diag = stdout
	if o.json || o.output != "" {
		o.diag = stderr
	}
	if err := resolveDevices(ctx, &o); err != nil {
		fmt.Fprintln(stderr, "vrdma-perf:", err)
		return exitFailure
	}
	do := measure
	if o.twoProc {
		do = twoProc
	}
	if err := do(ctx, o, stdout); err != nil {
		fmt.Fprintln(stderr, "vrdma-perf:", err)
		return exitFailure
	}
	return 0
}

// Defaults: perftest's (perftest_parameters.h), except where noted.
const (
	defaultSizeBW    = 65536 // DEF_SIZE_BW
	defaultSizeLat   = 2     // DEF_SIZE_LAT
	atomicSize       = 8     // DEF_SIZE_ATOMIC
	defaultItersWB   = 5000  // DEF_ITERS_WB: ib_write_bw
	defaultIters     = 1000  // DEF_ITERS: every other test
	defaultTxDepthBW = 128   // DEF_TX_BW
	// defaultRxDepth is the receives a send bandwidth test keeps posted per
	// QP. perftest's DEF_RX_SEND is 512; here a responder in another
	// process shares the CPUs with the sender and the engine, and 512 left
	// it too little slack: on 2 CPUs it ran dry about 1000 times a second
	// (the QP's rnr_naks_sent in `vrdmactl device qps`) and two processes
	// moved 0.56× what one does; with 2048, 25 in 5 s and 1.0×.
	defaultRxDepth  = 2048
	defaultLatIters = 1000      // vrdma-perf's latency pass after a bandwidth test (--json)
	minIters        = 5         // MIN_ITER
	maxIters        = 100000000 // MAX_ITER
	maxTxDepth      = 4096      // a vrdma QP's largest send queue (perftest: 15000)
	maxQPs          = 1024      // a vrdma device's default QP limit (perftest: 16384)
	maxAllShift     = 23        // -a: 2^1 … 2^23 bytes, as perftest
	peakItersLimit  = 20000     // perftest measures no peak beyond this many iterations
)

// options are the parsed command line.
type options struct {
	sockets  []string
	devices  []string // -d: vrdmad device IDs, looked up through the control API
	control  string   // --control: vrdmad's control socket
	op       string   // write, read, send or atomic
	lat      bool     // a latency test (--op OP_lat)
	all      bool     // -a: every size
	sizes    []uint64
	iters    int           // per QP; 0 with a duration
	duration time.Duration // 0 with iters
	qps      int
	txDepth  int
	rxDepth  int  // -r: receives posted per QP in send bandwidth tests
	bidir    bool // -b: both directions at once
	mtu      int  // -m: the path MTU in bytes; 0: the port's active MTU
	inline   int  // -I: inline bytes; 0: none
	latIters int  // bandwidth tests with --json: the latency pass
	gbits    bool
	output   string // --output: "", bandwidth, message_rate or latency
	guestMem uint64
	verify   bool
	json     bool
	paths    int  // --paths: QP paths to spray over
	gidIndex uint // -x: the local GID index (two-process mode)

	// Two-process mode (--socket or one -d): host is the server to
	// connect to; empty, this side is the server.
	twoProc      bool
	socket, host string
	port         int

	// diag receives what perftest prints besides the table (an MTU
	// lowered to the port's, an inline size cut to the device's, what
	// --verify checked): standard output, or standard error with --json
	// or --output so that standard output holds only what they print.
	diag io.Writer
}

// testName is perftest's program name for o ("ib_write_bw").
func (o *options) testName() string {
	if o.lat {
		return "ib_" + o.op + "_lat"
	}
	return "ib_" + o.op + "_bw"
}
