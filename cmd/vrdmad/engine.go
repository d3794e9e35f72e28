package main

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/sched"
)

// maxCPUList bounds the entries of --engine-cpus (a CPU set holds 1024).
const maxCPUList = 1024

// engineConfig turns --engine-threads and --engine-cpus into the engine
// pool's configuration. allowed is the set of CPUs vrdmad may run on (its
// affinity mask); every CPU of --engine-cpus must be in it. threads 0
// means one worker per CPU of --engine-cpus when it is given, else
// runtime.GOMAXPROCS(0) (which follows the affinity mask).
func engineConfig(threads int, cpus string, allowed *unix.CPUSet) (sched.Config, error) {
	if threads < 0 || threads > sched.MaxWorkers {
		return sched.Config{}, fmt.Errorf("--engine-threads %d: want 0 (one per CPU vrdmad may use) to %d", threads, sched.MaxWorkers)
	}
	cfg := sched.Config{Workers: threads}
	if cpus == "" {
		if cfg.Workers == 0 {
			cfg.Workers = runtime.GOMAXPROCS(0)
		}
		return cfg, nil
	}
	list, err := parseCPUList(cpus)
	if err != nil {
		return sched.Config{}, fmt.Errorf("--engine-cpus %q: %w", cpus, err)
	}
	for _, c := range list {
		if !allowed.IsSet(c) {
			return sched.Config{}, fmt.Errorf("--engine-cpus %q: CPU %d is not one vrdmad may use (its affinity mask allows %s)", cpus, c, formatCPUSet(allowed))
		}
	}
	cfg.CPUs = list
	if cfg.Workers == 0 {
		cfg.Workers = len(list)
	}
	return cfg, nil
}

// parseCPUList parses a CPU list as the kernel writes one (cpuset(7)'s
// "list format"): comma-separated CPU numbers and inclusive ranges, "2,3",
// "2-5", "0,4-7". A CPU given twice is an error.
func parseCPUList(s string) ([]int, error) {
	var out []int
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := parseCPU(lo)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = parseCPU(hi); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("range %q: %d is below %d", part, b, a)
			}
		}
		for c := a; c <= b; c++ {
			if seen[c] {
				return nil, fmt.Errorf("CPU %d given twice", c)
			}
			seen[c] = true
			out = append(out, c)
		}
	}
	return out, nil
}

// parseCPU parses one CPU number, below maxCPUList.
func parseCPU(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || s != strconv.Itoa(n) {
		return 0, fmt.Errorf("%q is not a CPU number (want a list such as 2,3 or 2-5)", s)
	}
	if n >= maxCPUList {
		return 0, fmt.Errorf("CPU %d: want below %d", n, maxCPUList)
	}
	return n, nil
}

// formatCPUSet prints set in list format ("0-3,6").
func formatCPUSet(set *unix.CPUSet) string {
	var parts []string
	for c := 0; c < maxCPUList; c++ {
		if !set.IsSet(c) {
			continue
		}
		end := c
		for end+1 < maxCPUList && set.IsSet(end+1) {
			end++
		}
		if end == c {
			parts = append(parts, strconv.Itoa(c))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", c, end))
		}
		c = end
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// formatCPUList prints a list of CPUs as given ("2,3"), for the log.
func formatCPUList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// affinity is the set of CPUs vrdmad may run on.
func affinity() (*unix.CPUSet, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("read the CPU affinity mask: %w", err)
	}
	return &set, nil
}
