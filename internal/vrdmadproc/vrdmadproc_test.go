package vrdmadproc

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
)

// buildVrdmad builds ./cmd/vrdmad into dir. The go tool is on PATH under
// go test; a failed build fails the test (it is the code under test's
// subject, not an optional dependency).
func buildVrdmad(t *testing.T, dir string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go tool not found: %v", err)
	}
	bin := filepath.Join(dir, "vrdmad")
	cmd := exec.Command(gobin, "build", "-o", bin, "github.com/vrdma/vrdma/cmd/vrdmad")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/vrdmad: %v\n%s", err, out)
	}
	return bin
}

// gone reports whether pid no longer names a process (Stop reaps it, so
// the pid is free, not a zombie).
func gone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestVrdmad(t *testing.T) {
	bin := buildVrdmad(t, t.TempDir())
	ctx := context.Background()

	t.Run("start and stop", func(t *testing.T) {
		p, err := Start(ctx, Config{Binary: bin, Devices: []string{"vm1", "vm2"}})
		if err != nil {
			t.Fatal(err)
		}
		dir := p.Dir()
		if _, err := os.Stat(p.Control()); err != nil {
			t.Errorf("control socket: %v", err)
		}
		devs, err := p.Devices()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, d := range devs {
			got[d.ID] = d.Socket
		}
		for _, id := range []string{"vm1", "vm2"} {
			if want := filepath.Join(dir, id+".sock"); got[id] != want || p.Socket(id) != want {
				t.Errorf("device %s: daemon has socket %q, Socket says %q, want %q", id, got[id], p.Socket(id), want)
			}
		}
		if len(devs) != 2 {
			t.Errorf("got %d devices, want 2: %+v", len(devs), devs)
		}
		if h, err := p.Client().Health(ctx); err != nil || h.Status != "ok" {
			t.Errorf("GET /v1/health: got %+v, %v; want status ok", h, err)
		}
		if err := p.Stop(); err != nil {
			t.Fatalf("got %v, want a clean stop", err)
		}
		if log := p.Log(); !strings.Contains(log, "vrdmad serving") || !strings.Contains(log, "shutting down") {
			t.Errorf("log lacks the start and stop lines:\n%s", log)
		}
		if !gone(p.Pid()) {
			t.Errorf("pid %d still exists after Stop", p.Pid())
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("temporary directory after Stop: %v, want it removed", err)
		}
		if err := p.Stop(); err != nil {
			t.Errorf("second Stop: %v, want the first result (nil)", err)
		}
	})

	t.Run("caller's directory, more args, log level", func(t *testing.T) {
		dir := t.TempDir()
		sock := filepath.Join(dir, "x.sock")
		p, err := Start(ctx, Config{Binary: bin, Dir: dir, LogLevel: "warn", Args: []string{"--socket", "extra=" + sock}})
		if err != nil {
			t.Fatal(err)
		}
		devs, err := p.Devices()
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) != 1 || devs[0].ID != "extra" || devs[0].Socket != sock {
			t.Errorf("got devices %+v, want one, extra on %s", devs, sock)
		}
		if p.Control() != filepath.Join(dir, "control.sock") || p.Socket("extra") != "" {
			t.Errorf("Control %q, Socket(extra) %q", p.Control(), p.Socket("extra"))
		}
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("the caller's directory after Stop: %v, want it kept", err)
		}
		if strings.Contains(p.Log(), "level=info") {
			t.Errorf("--log-level warn: info lines in the log:\n%s", p.Log())
		}
	})

	t.Run("failing start reports the log", func(t *testing.T) {
		dir := t.TempDir()
		_, err := Start(ctx, Config{Binary: bin, Dir: dir, Args: []string{"--bogus"}})
		var e *Error
		if !errors.As(err, &e) || !errors.Is(err, ErrExited) || e.Op != "start" {
			t.Fatalf("got %v, want a start *Error matching ErrExited", err)
		}
		if !strings.Contains(e.Log, "-bogus") || !strings.Contains(err.Error(), "-bogus") {
			t.Errorf("the error lacks vrdmad's complaint: %q", err)
		}
		// Bad usage: status 2, as every vrdma program.
		if !strings.Contains(err.Error(), "exit status 2") {
			t.Errorf("the error lacks the exit status: %q", err)
		}
	})

	t.Run("kill, with a control socket of the caller's", func(t *testing.T) {
		dir := t.TempDir()
		control := filepath.Join(dir, "control-first.sock")
		p, err := Start(ctx, Config{Binary: bin, Dir: dir, Control: control, Devices: []string{"vm1"}})
		if err != nil {
			t.Fatal(err)
		}
		if p.Control() != control {
			t.Errorf("Control() = %q, want %q", p.Control(), control)
		}
		if _, err := p.Devices(); err != nil {
			t.Fatal(err)
		}
		if err := p.Kill(); err != nil {
			t.Fatalf("got %v, want nil for a SIGKILLed daemon", err)
		}
		if !gone(p.Pid()) {
			t.Errorf("pid %d still exists after Kill", p.Pid())
		}
		if strings.Contains(p.Log(), "shutting down") {
			t.Errorf("a killed daemon logged its shutdown:\n%s", p.Log())
		}
		if _, err := p.Devices(); err == nil {
			t.Error("the control API answers after Kill")
		}
		if err := p.Stop(); err != nil {
			t.Errorf("Stop after Kill: %v, want Kill's result (nil)", err)
		}
	})

	t.Run("add device", func(t *testing.T) {
		p, err := Start(ctx, Config{Binary: bin})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Stop()
		sock := filepath.Join(p.Dir(), "vm1.sock")
		info, err := p.AddDevice(ctx, controlapi.AddRequest{ID: "vm1", Socket: sock, GUID: "525400fffe000001", DoorbellQueues: 2})
		if err != nil {
			t.Fatal(err)
		}
		if info.ID != "vm1" || info.Socket != sock || info.GUID != "5254:00ff:fe00:0001" || info.NumQueues != 4 {
			t.Errorf("got %+v, want vm1 on %s, GUID 5254:00ff:fe00:0001, 4 queues", info, sock)
		}
		if _, err := os.Stat(sock); err != nil {
			t.Errorf("device socket: %v", err)
		}
		// The device is saved in the daemon's own state directory, never
		// the host's /var/lib/vrdma.
		if _, err := os.Stat(filepath.Join(p.Dir(), "state", "devices.json")); err != nil {
			t.Errorf("state file: %v, want it in Dir/state", err)
		}
		// A refusal carries the daemon's reason.
		_, err = p.AddDevice(ctx, controlapi.AddRequest{ID: "vm2", Socket: filepath.Join(p.Dir(), "vm2.sock"), GUID: "0054:00ff:fe00:0001"})
		if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "locally administered") {
			t.Errorf("got %v, want a 400 naming the bad GUID", err)
		}
		if _, err = p.AddDevice(ctx, controlapi.AddRequest{ID: "vm1", Socket: filepath.Join(p.Dir(), "vm3.sock")}); err == nil || !strings.Contains(err.Error(), "409") || !errors.Is(err, controlapi.ErrConflict) {
			t.Errorf("got %v, want a 409 (controlapi.ErrConflict) for a second vm1", err)
		}
	})

	t.Run("sigterm ends a started daemon with its devices gone", func(t *testing.T) {
		p, err := Start(ctx, Config{Binary: bin, Devices: []string{"vm1"}})
		if err != nil {
			t.Fatal(err)
		}
		sock := p.Socket("vm1")
		if err := p.Stop(); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Devices(); err == nil {
			t.Error("the control API answers after Stop")
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("device socket after Stop: %v", err)
		}
	})
}

// fake writes a shell script standing in for vrdmad.
func fake(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fake-vrdmad")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	for _, c := range strings.TrimSpace(string(b)) {
		if c < '0' || c > '9' {
			t.Fatalf("pid file %q", b)
		}
		pid = pid*10 + int(c-'0')
	}
	return pid
}

// A process that never serves the control API and ignores SIGTERM: Start
// gives up, kills it, and reports ErrNotReady with its log.
func TestNeverReadyIgnoresSigterm(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	bin := fake(t, `echo $$ >`+pidFile+`; echo "fake: args $*" >&2; trap '' TERM; exec sleep 600`)
	_, err := Start(context.Background(), Config{Binary: bin, Devices: []string{"d"},
		ReadyTimeout: 300 * time.Millisecond, StopTimeout: 300 * time.Millisecond})
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, ErrNotReady) {
		t.Fatalf("got %v, want an *Error matching ErrNotReady", err)
	}
	if !strings.Contains(e.Log, "fake: args --control ") || !strings.Contains(e.Log, " --socket d=") || !strings.Contains(e.Log, "--log-level info") {
		t.Errorf("log %q lacks the arguments", e.Log)
	}
	if pid := readPid(t, pidFile); !gone(pid) {
		t.Errorf("pid %d survives a failed start", pid)
	}
}

// launched starts script without waiting for a control API, and waits
// until it printed "ready" (its traps are set).
func launched(t *testing.T, script string) *Proc {
	t.Helper()
	p, err := launch(Config{Binary: fake(t, script), StopTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	for i := 0; !strings.Contains(p.Log(), "ready"); i++ {
		select {
		case <-p.exited:
			// Its standard error is read by a goroutine of its own:
			// what it wrote before it exited may still be in the pipe.
			select {
			case <-p.logDone:
			case <-time.After(5 * time.Second):
			}
			if strings.Contains(p.Log(), "ready") {
				return p
			}
			t.Fatalf("the script exited: %v\n%s", p.waitErr, p.Log())
		case <-time.After(10 * time.Millisecond):
		}
		if i > 3000 {
			t.Fatalf("the script did not start: %s", p.Log())
		}
	}
	return p
}

func TestStop(t *testing.T) {
	for _, tc := range []struct {
		name, script string
		want         error
		msg          string
	}{
		{"clean exit on SIGTERM", `trap 'exit 0' TERM; echo ready >&2; while :; do sleep 0.05; done`, nil, ""},
		{"exit status 3 on SIGTERM", `trap 'echo bye >&2; exit 3' TERM; echo ready >&2; while :; do sleep 0.05; done`, ErrExited, "exit status 3"},
		{"exited before Stop", `echo ready >&2; exit 4`, ErrExited, "exit status 4"},
		{"ignores SIGTERM", `trap '' TERM; echo ready >&2; exec sleep 600`, ErrStopTimeout, "killed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := launched(t, tc.script)
			if tc.msg == "exit status 4" {
				<-p.exited // exited before Stop, not racing with its SIGTERM
			}
			err := p.Stop()
			if (err == nil) != (tc.want == nil) || !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if err != nil {
				var e *Error
				if !errors.As(err, &e) || e.Op != "stop" || !strings.Contains(e.Log, "ready") || !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("got %q, want a stop *Error with %q and the log", err, tc.msg)
				}
			}
			if !gone(p.Pid()) {
				t.Errorf("pid %d survives Stop", p.Pid())
			}
			if _, err := os.Stat(p.Dir()); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("temporary directory after Stop: %v", err)
			}
		})
	}
}

func TestKillExited(t *testing.T) {
	p := launched(t, `echo ready >&2; exit 5`)
	<-p.exited
	err := p.Kill()
	var e *Error
	if !errors.As(err, &e) || e.Op != "kill" || !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "exit status 5") {
		t.Fatalf("got %v, want a kill *Error matching ErrExited with the status", err)
	}
	if err2 := p.Stop(); err2 != err {
		t.Errorf("Stop after Kill: %v, want Kill's result", err2)
	}
}

func TestStartCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Start(ctx, Config{Binary: fake(t, `echo started >&2; exec sleep 600`)})
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want a start *Error matching context.Canceled", err)
	}
}

func TestStartBadConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Binary: "/bin/true", Devices: []string{""}},
		{Binary: "/bin/true", Devices: []string{"a=b"}},
		{Binary: "/bin/true", Devices: []string{"a/b"}},
		{Binary: "/bin/true", Devices: []string{"a", "a"}},
	} {
		if p, err := Start(context.Background(), cfg); err == nil || p != nil {
			t.Errorf("Start(%+v): got %v, %v, want an error", cfg, p, err)
		}
	}
	_, err := Start(context.Background(), Config{Binary: filepath.Join(t.TempDir(), "missing")})
	var e *Error
	if !errors.As(err, &e) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing binary: got %v, want a start *Error matching ErrNotExist", err)
	}
}

func TestLogBuffer(t *testing.T) {
	l := &logBuffer{limit: 10}
	for _, s := range []string{"line one\n", "two\n", "three\n"} {
		if n, err := l.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v", s, n, err)
		}
	}
	if got, want := l.String(), "line one\nt\n[9 more bytes of the log dropped]\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	l = &logBuffer{limit: 100}
	l.Write([]byte("a\nb\n"))
	if got := l.String(); got != "a\nb\n" {
		t.Errorf("got %q, want everything under the limit", got)
	}
}

func TestHasFlag(t *testing.T) {
	tests := []struct {
		args []string
		want bool
	}{
		{nil, false},
		{[]string{"--state-dir", "/x"}, true},
		{[]string{"-state-dir=/x"}, true},
		{[]string{"--state-dir="}, true},
		{[]string{"--state-dirs", "/x"}, false},
		{[]string{"--socket", "state-dir"}, true}, // a value looking like the flag: conservative
	}
	for _, tt := range tests {
		if got := hasFlag(tt.args, "state-dir"); got != tt.want {
			t.Errorf("hasFlag(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}

func TestKnowsFlag(t *testing.T) {
	script := fake(t, `echo "  -state-dir DIR"; echo "  -log-level string"; exit 2`)
	if !knowsFlag(script, "state-dir") || !knowsFlag(script, "log-level") {
		t.Errorf("the flags the binary names are not known")
	}
	if knowsFlag(script, "metrics") {
		t.Errorf("a flag the binary does not name is known")
	}
	if knowsFlag(filepath.Join(t.TempDir(), "missing"), "state-dir") {
		t.Errorf("a missing binary knows a flag")
	}
}
