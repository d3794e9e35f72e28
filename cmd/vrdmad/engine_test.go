package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/sched"
	"github.com/vrdma/vrdma/internal/controlapi"
)

func TestParseCPUList(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    []int
		wantErr string
	}{
		{"2", []int{2}, ""},
		{"2,3", []int{2, 3}, ""},
		{"2-5", []int{2, 3, 4, 5}, ""},
		{"0,4-6,2", []int{0, 4, 5, 6, 2}, ""},
		{" 1 , 3 ", []int{1, 3}, ""},
		{"1023", []int{1023}, ""},
		{"", nil, "not a CPU number"},
		{"1,", nil, "not a CPU number"},
		{"a", nil, "not a CPU number"},
		{"-1", nil, "not a CPU number"},
		{"+1", nil, "not a CPU number"},
		{"01", nil, "not a CPU number"},
		{"5-2", nil, "below"},
		{"1-", nil, "not a CPU number"},
		{"1-2-3", nil, "not a CPU number"},
		{"1,1", nil, "CPU 1 given twice"},
		{"0-3,2", nil, "CPU 2 given twice"},
		{"1024", nil, "want below 1024"},
		{"0-99999999", nil, "want below 1024"},
	} {
		got, err := parseCPUList(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || got != nil {
				t.Errorf("parseCPUList(%q): got %v, %v; want nil and an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseCPUList(%q): got %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func cpuSet(cpus ...int) *unix.CPUSet {
	var s unix.CPUSet
	for _, c := range cpus {
		s.Set(c)
	}
	return &s
}

// TestEngineConfig: --engine-threads and --engine-cpus against an
// affinity mask of CPUs 0-3 and 6.
func TestEngineConfig(t *testing.T) {
	mask := cpuSet(0, 1, 2, 3, 6)
	for _, tt := range []struct {
		threads int
		cpus    string
		want    sched.Config
		wantErr string
	}{
		{0, "", sched.Config{Workers: runtime.GOMAXPROCS(0)}, ""},
		{3, "", sched.Config{Workers: 3}, ""},
		{0, "2,3", sched.Config{Workers: 2, CPUs: []int{2, 3}}, ""},
		{0, "0-3,6", sched.Config{Workers: 5, CPUs: []int{0, 1, 2, 3, 6}}, ""},
		{5, "2-3", sched.Config{Workers: 5, CPUs: []int{2, 3}}, ""},
		{1, "6", sched.Config{Workers: 1, CPUs: []int{6}}, ""},
		{0, "4", sched.Config{}, `--engine-cpus "4": CPU 4 is not one vrdmad may use (its affinity mask allows 0-3,6)`},
		{0, "2-5", sched.Config{}, "CPU 4 is not one vrdmad may use"},
		{2, "1000", sched.Config{}, "CPU 1000 is not one vrdmad may use"},
		{0, "x", sched.Config{}, `--engine-cpus "x"`},
		{-1, "", sched.Config{}, "--engine-threads -1: want 0"},
		{sched.MaxWorkers + 1, "", sched.Config{}, fmt.Sprintf("--engine-threads %d", sched.MaxWorkers+1)},
	} {
		got, err := engineConfig(tt.threads, tt.cpus, mask)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("engineConfig(%d, %q): got %+v, %v; want an error with %q", tt.threads, tt.cpus, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("engineConfig(%d, %q): got %+v, %v; want %+v", tt.threads, tt.cpus, got, err, tt.want)
		}
	}
}

func TestFormatCPUSet(t *testing.T) {
	for _, tt := range []struct {
		set  *unix.CPUSet
		want string
	}{
		{cpuSet(), "none"},
		{cpuSet(0), "0"},
		{cpuSet(0, 1), "0-1"},
		{cpuSet(0, 1, 2, 5, 7, 8, 1023), "0-2,5,7-8,1023"},
	} {
		if got := formatCPUSet(tt.set); got != tt.want {
			t.Errorf("formatCPUSet: got %q, want %q", got, tt.want)
		}
	}
}

// outsideMask is a CPU number vrdmad's affinity mask does not hold.
func outsideMask(t *testing.T) int {
	t.Helper()
	set, err := affinity()
	if err != nil {
		t.Fatal(err)
	}
	for c := 0; c < maxCPUList; c++ {
		if !set.IsSet(c) {
			return c
		}
	}
	t.Skip("every CPU number is in the affinity mask")
	return -1
}

// TestEngineFlagErrors: bad engine flags stop the start before anything
// is served.
func TestEngineFlagErrors(t *testing.T) {
	dir := t.TempDir()
	sock, control := filepath.Join(dir, "x.sock"), filepath.Join(dir, "control.sock")
	out := outsideMask(t)
	for _, tt := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"CPU outside the mask", []string{"--engine-cpus", strconv.Itoa(out)}, fmt.Sprintf("CPU %d is not one vrdmad may use", out)},
		{"bad CPU list", []string{"--engine-cpus", "0-"}, "--engine-cpus"},
		{"negative threads", []string{"--engine-threads", "-2"}, "--engine-threads -2"},
		{"threads not a number", []string{"--engine-threads", "many"}, "invalid value"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--socket", sock, "--control", control, "--state-dir="}, tt.args...)
			err := run(args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("run(%q): got %v, want an error with %q", args, err, tt.wantErr)
			}
		})
	}
	for _, p := range []string{sock, control} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after failed starts: %v, want none", p, err)
		}
	}
}

// TestEngineThreads: a vrdmad started with --engine-threads (and
// --engine-cpus) logs its pool, reports it in GET /v1/health, and its
// pinned workers run on the CPU they were given.
func TestEngineThreads(t *testing.T) {
	mask, err := affinity()
	if err != nil {
		t.Fatal(err)
	}
	var allowed []int
	for c := 0; c < maxCPUList; c++ {
		if mask.IsSet(c) {
			allowed = append(allowed, c)
		}
	}
	last := allowed[len(allowed)-1]
	for _, tt := range []struct {
		name    string
		args    []string
		threads int
		pinned  int // -1: not pinned
	}{
		{"default", nil, runtime.GOMAXPROCS(0), -1},
		{"three", []string{"--engine-threads", "3"}, 3, -1},
		{"pinned", []string{"--engine-cpus", strconv.Itoa(last)}, 1, last},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			control := filepath.Join(dir, "control.sock")
			n := newNotifier(t)
			c := startVrdmad(t, startOpts{env: []string{"NOTIFY_SOCKET=" + n.path}},
				append([]string{"--control", control, "--state-dir="}, tt.args...)...)
			n.wait(t, c, "READY=1", 20*time.Second)
			h, err := controlapi.New(control).Health(context.Background())
			if err != nil || h.EngineThreads != tt.threads {
				t.Errorf("health: got %+v, %v; want engine_threads %d", h, err, tt.threads)
			}
			if want := fmt.Sprintf("engine_threads=%d", tt.threads); !c.logHas("engine pool started", 5*time.Second) || !strings.Contains(c.log(), want) {
				t.Errorf("log lacks the engine pool with %s:\n%s", want, c.log())
			}
			if tt.pinned >= 0 {
				if !strings.Contains(c.log(), fmt.Sprintf("engine_cpus=%d", tt.pinned)) {
					t.Errorf("log lacks engine_cpus=%d:\n%s", tt.pinned, c.log())
				}
				if len(allowed) > 1 && !threadPinned(t, c.cmd.Process.Pid, tt.pinned) {
					t.Errorf("no thread of vrdmad is pinned to CPU %d alone", tt.pinned)
				}
			}
			c.stop(t, n)
		})
	}
}

// threadPinned reports whether a thread of process pid may run on cpu
// only (Cpus_allowed_list in /proc/PID/task/TID/status).
func threadPinned(t *testing.T, pid, cpu int) bool {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("threads of %d: %v", pid, err)
	}
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok && strings.TrimSpace(v) == strconv.Itoa(cpu) {
				return true
			}
		}
	}
	return false
}
