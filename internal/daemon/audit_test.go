package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/controlapi"
)

// syncBuffer is a log output tests read while the daemon writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines are the log lines that hold every one of subs.
func (s *syncBuffer) lines(subs ...string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range strings.Split(s.b.String(), "\n") {
		all := l != ""
		for _, sub := range subs {
			all = all && strings.Contains(l, sub)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// waitLine waits until a log line holds every one of subs and returns it.
func (s *syncBuffer) waitLine(t *testing.T, subs ...string) string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if l := s.lines(subs...); len(l) > 0 {
			return l[0]
		}
		if time.Now().After(deadline) {
			s.mu.Lock()
			defer s.mu.Unlock()
			t.Fatalf("no log line with %q in:\n%s", subs, s.b.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// loggedDaemon is a daemon whose text log (level lv) the test reads,
// serving its control API on a real unix socket in a short directory.
func loggedDaemon(t *testing.T, lv logrus.Level) (*Daemon, *syncBuffer, string) {
	t.Helper()
	buf := &syncBuffer{}
	l := logrus.New()
	l.SetOutput(buf)
	l.SetLevel(lv)
	l.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true})
	d := New(logrus.NewEntry(l), Config{})
	t.Cleanup(func() { d.Close() })
	dir, err := os.MkdirTemp("", "vrdma-audit")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	control := filepath.Join(dir, "control.sock")
	if err := d.ServeControl(control); err != nil {
		t.Fatal(err)
	}
	return d, buf, control
}

// TestAuditControlRequests: over the real control socket, every
// mutation and every refusal is logged with the caller's uid, gid and pid
// (this process: SO_PEERCRED), the method, path, device, status and
// error; reads are not logged at info level.
func TestAuditControlRequests(t *testing.T) {
	_, buf, control := loggedDaemon(t, logrus.InfoLevel)
	c := controlapi.New(control)
	ctx := context.Background()
	sock := filepath.Join(filepath.Dir(control), "vm1.sock")
	if _, err := c.AddDevice(ctx, controlapi.AddRequest{ID: "vm1", Socket: sock}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddDevice(ctx, controlapi.AddRequest{ID: "vm1", Socket: sock + "2"}); err == nil {
		t.Fatal("second vm1: got no error, want 409")
	}
	if _, err := c.AddDevice(ctx, controlapi.AddRequest{ID: "bad id", Socket: sock}); err == nil {
		t.Fatal("bad id: got no error, want 400")
	}
	if _, err := c.Devices(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveDevice(ctx, "vm1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemoveDevice(ctx, "nope"); err == nil {
		t.Fatal("DELETE nope: got no error, want 404")
	}
	who := fmt.Sprintf("gid=%d", os.Getgid())
	pid := fmt.Sprintf("pid=%d", os.Getpid())
	uid := fmt.Sprintf("uid=%d", os.Getuid())
	for _, want := range [][]string{
		{"level=info", `msg="control request"`, "method=POST", "path=/v1/devices ", "device=vm1", "status=201"},
		{"level=warning", `msg="control request refused"`, "method=POST", "device=vm1", "status=409", `error="device exists: vm1"`},
		{"level=warning", `msg="control request refused"`, "method=POST", "status=400", "invalid request: id"},
		{"level=info", `msg="control request"`, "method=DELETE", "path=/v1/devices/vm1", "device=vm1", "status=200"},
		{"level=warning", `msg="control request refused"`, "method=DELETE", "device=nope", "status=404", "no such device"},
	} {
		line := buf.waitLine(t, want...)
		for _, f := range []string{uid, who, pid, "duration="} {
			if !strings.Contains(line, f) {
				t.Errorf("audit line %q lacks %s", line, f)
			}
		}
	}
	if l := buf.lines("method=GET"); len(l) != 0 {
		t.Errorf("reads logged at info level: %q", l)
	}
}

// TestAuditHostileRequest: a request's path and method are bounded in
// its audit line, and a request read at debug level is logged there.
func TestAuditHostileRequest(t *testing.T) {
	_, buf, control := loggedDaemon(t, logrus.DebugLevel)
	conn, err := net.Dial("unix", control)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	long := "/v1/devices/" + strings.Repeat("A", 4000)
	fmt.Fprintf(conn, "DELETE %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", long)
	line := buf.waitLine(t, "method=DELETE", "status=404")
	if len(line) > 2*maxAuditPath+maxIDLen+maxAuditError {
		t.Errorf("audit line of %d bytes: want the client's values cut", len(line))
	}
	if !strings.Contains(line, "…") || !strings.Contains(line, fmt.Sprintf("pid=%d", os.Getpid())) {
		t.Errorf("audit line %.300q: want a cut path and the peer", line)
	}
	c := controlapi.New(control)
	if _, err := c.Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	buf.waitLine(t, "level=debug", "method=GET", "path=/v1/health", "status=200", fmt.Sprintf("uid=%d", os.Getuid()))
}

// TestFrontendPeerLogged: a front-end's connection and disconnection are
// logged with its pid and uid.
func TestFrontendPeerLogged(t *testing.T) {
	d, buf, control := loggedDaemon(t, logrus.InfoLevel)
	sock := filepath.Join(filepath.Dir(control), "fe.sock")
	if _, err := d.AddDevice(DeviceSpec{ID: "fe", Socket: sock}); err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	peer := []string{fmt.Sprintf("pid=%d", os.Getpid()), fmt.Sprintf("uid=%d", os.Getuid()), "device=fe"}
	buf.waitLine(t, append([]string{`msg="front-end connected"`}, peer...)...)
	conn.Close()
	buf.waitLine(t, append([]string{"front-end disconnected"}, peer...)...)
}

// TestShutdownSaysStopped: at Close a persisted device is "stopped" (it
// comes back), never "removed"; a removal through the API is "removed".
func TestShutdownSaysStopped(t *testing.T) {
	d, buf, control := loggedDaemon(t, logrus.InfoLevel)
	if _, err := d.OpenState(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Dir(control)
	c := controlapi.New(control)
	for _, id := range []string{"kept", "gone"} {
		if _, err := c.AddDevice(context.Background(), controlapi.AddRequest{ID: id, Socket: filepath.Join(dir, id+".sock")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.RemoveDevice(context.Background(), "gone"); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	buf.waitLine(t, `msg="device removed"`, "device=gone")
	buf.waitLine(t, `msg="device stopped"`, "device=kept", "persisted=true")
	if l := buf.lines("device removed", "device=kept"); len(l) != 0 {
		t.Errorf("a saved device logged as removed at shutdown: %q", l)
	}
}
