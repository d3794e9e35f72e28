// Command vrdma-perf measures a vrdma device pair the way perftest measures
// an RNIC: it opens two virtio-user devices on a running vrdmad (one
// front-end per socket), connects an RC QP pair and measures bandwidth
// (pipelined, like ib_write_bw) and latency (one operation at a time).
//
// Usage:
//
//	vrdma-perf --sockets S1,S2 --op write|read|send|atomic --size N
//	           (--iters N | --duration D) [--guest-mem SIZE] [--verify] [--json]
//
// SIZE accepts 4096, 4K, 64KiB, 1M, 1G (binary multiples). With --json it
// prints one object per line with op, size, iters, gbytes_per_s, mops,
// lat_us_p50, lat_us_p99 and verified. It exits non-zero on any failure.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/units"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "vrdma-perf:", err)
		os.Exit(1)
	}
}

// parseFlags turns the command line into options.
func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("vrdma-perf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	var sockets, size, guestMem string
	fs.StringVar(&sockets, "sockets", "", "the two device sockets, comma-separated (requester,responder)")
	fs.StringVar(&o.op, "op", "write", "operation: write, read, send or atomic")
	fs.StringVar(&size, "size", "64K", "message size (atomic: always 8)")
	fs.IntVar(&o.iters, "iters", 0, "bandwidth iterations (default 5000 unless --duration)")
	fs.DurationVar(&o.duration, "duration", 0, "bandwidth pass duration instead of --iters")
	fs.StringVar(&guestMem, "guest-mem", "", "guest memory per front-end (default: what the buffers need)")
	fs.BoolVar(&o.verify, "verify", false, "fill the source with a pattern per iteration and check every byte that arrived")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per line")
	fs.IntVar(&o.txDepth, "tx-depth", defaultTxDepth, "work requests in flight in the bandwidth pass")
	fs.IntVar(&o.latIters, "lat-iters", defaultLatIters, "latency iterations")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() != 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.sockets = strings.Split(sockets, ",")
	if sockets == "" || len(o.sockets) != 2 || o.sockets[0] == "" || o.sockets[1] == "" {
		return o, errors.New("--sockets wants two sockets, S1,S2")
	}
	switch o.op {
	case "write", "read", "send", "atomic":
	default:
		return o, fmt.Errorf("--op %q: want write, read, send or atomic", o.op)
	}
	n, err := units.ParseBytes(size)
	if err != nil {
		return o, fmt.Errorf("--size: %w", err)
	}
	if o.op == "atomic" {
		n = 8
	}
	if n == 0 || n > 1<<31 {
		return o, fmt.Errorf("--size %d: want 1 … 2 GiB", n)
	}
	o.size = n
	if guestMem != "" {
		if o.guestMem, err = units.ParseBytes(guestMem); err != nil {
			return o, fmt.Errorf("--guest-mem: %w", err)
		}
	}
	switch {
	case o.iters != 0 && o.duration != 0:
		return o, errors.New("--iters and --duration exclude each other")
	case o.iters < 0 || o.duration < 0:
		return o, errors.New("--iters and --duration must be positive")
	case o.iters == 0 && o.duration == 0:
		o.iters = defaultIters
	}
	if o.txDepth < 1 || o.txDepth > 4096 {
		return o, fmt.Errorf("--tx-depth %d: want 1 … 4096", o.txDepth)
	}
	if o.latIters < 1 {
		return o, fmt.Errorf("--lat-iters %d: want at least 1", o.latIters)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	o, err := parseFlags(args, os.Stderr)
	if err != nil {
		return err
	}
	res, err := measure(ctx, o)
	if err != nil {
		return err
	}
	if o.json {
		return json.NewEncoder(stdout).Encode(res) // one line
	}
	printTable(stdout, o, res)
	return nil
}

func printTable(w io.Writer, o options, r result) {
	names := map[string]string{"write": "RDMA_Write", "read": "RDMA_Read", "send": "Send", "atomic": "Atomic (fetch-and-add)"}
	line := strings.Repeat("-", 92)
	fmt.Fprintln(w, line)
	fmt.Fprintf(w, "%*s\n", 46+len(names[o.op])/2, names[o.op]+" BW / latency test (vrdma)")
	fmt.Fprintf(w, " Requester: %s\n Responder: %s\n", o.sockets[0], o.sockets[1])
	v := "off"
	if o.verify {
		v = "on (passed)"
	}
	fmt.Fprintf(w, " Transport: RC   TX depth: %d   Buffers: %d x %s   Verify: %s\n", r.TxDepth, r.Slots, units.FormatBytes(r.Size), v)
	fmt.Fprintln(w, line)
	fmt.Fprintf(w, " %-10s %-12s %-17s %-15s %-12s %-12s %-12s\n", "#bytes", "#iterations", "BW average[GB/s]", "MsgRate[Mpps]", "t_p50[usec]", "t_p99[usec]", "t_avg[usec]")
	fmt.Fprintf(w, " %-10d %-12d %-17.3f %-15.4f %-12.2f %-12.2f %-12.2f\n", r.Size, r.Iters, r.GBytesPerS, r.Mops, r.LatP50, r.LatP99, r.LatAvg)
	fmt.Fprintln(w, line)
}

// Defaults.
const (
	defaultTxDepth  = 64
	defaultIters    = 5000
	defaultLatIters = 1000
)

// options are the parsed command line.
type options struct {
	sockets  []string
	op       string
	size     uint64
	iters    int
	duration time.Duration
	guestMem uint64
	verify   bool
	json     bool
	txDepth  int
	latIters int
}
