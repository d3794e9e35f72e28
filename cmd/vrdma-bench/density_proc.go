package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/daemon"
)

// What the density section reads of a process: descriptor limits and
// counts, memory (/proc/PID/status) and CPU time (/proc/PID/stat and the
// threads' schedstat).

// fitsFds reports whether n connected devices fit the daemon's descriptor
// limit, given the empty daemon's fds and the fds per device.
func fitsFds(n, base int, perDev float64, limit uint64) bool {
	return float64(base)+float64(n)*perDev+densityFdMargin <= float64(limit)
}

// largestFit is the most devices that fit the limit (and daemon.MaxDevices).
func largestFit(base int, perDev float64, limit uint64) int {
	n := int((float64(limit) - float64(base) - densityFdMargin) / perDev)
	return max(0, min(n, daemon.MaxDevices))
}

// nofileHard is RLIMIT_NOFILE's hard limit, which vrdmad raises its soft
// limit to (raiseNofile) and which no unprivileged process can exceed.
func nofileHard() uint64 {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) != nil {
		return 0
	}
	return lim.Max
}

// raiseNofile lifts the soft RLIMIT_NOFILE to the hard limit, as vrdmad
// does.
func raiseNofile() {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &lim) == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	}
}

// /proc readers.

func countFds(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(ents), err
}

func readProcMem(pid int) (procMem, error) {
	var m procMem
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		x, _ := strconv.ParseUint(f[0], 10, 64)
		switch k {
		case "VmRSS":
			m.rss = x << 10
		case "RssAnon":
			m.anon = x << 10
		case "RssFile":
			m.file = x << 10
		case "RssShmem":
			m.shmem = x << 10
		case "VmPTE":
			m.pte = x << 10
		case "Threads":
			m.threads = int(x)
		}
	}
	if m.rss == 0 {
		return m, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
	}
	return m, nil
}

// cpuTicks is utime+stime from /proc/PID/stat, in clock ticks.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc/PID/stat")
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3, state
	if len(f) < 13 {
		return 0, errors.New("short /proc/PID/stat")
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return u + st, nil
}

// cpuNanos is the time every thread of pid has run, in ns, from
// /proc/PID/task/*/schedstat: the same as utime+stime at ns resolution,
// without what threads that exited had used (a Go process keeps its
// threads).
func cpuNanos(pid int) (uint64, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var sum uint64
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "schedstat"))
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		x, _ := strconv.ParseUint(f[0], 10, 64)
		sum += x
	}
	return sum, nil
}

// idleCPU measures pid's CPU use over d, in % of one core, from utime+stime
// and from schedstat.
func idleCPU(pid int, d time.Duration) (stat, nsec float64, err error) {
	t0, err := cpuTicks(pid)
	if err != nil {
		return 0, 0, err
	}
	n0, _ := cpuNanos(pid)
	start := time.Now()
	time.Sleep(d)
	t1, err := cpuTicks(pid)
	if err != nil {
		return 0, 0, err
	}
	n1, _ := cpuNanos(pid)
	el := time.Since(start).Seconds()
	return float64(t1-t0) / clkTck / el * 100, float64(n1-n0) / 1e9 / el * 100, nil
}
