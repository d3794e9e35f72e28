package main

// The density section (issue 14, item 4: "10,000 devices in one daemon"):
// how many connected, idle devices one vrdmad holds, and what each costs
// it. A vrdmad (built from this tree) serves N devices; front-end
// processes — this executable again, started with densityChildEnv set —
// connect to every device through virtio-user (vmm/frontend: one doorbell
// queue, a small memfd guest each), so the front-ends' descriptors are
// never counted in the daemon's table. The section reports the connect
// rate, the daemon's descriptors and RSS per device over an empty daemon
// started in the same run, the daemon's CPU while every device sits idle,
// and whether every device still answers a control command (QUERY_DEVICE).
// densityTest checks the same run's behaviour (density_test.go).

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Descriptors the daemon holds per device, as backend/doc.go ("Cost of a
// device") counts them: the listening socket, and while a front-end is
// connected its vhost-user socket, its backend channel, a kick and an
// error eventfd per virtqueue (control, event, one doorbell queue) and a
// call eventfd per queue that interrupts (not the doorbell queue), and
// the guest memory region's file, which the daemon keeps after mapping it
// so that a live upgrade can hand it to the next process (the front-end
// does not send it again).
const (
	densityListenFds = 1
	densityQueues    = abi.FirstDoorbellQueue + 1
	densityRegions   = 1 // vmm/frontend's guest memory is one memfd
	// 12 per device
	densityDeviceFds = densityListenFds + 2 + 2*densityQueues + abi.FirstDoorbellQueue + densityRegions
)

const (
	// densityChildEnv makes this executable a front-end process of the
	// density section instead of the benchmark (see init below).
	densityChildEnv = "VRDMA_BENCH_DENSITY_FRONTENDS"
	// densityPerProc bounds the devices of one front-end process: each
	// holds 13 descriptors there (socket, memfd and its mapping's copy,
	// nine eventfds, backend channel), and a process may open
	// RLIMIT_NOFILE of them (20000 on the machines this runs on).
	densityPerProc = 1000
	// densityGuestMem is each device's guest memory: rings, event buffers
	// and the command scratch of vmm/frontend fit in 2 MiB.
	densityGuestMem = 2 << 20
	// densityParallel is how many devices a front-end process connects at
	// once, after the first densitySerial one at a time.
	densityParallel = 8
	densitySerial   = 20
	// densityFdMargin is what the daemon needs beyond its devices' fds
	// for the control API, logs and the runtime, when judging whether N
	// devices fit its RLIMIT_NOFILE.
	densityFdMargin = 64
	// clkTck is USER_HZ, the unit of utime and stime in /proc/PID/stat
	// (100 on every Linux architecture Go supports).
	clkTck = 100
)

// init turns this process into a front-end process when the density
// section (or its test) started it so: the job comes on standard input,
// reports go to standard output, and the process exits when told to or
// when its parent goes away (standard input closed).
func init() {
	if os.Getenv(densityChildEnv) == "" {
		return
	}
	os.Exit(frontendProcess(os.Stdin, os.Stdout))
}

// densityConfig is one density measurement's setup.
type densityConfig struct {
	vrdmad   string        // vrdmad binary
	self     string        // this executable, run as the front-end processes
	perProc  int           // devices per front-end process; zero: densityPerProc
	memSize  uint64        // guest memory per device; zero: densityGuestMem
	idle     time.Duration // window over which idle CPU is measured
	settle   time.Duration // pause before reading the daemon's memory
	progress func(format string, a ...any)
}

func (c densityConfig) logf(format string, a ...any) {
	if c.progress != nil {
		c.progress(format, a...)
	}
}

// procMem is what /proc/PID/status says about a process's memory, in bytes.
type procMem struct {
	rss, anon, file, shmem uint64
	pte                    uint64 // page tables (VmPTE): kernel memory, not in VmRSS
	threads                int
}

// densityBase is the empty daemon: no device.
type densityBase struct {
	fds          int
	mem          procMem
	cpu, cpuNsec float64 // idle CPU, % of one core (stat ticks; schedstat ns)
	stopErr      error
}

// densityRun is one measurement with n devices.
type densityRun struct {
	n, procs   int
	connected  int
	rate       float64 // devices/s, every front-end process at once
	aloneRate  float64 // devices/s, one device connected alone (median of densitySerial)
	fdsListen  int     // the daemon's fds with n devices listening
	fdsConn    int     // … with n devices connected
	fdsAfter   int     // … once the front-ends are gone
	listen     procMem // the daemon with n devices listening
	conn       procMem // … connected, after the idle window
	cpu        float64 // idle CPU with n devices connected, % of one core, from utime+stime
	cpuNsec    float64 // the same from the threads' schedstat (ns resolution)
	answered   int
	p50, p99   time.Duration
	firstErr   string // the first front-end failure
	leakErr    error  // the fd count did not come back
	stopErr    error  // vrdmad did not exit cleanly
	vrdmadLog  string
	frontStats []feReport
}

// perDevice returns (x - base) / n.
func perDevice(x, base uint64, n int) float64 { return (float64(x) - float64(base)) / float64(n) }

// measureEmpty runs a vrdmad without devices for the baseline.
func measureEmpty(cfg densityConfig) (densityBase, error) {
	var b densityBase
	p, err := startVrdmad(cfg, nil)
	if err != nil {
		return b, err
	}
	defer p.Kill()
	pid := p.Pid()
	time.Sleep(cfg.settle)
	if b.cpu, b.cpuNsec, err = idleCPU(pid, cfg.idle); err != nil {
		return b, err
	}
	if b.fds, err = countFds(pid); err != nil {
		return b, err
	}
	if b.mem, err = readProcMem(pid); err != nil {
		return b, err
	}
	b.stopErr = p.Stop()
	return b, nil
}

func startVrdmad(cfg densityConfig, ids []string) (*vrdmadproc.Proc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: cfg.vrdmad, Devices: ids, StateDir: vrdmadproc.NoState,
		LogLevel: "warn", ReadyTimeout: 5 * time.Minute, StopTimeout: 2 * time.Minute})
}

// measureDensity starts a vrdmad with n devices, connects every device
// from front-end processes, measures, disconnects them and stops vrdmad.
// An error means the measurement could not be made; what it measured
// (answers, leaks, exit status) is in the result.
func measureDensity(cfg densityConfig, n int) (densityRun, error) {
	r := densityRun{n: n}
	perProc := cfg.perProc
	if perProc <= 0 {
		perProc = densityPerProc
	}
	mem := cfg.memSize
	if mem == 0 {
		mem = densityGuestMem
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("d%05d", i)
	}
	cfg.logf("density: vrdmad with %d devices", n)
	p, err := startVrdmad(cfg, ids)
	if err != nil {
		return r, err
	}
	stopped := false
	defer func() {
		if !stopped {
			p.Kill()
		}
	}()
	pid := p.Pid()
	time.Sleep(cfg.settle)
	if r.fdsListen, err = countFds(pid); err != nil {
		return r, err
	}
	if r.listen, err = readProcMem(pid); err != nil {
		return r, err
	}

	socks := make([]string, n)
	for i, id := range ids {
		socks[i] = p.Socket(id)
	}
	cfg.logf("density: connecting %d devices from %d front-end processes", n, (n+perProc-1)/perProc)
	fes, err := startFrontends(cfg.self, socks, perProc, mem)
	defer func() {
		for _, fe := range fes {
			fe.kill()
		}
	}()
	if err != nil {
		return r, err
	}
	r.procs = len(fes)
	var longest time.Duration
	var alone []float64
	for _, fe := range fes {
		rep, err := fe.await("connected")
		if err != nil {
			return r, err
		}
		r.connected += rep.OK
		if rep.Err != "" && r.firstErr == "" {
			r.firstErr = rep.Err
		}
		longest = max(longest, time.Duration(rep.Took))
		if rep.First > 0 {
			alone = append(alone, time.Duration(rep.First).Seconds())
		}
	}
	if longest > 0 {
		r.rate = float64(r.connected) / longest.Seconds()
	}
	if m := median(alone); m > 0 {
		r.aloneRate = 1 / m
	}

	time.Sleep(cfg.settle)
	if r.fdsConn, err = countFds(pid); err != nil {
		return r, err
	}
	cfg.logf("density: %d devices connected, %d daemon fds; %v idle", r.connected, r.fdsConn, cfg.idle)
	if r.cpu, r.cpuNsec, err = idleCPU(pid, cfg.idle); err != nil {
		return r, err
	}
	if r.conn, err = readProcMem(pid); err != nil {
		return r, err
	}

	// One front-end process at a time, one command at a time: each answer
	// time is a sleeping control queue's wake-up, not a queue behind
	// other devices' commands.
	var lat []time.Duration
	for _, fe := range fes {
		if err := fe.send("query"); err != nil {
			return r, err
		}
		rep, err := fe.await("queried")
		if err != nil {
			return r, err
		}
		r.answered += rep.OK
		if rep.Err != "" && r.firstErr == "" {
			r.firstErr = rep.Err
		}
		for _, l := range rep.Latencies {
			lat = append(lat, time.Duration(l))
		}
	}
	slices.Sort(lat)
	r.p50, r.p99 = percentile(lat, 50), percentile(lat, 99)

	cfg.logf("density: disconnecting")
	for _, fe := range fes {
		if err := fe.send("close"); err != nil {
			return r, err
		}
	}
	for _, fe := range fes {
		rep, err := fe.await("closed")
		if err != nil {
			return r, err
		}
		r.frontStats = append(r.frontStats, rep)
		if err := fe.wait(); err != nil {
			return r, err
		}
	}
	// Sessions are torn down asynchronously: wait for the daemon to be
	// back at its listening descriptors.
	deadline := time.Now().Add(time.Minute)
	for {
		if r.fdsAfter, err = countFds(pid); err != nil {
			return r, err
		}
		if r.fdsAfter <= r.fdsListen {
			break
		}
		if time.Now().After(deadline) {
			r.leakErr = fmt.Errorf("daemon holds %d fds a minute after the front-ends left, %d before they came", r.fdsAfter, r.fdsListen)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopped = true
	r.stopErr = p.Stop()
	r.vrdmadLog = p.Log()
	return r, nil
}

// Front-end processes.

// buildVrdmad builds ./cmd/vrdmad of this module into dir.
func buildVrdmad(dir string) (string, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, "vrdmad")
	cmd := exec.Command(gobin, "build", "-o", bin, "github.com/vrdma/vrdma/cmd/vrdmad")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/vrdmad: %w\n%s", err, out)
	}
	return bin, nil
}

// parseCounts parses the --density list.
func parseCounts(s string) ([]int, error) {
	var ns []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--density %q: want device counts ≥ 1, comma-separated", s)
		}
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return slices.Compact(ns), nil
}

// densitySection measures the daemon empty and with each count of devices
// that fits this machine, then the largest count that fits when a larger
// one was asked for.
func densitySection(o options, w io.Writer) (section, error) {
	sec := section{title: "Density: idle devices in one vrdmad",
		intro: fmt.Sprintf("One vrdmad (a separate process, built from this tree) serves N devices; front-end processes "+
			"(this binary again, ≤ %d devices each, so their descriptors are not the daemon's) connect every device "+
			"through virtio-user: control, event and one doorbell queue, %s of memfd guest memory each; %d devices "+
			"one at a time (the connect baseline), then %d at once per process. Then the daemon sits idle for %v with all connected, every device answers one "+
			"QUERY_DEVICE (one at a time), and the front-ends disconnect. Per-device figures are deltas over an "+
			"empty vrdmad started in the same run (no device). Targets (issue 14): 10,000 devices, ≤ 0.2 MiB "+
			"each, idle CPU ≤ 1 %% of one core, every device answering.",
			densityPerProc, sizeName(densityGuestMem), densitySerial, densityParallel, o.densityIdle)}
	counts, err := parseCounts(o.density)
	if err != nil {
		return sec, err
	}
	if len(counts) == 0 {
		sec.notes = append(sec.notes, "Not measured in this run (--density is empty).")
		return sec, nil
	}
	dir, err := os.MkdirTemp("", "vrdma-density-")
	if err != nil {
		return sec, err
	}
	defer os.RemoveAll(dir)
	progress(w, "density: building vrdmad")
	bin, err := buildVrdmad(dir)
	if err != nil {
		sec.notes = append(sec.notes, "Not measured in this run: "+firstLine(err, nil)+".")
		return sec, nil
	}
	self, err := os.Executable()
	if err != nil {
		return sec, err
	}
	cfg := densityConfig{vrdmad: bin, self: self, idle: o.densityIdle, settle: time.Second,
		progress: func(f string, a ...any) { progress(w, f, a...) }}
	progress(w, "density: empty vrdmad, %v idle", cfg.idle)
	base, err := measureEmpty(cfg)
	if err != nil {
		return sec, fmt.Errorf("density: empty daemon: %w", err)
	}
	limit := nofileHard()
	perDev := float64(densityDeviceFds)
	var runs []densityRun
	var skipped []string
	measured := func(n int) bool {
		return slices.ContainsFunc(runs, func(r densityRun) bool { return r.n == n })
	}
	run := func(n int) error {
		r, err := measureDensity(cfg, n)
		if err != nil {
			return fmt.Errorf("density %d: %w", n, err)
		}
		if r.connected > 0 {
			perDev = max(perDev, float64(r.fdsConn-base.fds)/float64(r.connected))
		}
		runs = append(runs, r)
		return nil
	}
	largest := 0
	for _, n := range counts {
		switch {
		case n > daemon.MaxDevices:
			skipped = append(skipped, fmt.Sprintf("N = %d: vrdmad serves at most %d devices (internal/daemon.MaxDevices); "+
				"it would need about %.0f descriptors", n, daemon.MaxDevices, float64(base.fds)+float64(n)*perDev))
		case !fitsFds(n, base.fds, perDev, limit):
			skipped = append(skipped, fmt.Sprintf("N = %d: needs about %.0f descriptors (%.1f per device), the daemon may "+
				"open %d (RLIMIT_NOFILE hard limit on this machine)", n, float64(base.fds)+float64(n)*perDev, perDev, limit))
		default:
			if err := run(n); err != nil {
				return sec, err
			}
			largest = n
		}
	}
	if len(skipped) > 0 {
		if n := largestFit(base.fds, perDev, limit); n > largest && !measured(n) {
			progress(w, "density: the largest N that fits, %d", n)
			if err := run(n); err != nil {
				return sec, err
			}
		}
	}
	slices.SortFunc(runs, func(a, b densityRun) int { return a.n - b.n })
	for _, r := range runs {
		sec.rows = append(sec.rows, densityRows(base, r)...)
	}
	sec.notes = append(sec.notes, densityTable(base, runs))
	if len(skipped) > 0 {
		sec.notes = append(sec.notes, "Not measured: "+strings.Join(skipped, "; ")+".")
	}
	var problems []string
	for _, r := range runs {
		problems = append(problems, r.problems()...)
	}
	if len(problems) > 0 {
		sec.notes = append(sec.notes, "Problems: "+strings.Join(problems, "; ")+".")
	}
	sec.notes = append(sec.notes, verdict(sec.rows, densityMiss))
	// The text report prints a table's rows only: the raw figures and
	// what was not measured go to the terminal here.
	for _, n := range sec.notes {
		fmt.Fprintln(w, n)
	}
	return sec, nil
}

// problems lists what went wrong in a run besides its figures.
func (r densityRun) problems() []string {
	var p []string
	if r.firstErr != "" {
		p = append(p, fmt.Sprintf("N = %d: %s", r.n, r.firstErr))
	}
	if r.leakErr != nil {
		p = append(p, fmt.Sprintf("N = %d: %v", r.n, r.leakErr))
	}
	if r.stopErr != nil {
		p = append(p, fmt.Sprintf("N = %d: vrdmad did not exit cleanly: %s", r.n, firstLine(r.stopErr, nil)))
	}
	return p
}

const mib = 1 << 20

func densityRows(base densityBase, r densityRun) []row {
	n := r.n
	name := func(s string) string { return fmt.Sprintf("%d devices: %s", n, s) }
	cpu, baseCPU, how := r.cpu, base.cpu, "utime+stime"
	if cpu == 0 || baseCPU == 0 {
		// Less than one clock tick in the window: the threads' schedstat
		// has the resolution to tell.
		cpu, baseCPU, how = r.cpuNsec, base.cpuNsec, "schedstat"
	}
	rssDev := perDevice(r.conn.rss, base.mem.rss, n) / mib
	return []row{
		{name: name("connect"), figure: r.rate, unit: "devices/s", baseName: "a device alone", baseline: r.aloneRate,
			baseUnit: "devices/s"},
		{name: name("daemon fds per device"), figure: float64(r.fdsConn-base.fds) / float64(n), unit: "fds",
			baseName: "listening only", baseline: float64(r.fdsListen-base.fds) / float64(n), baseUnit: "fds",
			target: fmt.Sprintf("≤ %d", densityDeviceFds), met: boolp(r.fdsConn-base.fds <= densityDeviceFds*n)},
		{name: name("daemon RSS per device"), figure: rssDev, unit: "MiB", baseName: "listening only",
			baseline: perDevice(r.listen.rss, base.mem.rss, n) / mib, baseUnit: "MiB", target: "≤ 0.2 MiB",
			met: boolp(rssDev <= 0.2)},
		{name: name("idle daemon CPU (" + how + ")"), figure: cpu, unit: "% of a core", baseName: "empty vrdmad",
			baseline: baseCPU, baseUnit: "%", target: "≤ 1 %", met: boolp(cpu <= 1)},
		{name: name("QUERY_DEVICE answered"), figure: float64(r.answered), unit: "devices", baseName: "devices",
			baseline: float64(n), baseUnit: "", target: "all", met: boolp(r.answered == n)},
		{name: name("QUERY_DEVICE answer p99"), figure: float64(r.p99) / 1e3, unit: "µs", baseName: "p50",
			baseline: float64(r.p50) / 1e3, baseUnit: "µs", invRatio: true},
	}
}

// densityTable is every run's raw figures in one preformatted table.
func densityTable(base densityBase, runs []densityRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Raw figures (empty vrdmad: %d fds, VmRSS %.1f MiB, RssAnon %.1f MiB, %d threads, idle CPU %.2f %% "+
		"by utime+stime, %.3f %% by schedstat):\n\n```\n", base.fds, float64(base.mem.rss)/mib, float64(base.mem.anon)/mib,
		base.mem.threads, base.cpu, base.cpuNsec)
	fmt.Fprintf(&b, "%6s %5s %9s %7s %7s %6s %9s %9s %9s %9s %9s %7s %7s %7s %9s %9s %9s %s\n",
		"N", "procs", "connected", "dev/s", "fds", "fds/N", "RSS MiB", "RSS/N KiB", "Anon/N", "Shmem/N", "PTE/N", "threads",
		"cpu %", "cpu ns%", "answered", "p50 µs", "p99 µs", "fds after / listening, exit")
	for _, r := range runs {
		exit := "clean"
		if r.stopErr != nil {
			exit = "UNCLEAN"
		}
		fmt.Fprintf(&b, "%6d %5d %9d %7.0f %7d %6.2f %9.1f %9.1f %9.1f %9.1f %9.1f %7d %7.2f %7.3f %9d %9.0f %9.0f %d / %d, %s\n",
			r.n, r.procs, r.connected, r.rate, r.fdsConn, float64(r.fdsConn-base.fds)/float64(r.n),
			float64(r.conn.rss)/mib, perDevice(r.conn.rss, base.mem.rss, r.n)/1024,
			perDevice(r.conn.anon, base.mem.anon, r.n)/1024, perDevice(r.conn.shmem, base.mem.shmem, r.n)/1024,
			perDevice(r.conn.pte, base.mem.pte, r.n)/1024,
			r.conn.threads, r.cpu, r.cpuNsec, r.answered, float64(r.p50)/1e3, float64(r.p99)/1e3,
			r.fdsAfter, r.fdsListen, exit)
	}
	b.WriteString("```")
	return b.String()
}

const densityMiss = "What bounds N is descriptors, then internal/daemon.MaxDevices, before memory or CPU: a connected " +
	"device holds 11 descriptors (backend/doc.go, \"Cost of a device\"), so 10,000 devices need about 110,000 " +
	"(vrdmad.service sets LimitNOFILE=1048576; a shell's hard limit may be far lower), and one vrdmad serves at most " +
	"internal/daemon.MaxDevices devices."
