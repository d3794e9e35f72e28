package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/units"
)

// The command line: perftest's flags with perftest's spellings (short and
// long, from perftest_parameters.c), and vrdma-perf's own.

// unsupportedError is a perftest option vrdma-perf understands but cannot
// run on a vrdma device (-c UD, -R, -i 2, inline on a device without it):
// a valid perftest command line, so it exits 1 as perftest does when the
// device lacks the feature, not 2 (bad usage).
type unsupportedError struct{ msg string }

func (e *unsupportedError) Error() string { return "not supported: " + e.msg }

func unsupported(format string, args ...any) error {
	return &unsupportedError{msg: fmt.Sprintf(format, args...)}
}

// errVersion is --version's (-V's) request.
var errVersion = errors.New("version requested")

// defaultControl is vrdmad's control socket when neither --control nor
// $VRDMA_CONTROL names one (vrdmactl's default too).
const defaultControl = "/run/vrdma/control.sock"

// mtus are the path MTUs -m takes (perftest's set_mtu).
var mtus = []int{256, 512, 1024, 2048, 4096}

// maxInline is perftest's MAX_INLINE, -I's bound; the device's own bound
// (its max_inline_data) is applied once it is open.
const maxInline = 1024

// flagDoc is one option of the usage text: its names as perftest spells
// them (short first) and an argument name.
type flagDoc struct {
	names []string
	arg   string
}

// flagDocs orders the usage text; every flag of newFlagSet is here.
var flagDocs = []flagDoc{
	{[]string{"sockets"}, "S1,S2"},
	{[]string{"socket"}, "S"},
	{[]string{"d", "ib-dev"}, "DEV"},
	{[]string{"control"}, "PATH"},
	{[]string{"i", "ib-port"}, "PORT"},
	{[]string{"p", "port"}, "PORT"},
	{[]string{"x", "gid-index"}, "INDEX"},
	{[]string{"paths"}, "N"},
	{[]string{"op"}, "OP"},
	{[]string{"c", "connection"}, "TYPE"},
	{[]string{"s", "size"}, "SIZE"},
	{[]string{"a", "all"}, ""},
	{[]string{"n", "iters"}, "ITERS"},
	{[]string{"D", "duration"}, "SECONDS"},
	{[]string{"q", "qp"}, "QPS"},
	{[]string{"t", "tx-depth"}, "TX_DEPTH"},
	{[]string{"r", "rx-depth"}, "RX_DEPTH"},
	{[]string{"b", "bidirectional"}, ""},
	{[]string{"m", "mtu"}, "MTU"},
	{[]string{"I", "inline_size"}, "SIZE"},
	{[]string{"R", "rdma_cm"}, ""},
	{[]string{"report_gbits"}, ""},
	{[]string{"output"}, "WHAT"},
	{[]string{"F", "CPU-freq"}, ""},
	{[]string{"verify"}, ""},
	{[]string{"json"}, ""},
	{[]string{"lat-iters"}, "N"},
	{[]string{"guest-mem"}, "SIZE"},
	{[]string{"V", "version"}, ""},
	{[]string{"h", "help"}, ""},
}

// rawFlags are the flags parseFlags turns into options.
type rawFlags struct {
	sockets, op, size, duration, guestMem, device, conn, output string
	all, rdmaCM, version                                        bool
	ibPort, mtu, inline                                         int
}

// newFlagSet defines the flags on o and r.
func newFlagSet(o *options, r *rawFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("vrdma-perf", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	str := func(p *string, names []string, def, usage string) {
		for _, n := range names {
			fs.StringVar(p, n, def, usage)
		}
	}
	integer := func(p *int, names []string, def int, usage string) {
		for _, n := range names {
			fs.IntVar(p, n, def, usage)
		}
	}
	boolean := func(p *bool, names []string, usage string) {
		for _, n := range names {
			fs.BoolVar(p, n, false, usage)
		}
	}
	str(&r.sockets, []string{"sockets"}, "", "both sides in one process: the two device sockets, comma-separated: requester (perftest's client), responder (its server)")
	str(&o.socket, []string{"socket"}, "", "two-process mode: this side's device socket; with a HOST argument the client (measures), without it the server (waits on --port)")
	str(&r.device, []string{"d", "ib-dev"}, "", "the device by its vrdmad ID (vrdmactl device ls), looked up through the control API: "+
		"one ID is this side's device in two-process mode (instead of --socket), two (ID1,ID2) the devices of --sockets; "+
		"given with --socket or --sockets it must name the same devices")
	str(&o.control, []string{"control"}, "", "vrdmad's control socket, where -d looks devices up (default $VRDMA_CONTROL, else "+defaultControl+")")
	integer(&r.ibPort, []string{"i", "ib-port"}, 1, "the device port: a vrdma device has one, 1")
	integer(&o.port, []string{"p", "port"}, defaultPort, "two-process mode: the TCP port of the exchange")
	for _, n := range []string{"x", "gid-index"} {
		fs.UintVar(&o.gidIndex, n, 0, "two-process mode: the local GID the QP sends from (perftest's -x): 1 or more is a host address's GID on a vrdmad with --roce-bind, for a peer on another host")
	}
	integer(&o.paths, []string{"paths"}, 1, "two-process mode: spray each QP over N paths to a peer on another host (1 … 64; the multipath extension between vrdma hosts)")
	str(&r.op, []string{"op"}, "write", "the test: write, read, send or atomic (bandwidth, as ib_OP_bw; OP_bw is the same) or write_lat, read_lat, send_lat, atomic_lat (latency, as ib_OP_lat)")
	str(&r.conn, []string{"c", "connection"}, "RC", "the transport: RC (perftest's UC, UD, XRC, DC and SRD are not supported: vrdma-perf runs RC QPs)")
	str(&r.size, []string{"s", "size"}, "", "message size in bytes, K and M suffixes allowed (default 65536 for bandwidth, 2 for latency; atomic: always 8)")
	boolean(&r.all, []string{"a", "all"}, "run every message size from 2 to 2^23 bytes (8 MiB), one table row each")
	integer(&o.iters, []string{"n", "iters"}, 0, "iterations per QP (default 5000 for write bandwidth, else 1000)")
	str(&r.duration, []string{"D", "duration"}, "", "run for this long instead of -n: seconds (perftest), or a Go duration such as 500ms; a quarter of it, in whole seconds, is a warm-up and a cool-down margin left out of the figures")
	integer(&o.qps, []string{"q", "qp"}, 1, "QP pairs (bandwidth tests), each with TX_DEPTH operations in flight")
	integer(&o.txDepth, []string{"t", "tx-depth"}, 0, "operations in flight per QP (default 128 for bandwidth, 1 for latency)")
	integer(&o.rxDepth, []string{"r", "rx-depth"}, 0, "send bandwidth: receives kept posted per QP (default 2048; perftest's 512 leaves a responder in another process, late to repost on a busy host, too little slack: the sender then waits receiver-not-ready)")
	boolean(&o.bidir, []string{"b", "bidirectional"}, "bandwidth tests: both sides post operations at once, each to the other; the row is the sum of both directions (perftest's duplex report)")
	integer(&r.mtu, []string{"m", "mtu"}, 0, "the QPs' path MTU: 256, 512, 1024, 2048 or 4096 bytes (default the port's active MTU; a larger one is lowered to it, as perftest does)")
	integer(&r.inline, []string{"I", "inline_size"}, 0, "write and send: carry messages of up to SIZE bytes inside the work request (IBV_SEND_INLINE; 0 … 1024, bounded by the device's max_inline_data)")
	boolean(&r.rdmaCM, []string{"R", "rdma_cm"}, "perftest's connection through rdma_cm: not supported (vrdma-perf connects through its own TCP exchange; rdma_cm runs in guests with the standard stack)")
	fs.BoolVar(&o.gbits, "report_gbits", false, "report bandwidth in Gb/sec (10^9 bits) instead of MB/sec (2^20 bytes)")
	str(&r.output, []string{"output"}, "", "print only one figure per message size, as perftest's --output: bandwidth or message_rate (bandwidth tests), latency (latency tests: t_avg in usec)")
	for _, n := range []string{"F", "CPU-freq"} {
		fs.Bool(n, false, "accepted for perftest's command lines and ignored: vrdma-perf times with the monotonic clock, not the CPU's cycle counter, so there is no CPU-frequency check to skip")
	}
	fs.BoolVar(&o.verify, "verify", false, "fill each source buffer with a pattern per operation, check every byte where it arrived and say what was checked")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per message size instead of the table")
	fs.IntVar(&o.latIters, "lat-iters", defaultLatIters, "bandwidth tests with --json: operations of the latency pass that fills lat_us_p50, lat_us_p99 and lat_us_avg (0: none)")
	str(&r.guestMem, []string{"guest-mem"}, "", "guest memory per front-end (default: what the buffers need)")
	boolean(&r.version, []string{"V", "version"}, "print the version and exit")
	return fs
}

// boolShort are perftest's one-letter flags without a value, which getopt
// lets a command line cluster ("-aF"); valueShort take a value, which
// getopt lets follow without a space ("-s65536").
const (
	boolShort  = "abFRVh"
	valueShort = "dicpxsnDqtmI"
)

// expandShort rewrites getopt's short-option forms the flag package lacks:
// clusters of boolean flags ("-aF") and values glued to their flag
// ("-s65536"). A word that is a flag of fs as it stands ("-socket", which
// the flag package takes for --socket) stays as it is.
func expandShort(fs *flag.FlagSet, args []string) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch {
		case len(a) < 3 || a[0] != '-' || a[1] == '-' || fs.Lookup(name) != nil:
			out = append(out, a)
		case strings.Trim(a[1:], boolShort) == "":
			for _, c := range a[1:] {
				out = append(out, "-"+string(c))
			}
		case strings.IndexByte(valueShort, a[1]) >= 0 && a[2] != '=':
			out = append(out, a[:2], a[2:])
		default:
			out = append(out, a)
		}
	}
	return out
}

// parseFlags turns the command line into options; flag.ErrHelp for -h,
// errVersion for -V, an *unsupportedError for a perftest option a vrdma
// device cannot run.
func parseFlags(args []string) (options, error) {
	o := options{diag: io.Discard}
	var r rawFlags
	fs := newFlagSet(&o, &r)
	var pos []string // positional arguments, which may precede flags (HOST)
	for rest := expandShort(fs, args); ; {
		if err := fs.Parse(rest); err != nil {
			return o, cli.ParseError(err) // GNU form, as every vrdma tool's
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
	if r.version {
		return o, errVersion
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	given := func(names ...string) bool { return slices.ContainsFunc(names, func(n string) bool { return set[n] }) }

	// What perftest has and vrdma cannot do comes first: its message is
	// the answer whatever else is wrong with the line.
	if r.rdmaCM {
		return o, unsupported("-R (rdma_cm): vrdma-perf connects through its own TCP exchange; rdma_cm runs in guests with the standard stack (ib_write_bw -R in a VM)")
	}
	switch r.conn {
	case "RC":
	case "UC", "UD", "XRC", "DC", "SRD", "RawEth":
		return o, unsupported("-c %s: vrdma-perf runs RC QPs only (-c RC, the default)", r.conn)
	default:
		return o, fmt.Errorf("-c %q: want RC (perftest's connection types are RC, UC, UD, XRC, DC, SRD and RawEth)", r.conn)
	}
	switch {
	case r.ibPort < 1:
		return o, fmt.Errorf("-i %d: want 1 (IB ports count from 1)", r.ibPort)
	case r.ibPort > 1:
		return o, unsupported("-i %d: a vrdma device has one port, 1", r.ibPort)
	}
	if o.paths < 1 || o.paths > maxPaths {
		return o, fmt.Errorf("--paths %d: want 1 … %d", o.paths, maxPaths)
	}
	if err := o.parseMode(r.sockets, r.device, pos); err != nil {
		return o, err
	}
	if err := o.parseTest(r, given); err != nil {
		return o, err
	}
	if r.mtu != 0 && !slices.Contains(mtus, r.mtu) {
		return o, fmt.Errorf("-m %d: want 256, 512, 1024, 2048 or 4096", r.mtu)
	}
	o.mtu = r.mtu
	switch {
	case r.inline < 0 || r.inline > maxInline:
		return o, fmt.Errorf("-I %d: want 0 … %d", r.inline, maxInline)
	case r.inline > 0 && (o.op == "read" || o.op == "atomic"):
		return o, fmt.Errorf("-I: inline data only in write and send tests (a %s carries no data of its own)", o.op)
	}
	o.inline = r.inline
	switch r.output {
	case "":
	case "bandwidth", "message_rate":
		if o.lat {
			return o, fmt.Errorf("--output %s: a latency test's figure is latency", r.output)
		}
	case "latency":
		if !o.lat {
			return o, errors.New("--output latency: a bandwidth test's figures are bandwidth and message_rate")
		}
	default:
		return o, fmt.Errorf("--output %q: want bandwidth, message_rate or latency", r.output)
	}
	if r.output != "" && o.json {
		return o, errors.New("--output and --json exclude each other")
	}
	o.output = r.output
	if o.latIters < 0 {
		return o, fmt.Errorf("--lat-iters %d: want 0 or more", o.latIters)
	}
	if r.guestMem != "" {
		n, err := units.ParseBytes(r.guestMem)
		if err != nil {
			return o, fmt.Errorf("--guest-mem: %w", err)
		}
		o.guestMem = n
	}
	if o.control == "" {
		o.control = os.Getenv("VRDMA_CONTROL")
	}
	if o.control == "" {
		o.control = defaultControl
	}
	if o.twoProc {
		if err := o.checkTwoProc(); err != nil {
			return o, err
		}
	} else if o.paths > 1 {
		return o, errMultipath
	}
	return o, nil
}

// parseMode decides between one process and two from --sockets, --socket,
// -d and the positional arguments.
func (o *options) parseMode(sockets, device string, pos []string) error {
	var devs []string
	if device != "" {
		devs = strings.Split(device, ",")
		if len(devs) > 2 || slices.Contains(devs, "") {
			return fmt.Errorf("-d %q: want one device ID (two-process mode) or two, ID1,ID2 (both sides in one process)", device)
		}
	}
	switch {
	case o.socket != "" && sockets != "":
		return errors.New("--sockets (both sides in one process) and --socket (one side) exclude each other")
	case o.socket != "" || (sockets == "" && len(devs) == 1):
		o.twoProc = true
		if len(devs) > 1 {
			return fmt.Errorf("-d %q: two-process mode runs one device here", device)
		}
		if len(pos) > 1 {
			return fmt.Errorf("unexpected arguments %q: want at most one HOST", pos)
		}
		if len(pos) == 1 {
			o.host = pos[0]
		}
	case len(pos) != 0:
		return fmt.Errorf("unexpected arguments %q (a HOST goes with --socket or -d DEV, one side per process)", pos)
	case sockets != "":
		o.sockets = strings.Split(sockets, ",")
		if len(o.sockets) != 2 || o.sockets[0] == "" || o.sockets[1] == "" {
			return errors.New("--sockets wants two sockets, S1,S2")
		}
	case len(devs) == 2:
		o.sockets = make([]string, 2)
	default:
		return errors.New("give --sockets S1,S2 or -d ID1,ID2 (both sides in one process), or --socket S or -d ID, with HOST for the client (one side per process)")
	}
	o.devices = devs
	return nil
}

// parseTest reads the test itself: the operation, sizes, iterations or
// duration, QPs and depth.
func (o *options) parseTest(r rawFlags, given func(...string) bool) error {
	base, lat := strings.CutSuffix(r.op, "_lat")
	if !lat {
		base = strings.TrimSuffix(r.op, "_bw")
	}
	switch base {
	case "write", "read", "send", "atomic":
	default:
		return fmt.Errorf("--op %q: want write, read, send or atomic, or one of them with _bw or _lat", r.op)
	}
	o.op, o.lat, o.all = base, lat, r.all
	if o.lat && o.bidir {
		return errors.New("-b: bidirectional runs are bandwidth tests (as perftest's)")
	}

	if r.duration != "" {
		d, err := parseDuration(r.duration)
		if err != nil {
			return err
		}
		o.duration = d
	}
	switch {
	case given("n", "iters") && o.duration != 0:
		return errors.New("-n (--iters) and -D (--duration) exclude each other")
	case given("n", "iters") && (o.iters < minIters || o.iters > maxIters):
		return fmt.Errorf("-n %d: want %d … %d", o.iters, minIters, maxIters)
	case o.iters == 0 && o.duration == 0:
		o.iters = defaultIters
		if o.op == "write" && !o.lat {
			o.iters = defaultItersWB
		}
	}

	switch {
	case r.all && given("s", "size"):
		return errors.New("-a (--all) and -s (--size) exclude each other")
	case r.all && o.op == "atomic":
		return errors.New("-a (--all): atomic messages are always 8 bytes")
	case r.all && o.duration != 0:
		return errors.New("-a (--all) with -D (--duration): perftest's duration mode runs one size")
	case r.all:
		for i := 1; i <= maxAllShift; i++ {
			o.sizes = append(o.sizes, 1<<i)
		}
	case o.op == "atomic":
		o.sizes = []uint64{atomicSize}
	case r.size == "" && o.lat:
		o.sizes = []uint64{defaultSizeLat}
	case r.size == "":
		o.sizes = []uint64{defaultSizeBW}
	default:
		n, err := units.ParseBytes(r.size)
		if err != nil {
			return fmt.Errorf("-s: %w", err)
		}
		if n == 0 || n > 1<<31 {
			return fmt.Errorf("-s %d: want 1 … 2 GiB", n)
		}
		o.sizes = []uint64{n}
	}

	if o.qps < 1 || o.qps > maxQPs {
		return fmt.Errorf("-q %d: want 1 … %d", o.qps, maxQPs)
	}
	if o.lat && o.qps != 1 {
		return errors.New("-q: multiple QPs only in bandwidth tests (as perftest)")
	}
	switch {
	case o.txDepth == 0 && o.lat:
		o.txDepth = 1
	case o.txDepth == 0:
		o.txDepth = defaultTxDepthBW
	case o.txDepth < 0 || o.txDepth > maxTxDepth:
		return fmt.Errorf("-t %d: want 1 … %d", o.txDepth, maxTxDepth)
	}
	switch {
	case o.rxDepth == 0:
		o.rxDepth = defaultRxDepth
	case o.rxDepth < 0 || o.rxDepth > maxTxDepth:
		return fmt.Errorf("-r %d: want 1 … %d", o.rxDepth, maxTxDepth)
	}
	return nil
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
