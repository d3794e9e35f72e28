package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/memmap"
)

// The perftest section: vrdma-perf run the two ways it runs, one process
// holding both devices (--sockets) and perftest's two processes (a
// server and a client exchanging over TCP), against the same two devices
// of one daemon in the same run. The two-process row must come within
// perfTarget of the one-process row.

// perfTarget is the least ratio of two processes to one.
const perfTarget = 0.8

// perfRow is one vrdma-perf test the section runs both ways.
type perfRow struct {
	name string
	args []string // the test's flags
	lat  bool     // a latency test: the figure is lat_us_avg, the ratio inverted
}

var perfRows = []perfRow{
	{"ib_write_bw 64 KiB", []string{"--op", "write", "-s", "64K"}, false},
	{"ib_send_bw 64 KiB", []string{"--op", "send", "-s", "64K"}, false},
	{"ib_write_lat 64 B", []string{"--op", "write_lat", "-s", "64"}, true},
}

// perftestSection measures each row's test in one process and in two,
// alternating, s.repeats times each for s.rowTime (vrdma-perf -D), and
// reports the medians.
func perftestSection(o options, w io.Writer) (section, error) {
	sec := section{title: "vrdma-perf: two processes against one",
		intro: "The same vrdma-perf binary against the same two devices of one in-process daemon: in one process " +
			"(`--sockets A,B`, both sides' loops in one goroutine) and as perftest runs, two processes (`--socket B` " +
			"the server, `--socket A … 127.0.0.1` the client, QPs and buffers exchanged over TCP). Each repeat runs " +
			"`-D` for the row time, one way then the other; the figure is the client's (bandwidth: BW average; " +
			"latency: t_avg). Target: two processes ≥ " + strconv.FormatFloat(perfTarget, 'f', 1, 64) +
			"× one process on the bandwidth rows."}
	if !exists(o.perf) {
		sec.notes = append(sec.notes, "Not measured in this run: "+o.perf+" is not built (make build).")
		return sec, nil
	}
	r, err := newRig(memmap.PinConfig{})
	if err != nil {
		return sec, err
	}
	defer r.close()
	var socks [2]string
	for i := range socks {
		if socks[i], err = r.device(); err != nil {
			return sec, err
		}
	}
	dur := o.s.rowTime.String()
	for _, pr := range perfRows {
		progress(w, "vrdma-perf %s, one process and two", pr.name)
		var one, two []float64
		for range o.s.repeats {
			args := append(append([]string{}, pr.args...), "-D", dur, "--json", "--lat-iters", "0")
			x, err := perfOne(o.perf, socks, args)
			if err != nil {
				return sec, fmt.Errorf("%s in one process: %w", pr.name, err)
			}
			y, err := perfTwo(o.perf, socks, args)
			if err != nil {
				return sec, fmt.Errorf("%s in two processes: %w", pr.name, err)
			}
			fig := func(r perfResult) float64 {
				if pr.lat {
					return r.LatAvg
				}
				return r.GBytesPerS
			}
			one, two = append(one, fig(x)), append(two, fig(y))
		}
		rw := row{name: pr.name + ", two processes", figure: median(two), unit: "GB/s", baseName: "one process",
			baseline: median(one), baseUnit: "GB/s"}
		if pr.lat {
			rw.unit, rw.baseUnit, rw.invRatio = "µs", "µs", true
		} else {
			rw.target, rw.met = "≥ 0.8×", boolp(rw.ratio() >= perfTarget)
		}
		sec.rows = append(sec.rows, rw)
	}
	sec.notes = append(sec.notes, verdict(sec.rows, perfMiss))
	return sec, nil
}

// perfMiss is printed under a missed row: what profiling the two ways
// showed while the two-process mode was brought level with one process.
const perfMiss = "Profile (pprof of both vrdma-perf processes and of the daemon): the two-process client once spent " +
	"three quarters of its CPU filling every message with the --verify pattern whether it verified or not, and on " +
	"2 CPUs a polling side that never gave its CPU away held it while the engine or the peer it waited for could not " +
	"run. Now a write, read or atomic server sleeps on its TCP connection and polling loops yield after a short spin; " +
	"what remains is two polling processes where one process has one thread (a send server reaps its receives, both " +
	"ends of a latency test poll), so other load on the machine (see the load average above) costs two processes more."

// perfResult is what the section reads of vrdma-perf's JSON.
type perfResult struct {
	GBytesPerS float64 `json:"gbytes_per_s"`
	LatAvg     float64 `json:"lat_us_avg"`
	Role       string  `json:"role"`
}

// perfTimeout bounds one vrdma-perf run.
const perfTimeout = 2 * time.Minute

// perfOne runs vrdma-perf with both devices in one process.
func perfOne(bin string, socks [2]string, args []string) (perfResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), perfTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--sockets", socks[0] + "," + socks[1]}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return perfResult{}, fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return lastResult(out)
}

// perfTwo runs vrdma-perf as a server on socks[1] and a client on
// socks[0], and returns the client's result.
func perfTwo(bin string, socks [2]string, args []string) (perfResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), perfTimeout)
	defer cancel()
	port, err := freeTCPPort()
	if err != nil {
		return perfResult{}, err
	}
	srv := exec.CommandContext(ctx, bin, append([]string{"--socket", socks[1], "-p", port}, args...)...)
	var srvErr bytes.Buffer
	srv.Stdout, srv.Stderr = io.Discard, &srvErr
	if err := srv.Start(); err != nil {
		return perfResult{}, err
	}
	cli := exec.CommandContext(ctx, bin, append(append([]string{"--socket", socks[0], "-p", port}, args...), "127.0.0.1")...)
	var cliErr bytes.Buffer
	cli.Stderr = &cliErr
	out, cerr := cli.Output()
	serr := srv.Wait()
	switch {
	case cerr != nil:
		return perfResult{}, fmt.Errorf("client: %v: %s", cerr, strings.TrimSpace(cliErr.String()))
	case serr != nil:
		return perfResult{}, fmt.Errorf("server: %v: %s", serr, strings.TrimSpace(srvErr.String()))
	}
	return lastResult(out)
}

// lastResult decodes the last JSON line of vrdma-perf's output.
func lastResult(out []byte) (perfResult, error) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var r perfResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return r, fmt.Errorf("vrdma-perf printed %q: %w", out, err)
	}
	return r, nil
}

// freeTCPPort returns a loopback port nothing listens on now.
func freeTCPPort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), nil
}
