package hostniclab

// What vrdmad spends per work request (AgentSpec.Account), and the plain
// perftest server that serves a job without vrdma (AgentSpec.Plain): the
// two measurements of cmd/vrdma-bench's verbs section.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/internal/rxepair"
)

// Account is what a requester client process samples around its test
// (ClientSpec.Account): vrdmad's process and its metrics socket.
type Account struct {
	// Pid is vrdmad's process ID (in the same guest).
	Pid int `json:"pid"`
	// Metrics is vrdmad's --metrics unix socket.
	Metrics string `json:"metrics"`
}

// account is what a requester client samples (nil without Account).
func (a *agent) account() *Account {
	if !a.spec.Account {
		return nil
	}
	return &Account{Pid: a.d.Pid(), Metrics: a.metrics}
}

// Window is what vrdmad spent over one client's test: from just before
// its first post to just after its last completion (and roceinterop's
// local checks, which post nothing). The NIC's counters are the whole
// NIC's (every device of the vrdmad), which in a local pair's write job
// is this test's only traffic.
type Window struct {
	// WallNs is the window's wall-clock time.
	WallNs uint64 `json:"wall_ns"`
	// VrdmadCPUNs is vrdmad's CPU time in the window, user and system,
	// every thread's (ProcCPU).
	VrdmadCPUNs uint64 `json:"vrdmad_cpu_ns"`
	// Posted, PostNs and Completions are the host NIC's counters
	// (vrdma_hostnic_posted_work_requests_total, _post_seconds_total in
	// ns, _completions_total) over the window.
	Posted      uint64 `json:"posted"`
	PostNs      uint64 `json:"post_ns"`
	Completions uint64 `json:"completions"`
	// Memcpy64Ns and GetppidNs calibrate the guest's speed (under TCG
	// every nanosecond is inflated): a 64-byte copy and a null system
	// call, measured in the client process just after the window
	// (Calibrate).
	Memcpy64Ns float64 `json:"memcpy64_ns"`
	GetppidNs  float64 `json:"getppid_ns"`
}

// PerWQE returns vrdmad's CPU per posted work request and the part of it
// inside ibv_post_send/recv, in ns (zeros without posts).
func (w Window) PerWQE() (total, post float64) {
	if w.Posted == 0 {
		return 0, 0
	}
	return float64(w.VrdmadCPUNs) / float64(w.Posted), float64(w.PostNs) / float64(w.Posted)
}

// ProcCPU returns the CPU time (user and system) process pid has used: the
// sum of its threads' time on a CPU from /proc/PID/task/*/schedstat (ns;
// a thread that already exited no longer counts, and Go's threads rarely
// exit), or, without schedstat, utime+stime of /proc/PID/stat (clock
// ticks: 10 ms).
func ProcCPU(pid int) (time.Duration, error) {
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	if err == nil && len(tasks) > 0 {
		var sum uint64
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue // the thread ended
			}
			f := strings.Fields(string(b))
			if len(f) < 1 {
				continue
			}
			ns, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %q", t, b)
			}
			sum += ns
		}
		return time.Duration(sum), nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return statCPU(string(b))
}

// statCPU returns utime+stime of a /proc/PID/stat line (USER_HZ 100).
func statCPU(line string) (time.Duration, error) {
	// The command (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command", line)
	}
	f := strings.Fields(line[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: short", line)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("stat %q: %w", line, err)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// NICCounters are a host NIC's counters as vrdmad's metrics show them,
// summed over its NICs.
type NICCounters struct {
	Posted, PostNs, Completions uint64
	// NICs is how many host NICs the scrape listed.
	NICs int
}

// ScrapeNIC reads the vrdma_hostnic_* counters from vrdmad's metrics
// served on the unix socket path.
func ScrapeNIC(ctx context.Context, path string) (NICCounters, error) {
	c := http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}, Timeout: 30 * time.Second}
	req, err := http.NewRequestWithContext(ctx, "GET", "http://vrdmad/metrics", nil)
	if err != nil {
		return NICCounters{}, err
	}
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		return NICCounters{}, fmt.Errorf("scrape vrdmad's metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return NICCounters{}, fmt.Errorf("scrape vrdmad's metrics: status %d, %v", resp.StatusCode, err)
	}
	return ParseNICCounters(b)
}

// ParseNICCounters reads the vrdma_hostnic_* counters of a Prometheus text
// exposition; it fails when there are none (vrdmad runs no verbs device,
// or is too old to export them).
func ParseNICCounters(text []byte) (NICCounters, error) {
	var c NICCounters
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.HasPrefix(name, "vrdma_hostnic_") {
			continue
		}
		_, val, ok := strings.Cut(rest, "} ")
		if !ok {
			return c, fmt.Errorf("metrics line %q", line)
		}
		v, err := strconv.ParseFloat(strings.Fields(val)[0], 64)
		if err != nil || v < 0 {
			return c, fmt.Errorf("metrics line %q: %v", line, err)
		}
		switch name {
		case "vrdma_hostnic_posted_work_requests_total":
			c.Posted += uint64(v)
			c.NICs++
		case "vrdma_hostnic_post_seconds_total":
			c.PostNs += uint64(v * 1e9)
		case "vrdma_hostnic_completions_total":
			c.Completions += uint64(v)
		}
	}
	if c.NICs == 0 {
		return c, errors.New("vrdmad's metrics list no host NIC (vrdma_hostnic_posted_work_requests_total)")
	}
	return c, nil
}

// sample is one end of a Window.
type sample struct {
	at  time.Time
	cpu time.Duration
	nic NICCounters
}

// take samples vrdmad: at the window's start the metrics first (the
// scrape's own CPU then falls before the window), at its end the CPU
// first.
func (a Account) take(ctx context.Context, start bool) (sample, error) {
	var s sample
	var err error
	scrape := func() error {
		s.nic, err = ScrapeNIC(ctx, a.Metrics)
		return err
	}
	cpu := func() error {
		s.cpu, err = ProcCPU(a.Pid)
		s.at = time.Now()
		return err
	}
	steps := []func() error{scrape, cpu}
	if !start {
		steps = []func() error{cpu, scrape}
	}
	for _, f := range steps {
		if err := f(); err != nil {
			return s, err
		}
	}
	return s, nil
}

// window is what vrdmad spent between two samples.
func window(from, to sample) Window {
	return Window{WallNs: uint64(to.at.Sub(from.at)), VrdmadCPUNs: uint64(max(0, to.cpu-from.cpu)),
		Posted: to.nic.Posted - from.nic.Posted, PostNs: to.nic.PostNs - from.nic.PostNs,
		Completions: to.nic.Completions - from.nic.Completions}
}

// Calibrate measures, in this process, a 64-byte copy and a null system
// call (getppid), in ns of the thread's CPU time each (so that other load
// on the machine does not count): the guest's speed beside which a
// per-WQE cost measured in it can be read, and the same on the host.
func Calibrate() (memcpy64, getppid float64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu := func() time.Duration {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			return 0
		}
		return time.Duration(ts.Nano())
	}
	var src [64]byte
	buf := make([]byte, 64<<10) // 1024 slots: the copy stays in the cache
	const copies = 1 << 21
	t := cpu()
	for i := range copies {
		src[0] = byte(i)
		off := (i & 1023) * 64
		copy(buf[off:off+64], src[:])
	}
	memcpy64 = float64(cpu()-t) / copies
	sink = buf[0]
	const calls = 1 << 14
	t = cpu()
	for range calls {
		syscall.Getppid()
	}
	getppid = float64(cpu()-t) / calls
	return memcpy64, getppid
}

// sink keeps Calibrate's copies from being optimised away.
var sink byte

// PlainProgram is the perftest program that serves job without vrdma.
func PlainProgram(op pftexchange.Op) (string, error) {
	switch op {
	case pftexchange.WriteBW, pftexchange.ReadBW, pftexchange.SendBW, pftexchange.AtomicBW:
		return "ib_" + string(op), nil
	}
	return "", fmt.Errorf("%s: no plain perftest server for it", op)
}

// PlainArgs are the plain perftest server's arguments on dev: the flags
// guest/perftest-jobs gives guest B's client (rxe-init's rxe.gid, the
// IPv4 GID), so the two match.
func PlainArgs(job roceinterop.Job, dev string) []string {
	args := []string{"-d", dev, "-i", "1", "-x", strconv.Itoa(rxepair.GIDIPv4), "-F", "-s", strconv.Itoa(job.Size),
		"-n", strconv.Itoa(job.Iters)}
	return append(args, "--report_gbits")
}

// plain serves job with Debian's perftest on the RDMA device itself (no
// vrdma): guest B's perftest client runs the job against it, and its own
// figure is the NIC's throughput without the para-virtual layer.
func (a *agent) plain(ctx context.Context, s string) (JobResult, error) {
	job, err := roceinterop.ParseJob(s)
	if err != nil {
		return JobResult{Role: ResultRole, Job: s, Plain: true}, err
	}
	res := a.result(job)
	res.Plain = true
	if a.spec.RDMADev == "" {
		return res, errors.New("a plain perftest server needs the RDMA device (a verbs RNIC)")
	}
	prog, err := PlainProgram(job.Op)
	if err != nil {
		return res, err
	}
	fmt.Fprintf(a.stderr, "hostnic: %s served by %s on %s itself (no vrdma)\n", job, prog, a.spec.RDMADev)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog, PlainArgs(job, a.spec.RDMADev)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return res, fmt.Errorf("%s %s: %w\n%s", prog, strings.Join(cmd.Args[1:], " "), err, tailString(out.String(), 1500))
	}
	res.Checks = append(res.Checks, fmt.Sprintf("%s %s on %s served guest B's client and exited 0 (no vrdma)",
		prog, strings.Join(cmd.Args[1:], " "), a.spec.RDMADev))
	if err := a.cleanedUp(ctx, &res); err != nil {
		return res, err
	}
	res.Verified = true
	return res, nil
}

// tailString returns the last n bytes of s.
func tailString(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
