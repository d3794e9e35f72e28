package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// The density section's front-ends: child processes of this binary, each
// connecting up to a thousand virtio-user devices and answering the
// parent's commands on its standard input.

// feJob is the first thing a front-end process reads.
type feJob struct {
	Sockets []string `json:"sockets"`
	MemSize uint64   `json:"mem_size"`
}

// feReport is a front-end process's answer to each step.
type feReport struct {
	Phase     string  `json:"phase"`              // connected, queried, closed
	OK        int     `json:"ok"`                 // devices the step succeeded on
	Err       string  `json:"err,omitempty"`      // the first failure
	First     int64   `json:"first_ns,omitempty"` // connecting a device alone (median)
	Took      int64   `json:"took_ns"`            // the whole step
	Latencies []int64 `json:"lat_ns,omitempty"`   // each QUERY_DEVICE's answer time
}

// feProc is a running front-end process.
type feProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	enc    *json.Encoder
	dec    *json.Decoder
	stderr *lockedBuffer
	done   bool
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startFrontends starts ceil(len(socks)/perProc) front-end processes and
// gives each its share of the sockets; they connect at once.
func startFrontends(self string, socks []string, perProc int, mem uint64) ([]*feProc, error) {
	var fes []*feProc
	for chunk := range slices.Chunk(socks, perProc) {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), densityChildEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		fe := &feProc{cmd: cmd, stderr: &lockedBuffer{}}
		cmd.Stderr = fe.stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return fes, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fes, err
		}
		if err := cmd.Start(); err != nil {
			return fes, fmt.Errorf("front-end process: %w", err)
		}
		fe.stdin, fe.enc, fe.dec = in, json.NewEncoder(in), json.NewDecoder(out)
		fes = append(fes, fe)
		if err := fe.enc.Encode(feJob{Sockets: chunk, MemSize: mem}); err != nil {
			return fes, fmt.Errorf("front-end process: %w", err)
		}
	}
	return fes, nil
}

func (fe *feProc) send(cmd string) error {
	if err := fe.enc.Encode(cmd); err != nil {
		return fmt.Errorf("front-end process: %s: %w (%s)", cmd, err, strings.TrimSpace(fe.stderr.String()))
	}
	return nil
}

func (fe *feProc) await(phase string) (feReport, error) {
	var rep feReport
	if err := fe.dec.Decode(&rep); err != nil {
		return rep, fmt.Errorf("front-end process: waiting for %s: %w (%s)", phase, err, strings.TrimSpace(fe.stderr.String()))
	}
	if rep.Phase != phase {
		return rep, fmt.Errorf("front-end process: got %q, want %q", rep.Phase, phase)
	}
	return rep, nil
}

func (fe *feProc) wait() error {
	fe.stdin.Close()
	fe.done = true
	if err := fe.cmd.Wait(); err != nil {
		return fmt.Errorf("front-end process: %w (%s)", err, strings.TrimSpace(fe.stderr.String()))
	}
	return nil
}

func (fe *feProc) kill() {
	if fe.done {
		return
	}
	fe.done = true
	fe.stdin.Close()
	fe.cmd.Process.Kill()
	fe.cmd.Wait()
}

// feDevice is one device a front-end process holds.
type feDevice struct {
	c *verbs.Context
	f *frontend.Frontend
}

// frontendProcess is the front-end process: it connects every socket of
// the job, answers "query" (one QUERY_DEVICE per device, one at a time)
// and "close", and returns the exit status.
func frontendProcess(in io.Reader, out io.Writer) int {
	raiseNofile()
	dec, enc := json.NewDecoder(in), json.NewEncoder(out)
	var job feJob
	if err := dec.Decode(&job); err != nil {
		fmt.Fprintln(os.Stderr, "density front-end: job:", err)
		return 2
	}
	devs := make([]feDevice, len(job.Sockets))
	errs := make([]error, len(job.Sockets))
	open := func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		var err error
		if devs[i].c, devs[i].f, err = frontend.OpenRDMA(ctx, job.Sockets[i], job.MemSize); err != nil {
			errs[i] = fmt.Errorf("%s: %w", job.Sockets[i], err)
		}
	}
	rep := feReport{Phase: "connected"}
	start := time.Now()
	// The first few one at a time: the baseline, a device connecting
	// alone. Then the rest, densityParallel at once.
	alone := min(densitySerial, len(devs))
	var times []float64
	for i := range alone {
		t0 := time.Now()
		open(i)
		times = append(times, float64(time.Since(t0)))
	}
	rep.First = int64(median(times))
	var wg sync.WaitGroup
	next := make(chan int)
	for range densityParallel {
		wg.Go(func() {
			for i := range next {
				open(i)
			}
		})
	}
	for i := alone; i < len(devs); i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	rep.Took = int64(time.Since(start))
	report(&rep, errs)
	if enc.Encode(rep) != nil {
		return 2
	}

	for {
		var cmd string
		if err := dec.Decode(&cmd); err != nil || cmd == "close" {
			break // standard input closed: the parent is gone
		}
		if cmd != "query" {
			fmt.Fprintln(os.Stderr, "density front-end: unknown command", cmd)
			return 2
		}
		rep := feReport{Phase: "queried"}
		start := time.Now()
		clear(errs)
		for i, d := range devs {
			if d.c == nil {
				errs[i] = errors.New("not connected")
				continue
			}
			t0 := time.Now()
			if _, err := d.c.QueryDevice(); err != nil {
				errs[i] = fmt.Errorf("%s: QUERY_DEVICE: %w", job.Sockets[i], err)
				continue
			}
			rep.Latencies = append(rep.Latencies, int64(time.Since(t0)))
		}
		rep.Took = int64(time.Since(start))
		report(&rep, errs)
		if enc.Encode(rep) != nil {
			return 2
		}
	}

	rep = feReport{Phase: "closed"}
	start = time.Now()
	for _, d := range devs {
		if d.c != nil {
			d.c.Close()
		}
		if d.f != nil {
			d.f.Close()
			rep.OK++
		}
	}
	rep.Took = int64(time.Since(start))
	enc.Encode(rep)
	return 0
}

// report fills rep.OK and rep.Err from the per-device errors.
func report(rep *feReport, errs []error) {
	rep.OK = 0
	for _, err := range errs {
		if err == nil {
			rep.OK++
		} else if rep.Err == "" {
			rep.Err = err.Error()
		}
	}
}
