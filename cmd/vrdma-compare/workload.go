package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/vrdma/vrdma/internal/guestresult"
)

// Metric is what a workload measures.
type Metric int

const (
	// Bandwidth in Gb/s (10^9 bits per second); higher is better.
	Bandwidth Metric = iota
	// Latency in microseconds (the median of one run); lower is better.
	Latency
)

// Pair is one of the three guest pairs every workload runs on.
type Pair int

const (
	// GoGuest: two vrdma guests (bin/guest) whose vrdma-guest drives the
	// device from user space through sysfs; one vrdmad.
	GoGuest Pair = iota
	// VrdmaPerftest: two guests of the standard-stack image
	// (bin/guest-stack: the vrdma kernel driver, libibverbs with the vrdma
	// provider) running perftest through guest/perftest-jobs; one vrdmad.
	VrdmaPerftest
	// RxePerftest: two guests (bin/rxe) running the same perftest through
	// guest/perftest-jobs over rdma_rxe on virtio-net.
	RxePerftest
	// NumPairs is the number of pairs.
	NumPairs
)

// String names the pair in messages.
func (p Pair) String() string {
	switch p {
	case GoGuest:
		return "vrdma Go guest"
	case VrdmaPerftest:
		return "vrdma perftest"
	case RxePerftest:
		return "rxe perftest"
	}
	return fmt.Sprintf("Pair(%d)", int(p))
}

// Transport is the "transport" perftest-jobs writes into the pair's
// results ("" for GoGuest, whose vrdma-guest writes none).
func (p Pair) Transport() string {
	switch p {
	case VrdmaPerftest:
		return "vrdma-perftest"
	case RxePerftest:
		return "rxe"
	}
	return ""
}

// Workload is one row of the comparison: the same operation and message
// size on every pair.
type Workload struct {
	Name   string // row label, e.g. "WRITE bandwidth 64 KiB"
	Metric Metric
	// VrdmaOp is vrdma-guest's --op ("": the Go guest has no such
	// workload, e.g. UCX's, and its column stays empty); PerftestOp is
	// guest/perftest-jobs' job operation (perftest's ib_<PerftestOp>, or
	// send_lat_cm, ucx_tag_bw, ucx_tag_lat).
	VrdmaOp, PerftestOp string
	Size                int
	// Iters for every pair (vrdma-guest --iters / --lat-iters, perftest -n).
	Iters int
}

// Workloads are the list: WRITE bandwidth at 4 KiB, 64 KiB and
// 1 MiB, WRITE and SEND latency at 64 B, READ bandwidth at 64 KiB. Iteration
// counts keep one soft-RoCE run under TCG within seconds (about 8-16 MiB
// moved per bandwidth run).
var Workloads = []Workload{
	{Name: "WRITE bandwidth 4 KiB", Metric: Bandwidth, VrdmaOp: "write", PerftestOp: "write_bw", Size: 4 << 10, Iters: 2000},
	{Name: "WRITE bandwidth 64 KiB", Metric: Bandwidth, VrdmaOp: "write", PerftestOp: "write_bw", Size: 64 << 10, Iters: 200},
	{Name: "WRITE bandwidth 1 MiB", Metric: Bandwidth, VrdmaOp: "write", PerftestOp: "write_bw", Size: 1 << 20, Iters: 16},
	{Name: "WRITE latency 64 B", Metric: Latency, VrdmaOp: "write", PerftestOp: "write_lat", Size: 64, Iters: 1000},
	{Name: "SEND latency 64 B", Metric: Latency, VrdmaOp: "send", PerftestOp: "send_lat", Size: 64, Iters: 1000},
	{Name: "READ bandwidth 64 KiB", Metric: Bandwidth, VrdmaOp: "read", PerftestOp: "read_bw", Size: 64 << 10, Iters: 200},
	// What middleware sees (issue 27): UCP tag matching over UCX's
	// rc_verbs, and perftest connected through rdma_cm. Both perftest
	// pairs run them; the Go guest has neither.
	{Name: "UCX tag bandwidth 64 KiB (rc_verbs)", Metric: Bandwidth, PerftestOp: "ucx_tag_bw", Size: 64 << 10, Iters: 200},
	{Name: "UCX tag latency 8 B (rc_verbs)", Metric: Latency, PerftestOp: "ucx_tag_lat", Size: 8, Iters: 1000},
	{Name: "SEND latency 64 B, rdma_cm (-R)", Metric: Latency, PerftestOp: "send_lat_cm", Size: 64, Iters: 1000},
}

// Runs reports whether pair p runs w: the Go guest only runs workloads
// vrdma-guest has.
func (w Workload) Runs(p Pair) bool {
	return p != GoGuest || w.VrdmaOp != ""
}

// Select returns the workloads of ws whose names contain one of the
// comma-separated words, ignoring case (empty words match nothing).
func Select(ws []Workload, words string) []Workload {
	var out []Workload
	for _, w := range ws {
		name := strings.ToLower(w.Name)
		for _, word := range strings.Split(words, ",") {
			if word = strings.ToLower(strings.TrimSpace(word)); word != "" && strings.Contains(name, word) {
				out = append(out, w)
				break
			}
		}
	}
	return out
}

// ShortWorkloads is the subset --short runs (make test): one bandwidth and
// one latency row.
var ShortWorkloads = []Workload{Workloads[1], Workloads[3]}

// PerftestJob is the workload in guest/perftest-jobs' form, OP:SIZE:ITERS.
func (w Workload) PerftestJob() string {
	return w.PerftestOp + ":" + strconv.Itoa(w.Size) + ":" + strconv.Itoa(w.Iters)
}

// VrdmaArgs are vrdma-guest's server/client arguments for w.
func (w Workload) VrdmaArgs() []string {
	args := []string{"--op", w.VrdmaOp, "--size", strconv.Itoa(w.Size), "--iters", strconv.Itoa(w.Iters)}
	if w.Metric == Latency {
		args = append(args, "--lat-iters", strconv.Itoa(w.Iters))
	}
	return args
}

var (
	// ErrBadResult means a guest's result line does not fit its workload.
	ErrBadResult = errors.New("bad result")
)

// ResultError is a result that does not fit the workload it answers.
type ResultError struct {
	Workload string
	Reason   string
}

func (e *ResultError) Error() string { return fmt.Sprintf("%s: %s", e.Workload, e.Reason) }

// Is matches ErrBadResult.
func (e *ResultError) Is(target error) bool { return target == ErrBadResult }

// perftestExtra are perftest-jobs' fields beyond guestresult.Result.
type perftestExtra struct {
	Transport string   `json:"transport"`
	Run       int      `json:"run"`
	GBits     *float64 `json:"gbits_per_s"`
}

// Figure extracts w's figure from a result of pair p: Gb/s for bandwidth,
// the median latency in µs for latency. perftest results must come from
// perftest-jobs with p's transport ("vrdma-perftest", "rxe") and op
// ib_<PerftestOp>; Go-guest results must be verified. On error the figure
// is 0.
func (w Workload) Figure(r guestresult.Result, p Pair) (float64, error) {
	bad := func(f string, a ...any) (float64, error) {
		return 0, &ResultError{Workload: w.Name, Reason: fmt.Sprintf(f, a...)}
	}
	if r.Size != uint64(w.Size) {
		return bad("result for %d bytes, want %d", r.Size, w.Size)
	}
	var v float64
	switch p {
	case VrdmaPerftest, RxePerftest:
		var x perftestExtra
		if err := json.Unmarshal(r.Raw, &x); err != nil {
			return bad("%s result: %v", p, err)
		}
		if x.Transport != p.Transport() || r.Op != w.PerftestOp {
			return bad("%s result for %q/%q, want %s/%q", p, x.Transport, r.Op, p.Transport(), w.PerftestOp)
		}
		if w.Metric == Bandwidth {
			if x.GBits == nil {
				return bad("%s result has no gbits_per_s", p)
			}
			v = *x.GBits
		} else {
			v = r.LatP50
		}
	case GoGuest:
		if w.VrdmaOp == "" {
			return bad("the Go guest has no %s workload", w.PerftestOp)
		}
		if r.Op != w.VrdmaOp {
			return bad("vrdma result for op %q, want %q", r.Op, w.VrdmaOp)
		}
		if !r.Verified {
			return bad("vrdma data not verified")
		}
		if w.Metric == Bandwidth {
			v = r.GBytesPerS * 8
		} else {
			v = r.LatP50
		}
	default:
		return bad("no pair %d", int(p))
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 || v > 1e9 {
		return bad("figure %v out of range", v)
	}
	return v, nil
}

// Stats summarise the runs of one workload on one pair.
type Stats struct {
	N                int
	Median, Min, Max float64
}

// Summarize returns the median, minimum and maximum of vs (the median of an
// even count is the mean of the middle two). ok is false for no values.
func Summarize(vs []float64) (Stats, bool) {
	if len(vs) == 0 {
		return Stats{}, false
	}
	s := append([]float64(nil), vs...)
	sort.Float64s(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Stats{N: n, Median: med, Min: s[0], Max: s[n-1]}, true
}

// Advantage is how many times better vrdma is than rxe for metric m:
// vrdma/rxe for bandwidth, rxe/vrdma for latency. ok is false when a
// divisor is zero.
func Advantage(m Metric, vrdma, rxe float64) (float64, bool) {
	if m == Bandwidth {
		if rxe == 0 {
			return 0, false
		}
		return vrdma / rxe, true
	}
	if vrdma == 0 {
		return 0, false
	}
	return rxe / vrdma, true
}
