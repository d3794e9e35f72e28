package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
)

// waitStatus returns the next notification whose STATUS= holds sub.
func (n *notifier) waitStatus(t *testing.T, c *child, sub string) string {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case m, ok := <-n.msgs:
			if !ok {
				t.Fatalf("notify socket closed before a STATUS with %q\n%s", sub, c.log())
			}
			for _, line := range strings.Split(m, "\n") {
				if strings.HasPrefix(line, "STATUS=") && strings.Contains(line, sub) {
					return line
				}
			}
		case <-c.exited:
			t.Fatalf("vrdmad exited (%v) before a STATUS with %q\n%s", c.err, sub, c.log())
		case <-deadline:
			t.Fatalf("no STATUS with %q\n%s", sub, c.log())
		}
	}
}

// TestCorruptStateServesDegraded: a start that finds an unusable state
// file moves it aside and serves, degraded — in the log (error level,
// naming the file and the copy), in GET /v1/health and in STATUS= —
// until POST /v1/health/ack; STATUS= follows.
func TestCorruptStateServesDegraded(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	path := filepath.Join(state, daemon.StateFile)
	if err := os.MkdirAll(state, 0o750); err != nil {
		t.Fatal(err)
	}
	garbage := []byte(`{"version": 1, "devices": [{"id": "vm1", "socket": "/run/vm1.sock"`)
	if err := os.WriteFile(path, garbage, 0o600); err != nil {
		t.Fatal(err)
	}
	control := filepath.Join(dir, "control.sock")
	n := newNotifier(t)
	c := startVrdmad(t, startOpts{env: []string{"NOTIFY_SOCKET=" + n.path}}, "--control", control, "--state-dir", state)
	ready := n.wait(t, c, "READY=1", 20*time.Second)
	kept, _ := filepath.Glob(path + ".corrupt-*")
	if len(kept) != 1 {
		t.Fatalf("kept copies: %q, want one", kept)
	}
	if b, _ := os.ReadFile(kept[0]); !bytes.Equal(b, garbage) {
		t.Errorf("kept copy holds %q, want the original", b)
	}
	if !strings.Contains(ready, "STATUS=serving 0 devices; degraded: an unusable state file was set aside as "+kept[0]) {
		t.Errorf("READY datagram %q: want a degraded STATUS naming %s", ready, kept[0])
	}
	if !c.logHas("level=error", 5*time.Second) || !strings.Contains(c.log(), path) || !strings.Contains(c.log(), kept[0]) {
		t.Errorf("log lacks an error naming %s and %s:\n%s", path, kept[0], c.log())
	}
	cl := controlapi.New(control)
	ctx := context.Background()
	h, err := cl.Health(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.Status != controlapi.StatusDegraded || len(h.Problems) != 1 || h.Problems[0].File != kept[0] {
		t.Fatalf("health %+v: want degraded, the problem naming %s", h, kept[0])
	}
	a, err := cl.Ack(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Acknowledged) != 1 || a.Health.Status != controlapi.StatusOK {
		t.Errorf("ack: %+v, want one problem acknowledged and status ok", a)
	}
	n.waitStatus(t, c, "serving 0 devices")
	if !c.logHas("health problems acknowledged", 5*time.Second) {
		t.Errorf("log lacks the acknowledgement:\n%s", c.log())
	}
	c.stop(t, n)
}

// TestSIGHUP: SIGHUP does not end vrdmad; it rewrites the state file, so
// an operator who made the state directory writable again clears the
// save failure at once (health and STATUS= follow). Meanwhile a removal
// that could not be saved succeeds with a warning.
func TestSIGHUP(t *testing.T) {
	dir := t.TempDir()
	state, control := filepath.Join(dir, "state"), filepath.Join(dir, "control.sock")
	n := newNotifier(t)
	c := startVrdmad(t, startOpts{env: []string{"NOTIFY_SOCKET=" + n.path}}, "--control", control, "--state-dir", state)
	n.wait(t, c, "READY=1", 20*time.Second)
	cl := controlapi.New(control)
	ctx := context.Background()
	for _, id := range []string{"vm1", "vm2"} {
		if _, err := cl.AddDevice(ctx, controlapi.AddRequest{ID: id, Socket: filepath.Join(dir, id+".sock")}); err != nil {
			t.Fatal(err)
		}
	}
	n.waitStatus(t, c, "serving 2 devices")
	if err := c.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !c.logHas("SIGHUP: state file rewritten", 10*time.Second) {
		t.Fatalf("log lacks the SIGHUP line:\n%s", c.log())
	}

	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	rm, err := cl.RemoveDevice(ctx, "vm2")
	if err != nil || !rm.StillListed || !strings.Contains(rm.Warning, "still lists it") {
		t.Fatalf("DELETE vm2 unsaved: %+v, %v; want success with still_listed and a warning", rm, err)
	}
	n.waitStatus(t, c, "serving 1 devices; degraded: cannot write "+filepath.Join(state, daemon.StateFile))
	if h, err := cl.Health(ctx); err != nil || h.Status != controlapi.StatusDegraded {
		t.Fatalf("health after the failed save: %+v, %v; want degraded", h, err)
	}
	if err := os.MkdirAll(state, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if s := n.waitStatus(t, c, "serving 1 devices"); s != "STATUS=serving 1 devices" {
		t.Errorf("STATUS after SIGHUP: %q, want serving 1 devices and nothing else", s)
	}
	if h, err := cl.Health(ctx); err != nil || h.Status != controlapi.StatusOK {
		t.Errorf("health after SIGHUP: %+v, %v; want ok", h, err)
	}
	b, err := os.ReadFile(filepath.Join(state, daemon.StateFile))
	if err != nil || !bytes.Contains(b, []byte(`"vm1"`)) || bytes.Contains(b, []byte(`"vm2"`)) {
		t.Errorf("state file after SIGHUP: %s, %v; want vm1 alone", b, err)
	}
	select {
	case <-c.exited:
		t.Fatalf("vrdmad exited after SIGHUP: %v\n%s", c.err, c.log())
	default:
	}
	c.stop(t, n)
}

// TestFatalErrorFormat: the error vrdmad exits with is one JSON log entry
// under --log-format json, wherever on the command line the flag is and
// whatever failed; "vrdmad: ERROR" otherwise.
func TestFatalErrorFormat(t *testing.T) {
	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--log-format", "json", "--state-dir="}, 2, "nothing to serve"},
		{[]string{"--log-format=json", "--no-such-flag"}, 2, "no-such-flag"},
		{[]string{"--state-dir=", "--socket", "/nonexistent/dir/x.sock", "--log-format", "json"}, 1, "/nonexistent/dir/x.sock"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			c := startVrdmad(t, startOpts{}, tt.args...)
			if code := c.waitExit(t, 10*time.Second); code != tt.code {
				t.Fatalf("exit status %d, want %d\n%s", code, tt.code, c.log())
			}
			// The last line is the fatal error; lines before it are the
			// log's, JSON too.
			lines := strings.Split(strings.TrimSpace(c.log()), "\n")
			for i, l := range lines {
				var e map[string]any
				if err := json.Unmarshal([]byte(l), &e); err != nil {
					t.Fatalf("line %d is not JSON (%v): %q", i, err, l)
				}
				if i < len(lines)-1 {
					continue
				}
				msg, _ := e["msg"].(string)
				if e["level"] != "fatal" || !strings.Contains(msg, tt.want) || e["exit_status"] != float64(tt.code) || e["time"] == nil {
					t.Errorf("fatal entry %v: want level fatal, a msg with %q, exit_status %d and a time", e, tt.want, tt.code)
				}
			}
		})
	}
	t.Run("text", func(t *testing.T) {
		c := startVrdmad(t, startOpts{}, "--state-dir=")
		code := c.waitExit(t, 10*time.Second)
		if last := lastLine(c.log()); code != 2 || !strings.HasPrefix(last, "vrdmad: nothing to serve") {
			t.Errorf("exit %d, last line %q; want 2 and vrdmad: nothing to serve…", code, last)
		}
	})
}

// TestJournalPriorities: with standard error the journal stream
// (JOURNAL_STREAM names its device and inode), every line starts with its
// sd-daemon(3) priority; the fatal error too.
func TestJournalPriorities(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	run := func(t *testing.T, stop bool, args ...string) string {
		t.Helper()
		out, err := os.CreateTemp(dir, "stderr")
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(out.Fd()), &st); err != nil {
			t.Fatal(err)
		}
		n := newNotifier(t)
		cmd := exec.Command(self, args...)
		cmd.Env = append(os.Environ(), "VRDMAD_TEST_MAIN=1", "NOTIFY_SOCKET="+n.path, fmt.Sprintf("JOURNAL_STREAM=%d:%d", st.Dev, st.Ino))
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if stop {
			c := &child{cmd: cmd, exited: make(chan struct{})}
			go func() { c.err = cmd.Wait(); close(c.exited) }()
			n.wait(t, c, "READY=1", 20*time.Second)
			cmd.Process.Signal(syscall.SIGTERM)
			<-c.exited
		} else {
			cmd.Wait()
		}
		b, err := os.ReadFile(out.Name())
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	t.Run("serving", func(t *testing.T) {
		log := run(t, true, "--control", filepath.Join(dir, "control.sock"), "--state-dir=", "--log-format", "json")
		var levels []string
		for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
			p, rest, ok := strings.Cut(l, ">")
			var e map[string]any
			if !ok || json.Unmarshal([]byte(rest), &e) != nil {
				t.Fatalf("line %q: want <N> and a JSON entry", l)
			}
			want := map[any]string{"info": "<6", "warning": "<4", "error": "<3", "debug": "<7"}[e["level"]]
			if p != want {
				t.Errorf("line %q: priority %s>, want %s> for level %v", l, p, want, e["level"])
			}
			levels = append(levels, e["level"].(string))
		}
		if !strings.Contains(strings.Join(levels, ","), "warning") || !strings.Contains(strings.Join(levels, ","), "info") {
			t.Errorf("levels %q: want info and warning lines (--state-dir '' warns)", levels)
		}
	})
	t.Run("fatal", func(t *testing.T) {
		if last := lastLine(run(t, false, "--state-dir=")); !strings.HasPrefix(last, "<2>vrdmad: nothing to serve") {
			t.Errorf("fatal error under the journal: %q, want <2>vrdmad: nothing to serve…", last)
		}
	})
}

// lastLine is the last line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
