package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// The tests run vrdmad as a child process: this test binary, started
// with VRDMAD_TEST_MAIN=1, is vrdmad (TestMain runs main).
func TestMain(m *testing.M) {
	if os.Getenv("VRDMAD_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestPrintCapabilities: the vhost-user backend convention's JSON, on
// standard output, whatever else the command line says.
func TestPrintCapabilities(t *testing.T) {
	for _, args := range [][]string{
		{"--print-capabilities"},
		{"-print-capabilities"},
		{"--socket", "/x.sock", "--print-capabilities", "--no-such-flag", "stray"},
	} {
		var out bytes.Buffer
		if err := run(args, &out); err != nil {
			t.Fatalf("%q: %v", args, err)
		}
		var caps map[string]any
		dec := json.NewDecoder(&out)
		dec.UseNumber()
		if err := dec.Decode(&caps); err != nil {
			t.Fatalf("%q: output %q: %v", args, out.String(), err)
		}
		if caps["type"] != "rdma" || len(caps) != 2 {
			t.Errorf("%q: got %v, want type rdma and features only", args, caps)
		}
		feats, _ := caps["features"].([]any)
		fs := newFlags().fs
		seen := map[string]bool{}
		for _, f := range feats {
			name, _ := f.(string)
			if fs.Lookup(name) == nil || conventionFlags[name] {
				t.Errorf("feature %q: not an optional flag of vrdmad", f)
			}
			seen[name] = true
		}
		for _, want := range []string{"control", "state-dir", "socket", "socket-owner", "metrics"} {
			if !seen[want] {
				t.Errorf("features %v lack %q", feats, want)
			}
		}
	}
}

// TestFlagErrors: bad command lines fail before anything is served.
func TestFlagErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "x.sock")
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"socket-path and fd", []string{"--socket-path=" + sock, "--fd=3"}, "incompatible"},
		{"empty socket-path", []string{"--socket-path="}, "empty path"},
		{"negative fd", []string{"--fd=-2"}, "want a file descriptor number"},
		{"fd of stdout", []string{"--fd=1", "--state-dir="}, "standard input, output and error"},
		{"fd not a number", []string{"--fd=x"}, "invalid value"},
		{"nothing to serve", []string{"--state-dir="}, "nothing to serve"},
		{"socket-owner without names", []string{"--socket-owner=:", "--socket", sock}, "want USER[:GROUP] or :GROUP"},
		{"state dir under a file", []string{"--socket", sock, "--state-dir", filepath.Join(file, "state")}, "create the state directory"},
		{"address not an address", []string{"--socket", sock, "--state-dir=", "--address", "tenant-a"}, "not an IP address or prefix"},
		{"address of everything", []string{"--socket", sock, "--state-dir=", "--address", "::/0"}, "assigns every address"},
		{"address of a device not given", []string{"--socket", "vm1=" + sock, "--state-dir=", "--address", "vm2=10.0.0.1"}, `no device "vm2"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(tt.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("run(%q): got %v, want an error with %q", tt.args, err, tt.wantErr)
			}
		})
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket %s after failed starts: %v, want none", sock, err)
	}
}

// notifier is the service manager's end of sd_notify: a datagram socket
// whose path a child gets as NOTIFY_SOCKET.
type notifier struct {
	path string
	msgs chan string
}

func newNotifier(t *testing.T) *notifier {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	n := &notifier{path: path, msgs: make(chan string, 1024)}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := c.Read(buf)
			if err != nil {
				close(n.msgs)
				return
			}
			n.msgs <- string(buf[:k])
		}
	}()
	return n
}

// wait returns the next datagram that has the line want, or fails the
// test after timeout or when the child exits first.
func (n *notifier) wait(t *testing.T, c *child, want string, timeout time.Duration) string {
	t.Helper()
	has := func(m string) bool {
		for _, line := range strings.Split(m, "\n") {
			if line == want {
				return true
			}
		}
		return false
	}
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-n.msgs:
			if !ok {
				t.Fatalf("notify socket closed before %s\n%s", want, c.log())
			}
			if has(m) {
				return m
			}
		case <-c.exited:
			// A message sent just before the exit is in the socket's
			// queue (a unix datagram is queued by the send), but the
			// reader may not have taken it yet, and select picks either
			// ready case at random: drain for a moment.
			grace := time.After(time.Second)
			for more := true; more; {
				select {
				case m, ok := <-n.msgs:
					if ok && has(m) {
						return m
					}
					more = ok
				case <-grace:
					more = false
				}
			}
			t.Fatalf("vrdmad exited (%v) before %s\n%s", c.err, want, c.log())
		case <-deadline:
			t.Fatalf("no %s within %v\n%s", want, timeout, c.log())
		}
	}
}

// child is a vrdmad process.
type child struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer // protected by mu
	exited chan struct{}
	err    error // valid once exited is closed
}

func (c *child) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.Write(p)
}

func (c *child) log() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

// startOpts say how to start a child vrdmad.
type startOpts struct {
	env   []string
	files []*os.File // become fds 3, 4, …
	// activation sets LISTEN_PID to the child's pid (through sh, whose
	// exec keeps the pid), as systemd does.
	activation bool
	// wrap runs vrdmad under another program: the test binary follows
	// wrap's arguments.
	wrap []string
}

// startVrdmad runs vrdmad with args. The child is killed at the end of
// the test if it still runs.
func startVrdmad(t *testing.T, o startOpts, args ...string) *child {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var cmd *exec.Cmd
	switch {
	case o.activation:
		cmd = exec.Command("sh", append([]string{"-c", `LISTEN_PID=$$; export LISTEN_PID; exec "$0" "$@"`, self}, args...)...)
	case o.wrap != nil:
		cmd = exec.Command(o.wrap[0], append(append(o.wrap[1:], self), args...)...)
	default:
		cmd = exec.Command(self, args...)
	}
	cmd.Env = append(os.Environ(), "VRDMAD_TEST_MAIN=1")
	cmd.Env = append(cmd.Env, o.env...)
	cmd.ExtraFiles = o.files
	c := &child{cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = c
	cmd.Stdout = c
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.exited
	})
	return c
}

// waitExit waits for the child's exit and returns its status.
func (c *child) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-c.exited:
	case <-time.After(timeout):
		t.Fatalf("vrdmad still running after %v\n%s", timeout, c.log())
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ExitCode()
	}
	if c.err != nil {
		t.Fatalf("wait: %v", c.err)
	}
	return 0
}

// logHas reports whether the child's log holds sub within timeout: the
// log is copied from a pipe, so a line written before a notification may
// arrive after it.
func (c *child) logHas(sub string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if strings.Contains(c.log(), sub) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop sends SIGTERM, expects STOPPING=1 (when n is set) and a clean exit.
func (c *child) stop(t *testing.T, n *notifier) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if n != nil {
		n.wait(t, c, "STOPPING=1", 10*time.Second)
	}
	if code := c.waitExit(t, 15*time.Second); code != 0 {
		t.Fatalf("vrdmad after SIGTERM: exit status %d\n%s", code, c.log())
	}
}

// listenUnix makes a listening socket as systemd or a caller would, and
// returns its file (for ExtraFiles).
func listenUnix(t *testing.T, path string) *os.File {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	f, err := ln.File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	t.Cleanup(func() { f.Close() })
	return f
}

// dialAll connects to every socket at once: each must accept.
func dialAll(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		c, err := net.DialTimeout("unix", p, time.Second)
		if err != nil {
			t.Errorf("connect to %s right at READY: %v", p, err)
			continue
		}
		c.Close()
	}
}

// devices lists the daemon's devices through the control socket.
func devices(t *testing.T, control string) map[string]daemon.DeviceInfo {
	t.Helper()
	resp, err := vrdmadproc.UnixClient(control).Get("http://vrdmad/v1/devices")
	if err != nil {
		t.Fatalf("GET /v1/devices: %v", err)
	}
	defer resp.Body.Close()
	var list []daemon.DeviceInfo
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/devices: %s, %v", resp.Status, err)
	}
	out := map[string]daemon.DeviceInfo{}
	for _, d := range list {
		out[d.ID] = d
	}
	return out
}

// usable opens the device on sock as a virtio-user front-end and runs a
// command: the socket really serves a vrdma device.
func usable(t *testing.T, sock string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, sock, 16<<20)
	if err != nil {
		t.Fatalf("open %s: %v", sock, err)
	}
	defer f.Close()
	defer c.Close()
	if _, err := c.QueryDevice(); err != nil {
		t.Fatalf("QUERY_DEVICE on %s: %v", sock, err)
	}
}

// TestBackendConventions: --socket-path and --fd serve one device each,
// READY=1 comes when it accepts, SIGTERM ends vrdmad cleanly (STOPPING=1),
// and the socket a caller handed over is left in place.
func TestBackendConventions(t *testing.T) {
	t.Run("socket-path", func(t *testing.T) {
		dir := t.TempDir()
		sock, control := filepath.Join(dir, "vm7.sock"), filepath.Join(dir, "control.sock")
		n := newNotifier(t)
		c := startVrdmad(t, startOpts{env: []string{"NOTIFY_SOCKET=" + n.path}},
			"--socket-path="+sock, "--control", control, "--state-dir", filepath.Join(dir, "state"))
		n.wait(t, c, "READY=1", 20*time.Second)
		dialAll(t, sock, control)
		if got := devices(t, control); got["vm7"].Socket != sock || got["vm7"].Persisted {
			t.Errorf("devices: got %+v, want vm7 on %s, not persisted", got, sock)
		}
		usable(t, sock)
		c.stop(t, n)
	})
	t.Run("fd", func(t *testing.T) {
		dir := t.TempDir()
		sock := filepath.Join(dir, "handed.sock")
		f := listenUnix(t, sock)
		n := newNotifier(t)
		c := startVrdmad(t, startOpts{env: []string{"NOTIFY_SOCKET=" + n.path}, files: []*os.File{f}},
			"--fd=3", "--state-dir=")
		n.wait(t, c, "READY=1", 20*time.Second)
		dialAll(t, sock)
		usable(t, sock)
		c.stop(t, n)
		if _, err := os.Lstat(sock); err != nil {
			t.Errorf("handed-over socket after vrdmad exited: %v, want it left to its owner", err)
		}
	})
	t.Run("fd not listening", func(t *testing.T) {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		c := startVrdmad(t, startOpts{files: []*os.File{f}}, "--fd=3", "--state-dir=")
		if code := c.waitExit(t, 10*time.Second); code == 0 || !strings.Contains(c.log(), "fd 3: not a listening unix stream socket: not a socket") {
			t.Errorf("vrdmad --fd on /dev/null: exit %d, log %q; want a failure naming fd 3", code, c.log())
		}
	})
}

// writeState writes a state file listing one device.
func writeState(t *testing.T, dir, id, sock, uuid string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`{"version": 1, "devices": [{"id": %q, "socket": %q, "uuid": %q, "limits": {"max_qps": 7}}]}`, id, sock, uuid)
	if err := os.WriteFile(filepath.Join(dir, daemon.StateFile), []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSocketActivation: vrdmad started as systemd starts it (LISTEN_PID,
// LISTEN_FDS, LISTEN_FDNAMES, descriptors from 3) serves the control API
// on the socket named control and a device on each other named socket,
// beside a --socket device and a device restored from its state file.
// READY=1 comes only once every one of them accepts: each is connected to
// the moment READY arrives. The watchdog pings at half WATCHDOG_USEC;
// SIGTERM gives STOPPING=1 and leaves systemd's sockets in place.
func TestSocketActivation(t *testing.T) {
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	files := []*os.File{listenUnix(t, p("control.sock")), listenUnix(t, p("vm1.sock")), listenUnix(t, p("vm2.sock"))}
	writeState(t, p("state"), "vm4", p("vm4.sock"), "0211abcd-0000-4000-8000-0000000000a4")
	n := newNotifier(t)
	c := startVrdmad(t, startOpts{
		activation: true,
		files:      files,
		env:        []string{"LISTEN_FDS=3", "LISTEN_FDNAMES=control:vm1:vm2", "NOTIFY_SOCKET=" + n.path, "WATCHDOG_USEC=200000"},
	}, "--socket", "vm3="+p("vm3.sock"), "--state-dir", p("state"), "--metrics", "unix:"+p("metrics.sock"))
	ready := n.wait(t, c, "READY=1", 20*time.Second)
	dialAll(t, p("control.sock"), p("vm1.sock"), p("vm2.sock"), p("vm3.sock"), p("vm4.sock"), p("metrics.sock"))
	if !strings.Contains(ready, "STATUS=serving 4 devices") {
		t.Errorf("READY datagram %q: want STATUS=serving 4 devices", ready)
	}
	got := devices(t, p("control.sock"))
	for id, want := range map[string]struct {
		sock      string
		persisted bool
	}{"vm1": {p("vm1.sock"), false}, "vm2": {p("vm2.sock"), false}, "vm3": {p("vm3.sock"), false}, "vm4": {p("vm4.sock"), true}} {
		if d, ok := got[id]; !ok || d.Socket != want.sock || d.Persisted != want.persisted {
			t.Errorf("device %s: got %+v (present %v), want socket %s persisted %v", id, d, ok, want.sock, want.persisted)
		}
	}
	if got["vm4"].UUID != "0211abcd-0000-4000-8000-0000000000a4" || got["vm4"].Limits.MaxQPs != 7 {
		t.Errorf("restored vm4: got uuid %s max_qps %d, want the saved ones", got["vm4"].UUID, got["vm4"].Limits.MaxQPs)
	}
	usable(t, p("vm1.sock"))
	start := time.Now()
	n.wait(t, c, "WATCHDOG=1", 2*time.Second)
	n.wait(t, c, "WATCHDOG=1", 2*time.Second)
	if el := time.Since(start); el > 1500*time.Millisecond {
		t.Errorf("two watchdog pings took %v, want about 200ms (every 100ms)", el)
	}
	c.stop(t, n)
	for _, s := range []string{"control.sock", "vm1.sock", "vm2.sock"} {
		if _, err := os.Lstat(p(s)); err != nil {
			t.Errorf("activated socket %s after exit: %v, want it left to systemd", s, err)
		}
	}
	if _, err := os.Lstat(p("vm3.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("vrdmad's own socket vm3.sock after exit: %v, want it removed", err)
	}
}

// TestSocketActivationErrors: sockets systemd passed that vrdmad cannot
// serve stop the start with an error that names them.
func TestSocketActivationErrors(t *testing.T) {
	tests := []struct {
		name    string
		names   string
		args    []string
		notSock bool
		wantErr string
	}{
		{"unnamed", "vrdmad.socket", nil, false, `fd 3 is named "vrdmad.socket": set FileDescriptorName=`},
		{"bad device name", "1bad", nil, false, `FileDescriptorName "1bad" is not a device ID`},
		{"control twice", "control:control", nil, false, "two sockets named control"},
		{"not a socket", "control", nil, true, "fd 3 (\"control\"): not a listening unix stream socket"},
		{"control elsewhere", "control", []string{"--control", "/nonexistent/other.sock"}, false, "the socket-activated control socket is"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			var files []*os.File
			for i := range strings.Split(tt.names, ":") {
				if tt.notSock {
					f, err := os.Open(os.DevNull)
					if err != nil {
						t.Fatal(err)
					}
					defer f.Close()
					files = append(files, f)
					continue
				}
				files = append(files, listenUnix(t, filepath.Join(dir, fmt.Sprintf("s%d.sock", i))))
			}
			c := startVrdmad(t, startOpts{activation: true, files: files,
				env: []string{fmt.Sprintf("LISTEN_FDS=%d", len(files)), "LISTEN_FDNAMES=" + tt.names}},
				append([]string{"--state-dir="}, tt.args...)...)
			if code := c.waitExit(t, 10*time.Second); code != 1 || !strings.Contains(c.log(), tt.wantErr) {
				t.Errorf("exit %d, log:\n%s\nwant status 1 and %q", code, c.log(), tt.wantErr)
			}
		})
	}
}

// TestSystemdSocketActivate runs vrdmad under systemd's own activation
// tool, as a unit's sockets would start it: the tool listens, waits for
// a first connection, then execs vrdmad with the sockets.
func TestSystemdSocketActivate(t *testing.T) {
	tool, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("systemd-socket-activate not found (CI=true; Debian package systemd): %v", err)
		}
		t.Skipf("systemd-socket-activate not found: %v", err)
	}
	dir := t.TempDir()
	control, vm1 := filepath.Join(dir, "control.sock"), filepath.Join(dir, "vm1.sock")
	n := newNotifier(t)
	c := startVrdmad(t, startOpts{wrap: []string{tool, "-l", control, "-l", vm1, "--fdname=control:vm1",
		"-E", "VRDMAD_TEST_MAIN=1", "-E", "NOTIFY_SOCKET=" + n.path}}, "--state-dir=")
	// The tool execs vrdmad on the first connection.
	var first net.Conn
	deadline := time.Now().Add(10 * time.Second)
	for {
		if first, err = net.Dial("unix", control); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("systemd-socket-activate did not listen on %s: %v\n%s", control, err, c.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer first.Close()
	n.wait(t, c, "READY=1", 20*time.Second)
	dialAll(t, control, vm1)
	// The connection that started vrdmad is served too.
	fmt.Fprintf(first, "GET /v1/health HTTP/1.1\r\nHost: vrdmad\r\nConnection: close\r\n\r\n")
	first.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, _ := io.ReadAll(first)
	if !bytes.HasPrefix(resp, []byte("HTTP/1.1 200")) {
		t.Errorf("health on the first connection: got %q", resp)
	}
	if got := devices(t, control); got["vm1"].Socket != vm1 {
		t.Errorf("devices: got %+v, want vm1 on %s", got, vm1)
	}
	usable(t, vm1)
	c.stop(t, n)
}

// TestRestartKeepsIdentity: a device added through the control API comes
// back after vrdmad is killed and started again — same id, socket, uuid,
// GUID, limits — and a front-end that reconnects to it, as QEMU with
// reconnect-ms does, uses it. A removed device stays removed.
func TestRestartKeepsIdentity(t *testing.T) {
	dir := t.TempDir()
	control, sock, state := filepath.Join(dir, "control.sock"), filepath.Join(dir, "vm1.sock"), filepath.Join(dir, "state")
	args := []string{"--control", control, "--state-dir", state}
	start := func() (*child, *notifier) {
		n := newNotifier(t)
		c := startVrdmad(t, startOpts{env: []string{"NOTIFY_SOCKET=" + n.path}}, args...)
		n.wait(t, c, "READY=1", 20*time.Second)
		return c, n
	}
	c1, _ := start()
	cl := vrdmadproc.UnixClient(control)
	for _, body := range []string{
		fmt.Sprintf(`{"id":"vm1","socket":%q,"limits":{"max_qps":64,"max_pinned_bytes":536870912}}`, sock),
		fmt.Sprintf(`{"id":"vm2","socket":%q,"doorbell_queues":2,"guid":"0211:2233:4455:6677","share":{"weight":3,"max_ops_per_s":20000}}`, filepath.Join(dir, "vm2.sock")),
	} {
		resp, err := cl.Post("http://vrdmad/v1/devices", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: %s", body, resp.Status)
		}
	}
	// A share changed on a running device is saved too.
	maxBytes := uint64(1 << 30)
	if _, err := controlapi.New(control).SetShare(context.Background(), "vm1", controlapi.SharePatch{MaxBytesPerSec: &maxBytes}); err != nil {
		t.Fatal(err)
	}
	before := devices(t, control)
	if s := before["vm1"].Share; s != (controlapi.Share{Weight: 1, MaxBytesPerSec: 1 << 30}) {
		t.Fatalf("vm1 after PATCH: share %+v", s)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	vc, f, err := frontend.OpenRDMA(ctx, sock, 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defer vc.Close()
	if _, err := vc.AllocPD(); err != nil {
		t.Fatal(err)
	}

	c1.cmd.Process.Kill() // a crash: nothing is cleaned up
	c1.waitExit(t, 10*time.Second)
	c2, n2 := start()
	after := devices(t, control)
	for _, id := range []string{"vm1", "vm2"} {
		b, a := before[id], after[id]
		if a.ID != id || a.Socket != b.Socket || a.UUID != b.UUID || a.GUID != b.GUID || a.GID != b.GID ||
			a.Limits != b.Limits || a.NumQueues != b.NumQueues || !a.Persisted || a.Share != b.Share {
			t.Errorf("%s after the restart:\n got %+v\nwant %+v", id, a, b)
		}
	}
	if after["vm2"].GUID != "0211:2233:4455:6677" || after["vm2"].NumQueues != 4 {
		t.Errorf("vm2: got guid %s num_queues %d, want 0211:2233:4455:6677 and 4", after["vm2"].GUID, after["vm2"].NumQueues)
	}

	// The front-end reconnects to the restored socket.
	if err := f.Reconnect(ctx); err != nil {
		t.Fatalf("reconnect: %v\n%s", err, c2.log())
	}
	if ev, err := vc.GetAsyncEvent(10 * time.Second); err != nil || ev.Type != abi.EventDeviceFatal {
		t.Fatalf("after the restart: event %+v, %v; want DEVICE_FATAL", ev, err)
	}
	vc.Close()
	vc2, err := f.Reopen()
	if err != nil {
		t.Fatal(err)
	}
	defer vc2.Close()
	attr, err := vc2.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if got := abi.FormatGUID(attr.NodeGUID); got != before["vm1"].GUID {
		t.Errorf("node GUID the driver sees after the restart: got %s, want %s", got, before["vm1"].GUID)
	}
	if _, err := vc2.AllocPD(); err != nil {
		t.Fatalf("after reset: %v", err)
	}

	req, _ := http.NewRequest(http.MethodDelete, "http://vrdmad/v1/devices/vm2", nil)
	resp, err := cl.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE vm2: %v %v", resp, err)
	}
	resp.Body.Close()
	c2.stop(t, n2)
	start()
	if got := devices(t, control); len(got) != 1 || got["vm1"].UUID != before["vm1"].UUID {
		t.Errorf("after removing vm2 and restarting: got %v, want vm1 only", got)
	}
}

// TestStartFailures: vrdmad refuses to start, with status 1 and an error
// naming the cause, when its state cannot be used — never a crash, never
// a daemon that silently serves fewer devices than were saved. (A state
// file it can set aside is not such a failure: TestCorruptStateServesDegraded.)
func TestStartFailures(t *testing.T) {
	t.Run("saved device's socket taken", func(t *testing.T) {
		dir := t.TempDir()
		taken := filepath.Join(dir, "vm1.sock")
		ln, err := net.Listen("unix", taken)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		state := filepath.Join(dir, "state")
		writeState(t, state, "vm1", taken, "0211abcd-0000-4000-8000-000000000001")
		before, _ := os.ReadFile(filepath.Join(state, daemon.StateFile))
		c := startVrdmad(t, startOpts{}, "--control", filepath.Join(dir, "control.sock"), "--state-dir", state)
		if code := c.waitExit(t, 10*time.Second); code != 1 || !strings.Contains(c.log(), "restore device vm1 (socket "+taken+")") ||
			!strings.Contains(c.log(), "another process listens") {
			t.Errorf("exit %d, log:\n%s\nwant status 1 naming vm1, %s and the other listener", code, c.log(), taken)
		}
		if after, _ := os.ReadFile(filepath.Join(state, daemon.StateFile)); !bytes.Equal(after, before) {
			t.Errorf("state file changed by the failed start:\n%s\nwant\n%s", after, before)
		}
	})
	t.Run("state dir in use", func(t *testing.T) {
		dir := t.TempDir()
		state := filepath.Join(dir, "state")
		n := newNotifier(t)
		first := startVrdmad(t, startOpts{env: []string{"NOTIFY_SOCKET=" + n.path}}, "--control", filepath.Join(dir, "c1.sock"), "--state-dir", state)
		n.wait(t, first, "READY=1", 20*time.Second)
		c := startVrdmad(t, startOpts{}, "--control", filepath.Join(dir, "c2.sock"), "--state-dir", state)
		if code := c.waitExit(t, 10*time.Second); code != 1 || !strings.Contains(c.log(), "in use by another vrdmad") {
			t.Errorf("second vrdmad on %s: exit %d, log:\n%s", state, code, c.log())
		}
		first.stop(t, n)
	})
}
