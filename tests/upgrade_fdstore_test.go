package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// `systemctl restart vrdmad` with --fdstore (issue 29, docs/state.md):
// on SIGTERM vrdmad puts every device in systemd's file-descriptor store
// and exits; the next start takes them up from LISTEN_FDS/LISTEN_FDNAMES
// and empties the store. CI has no systemd as PID 1, so fakeSystemd plays
// the service manager: the notification socket, the store (with its
// de-duplication of open file descriptions), and the start of the next
// process with the stored descriptors.

// fakeSystemd is a service manager for one Type=notify service with
// FileDescriptorStoreMax= set, as systemd's service.c behaves: FDSTORE=1
// keeps a datagram's descriptors under FDNAME (dropping one whose open
// file description the store holds already), FDSTOREREMOVE=1 closes every
// entry of that name, descriptors in any other datagram are closed, and
// only the main process is listened to (NotifyAccess=main).
type fakeSystemd struct {
	t    *testing.T
	sock string
	conn *net.UnixConn
	done chan struct{} // closed when the reader has returned

	mu      sync.Mutex
	cond    *sync.Cond  // signalled on every datagram handled
	store   []storedFD  // protected by mu, in the order of storing
	mainPID int         // protected by mu
	ready   map[int]int // protected by mu: READY=1 per sender pid
	stops   map[int]int // protected by mu: STOPPING=1 per sender pid
	synced  int         // protected by mu: the last sync marker read
	dropped int         // protected by mu: duplicates the store refused
	foreign []string    // protected by mu: datagrams from another pid
	errs    []string    // protected by mu: malformed datagrams
	nsync   int         // protected by mu: sync markers sent
}

type storedFD struct {
	name string
	f    *os.File
}

func newFakeSystemd(t *testing.T) *fakeSystemd {
	t.Helper()
	m := &fakeSystemd{t: t, sock: filepath.Join(t.TempDir(), "notify"), done: make(chan struct{}),
		ready: map[int]int{}, stops: map[int]int{}}
	m.cond = sync.NewCond(&m.mu)
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: m.sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	m.conn = conn
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }); err != nil || serr != nil {
		t.Fatalf("SO_PASSCRED: %v %v", err, serr)
	}
	go m.read()
	t.Cleanup(func() {
		conn.Close()
		<-m.done
		m.clear()
	})
	return m
}

// read handles datagrams until the socket is closed.
func (m *fakeSystemd) read() {
	defer close(m.done)
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(253*4)+unix.CmsgSpace(unix.SizeofUcred))
	for {
		n, oobn, _, _, err := m.conn.ReadMsgUnix(buf, oob)
		if err != nil {
			m.mu.Lock()
			m.cond.Broadcast()
			m.mu.Unlock()
			return
		}
		m.handle(string(buf[:n]), oob[:oobn])
	}
}

func (m *fakeSystemd) handle(msg string, oob []byte) {
	var fds []int
	pid := -1
	cmsgs, err := unix.ParseSocketControlMessage(oob)
	m.mu.Lock()
	defer m.mu.Unlock()
	defer m.cond.Broadcast()
	if err != nil {
		m.errs = append(m.errs, fmt.Sprintf("control messages: %v", err))
		return
	}
	for _, c := range cmsgs {
		if r, err := unix.ParseUnixRights(&c); err == nil {
			fds = append(fds, r...)
		} else if cred, err := unix.ParseUnixCredentials(&c); err == nil {
			pid = int(cred.Pid)
		}
	}
	kv := map[string]string{}
	for _, line := range strings.Split(msg, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			kv[k] = v
		}
	}
	if s, ok := kv["X-TEST-SYNC"]; ok && pid == os.Getpid() {
		m.synced, _ = strconv.Atoi(s)
		return
	}
	if pid != m.mainPID {
		// NotifyAccess=main: systemd ignores it, descriptors and all.
		m.foreign = append(m.foreign, fmt.Sprintf("pid %d (main %d): %q", pid, m.mainPID, msg))
		closeFDs(fds)
		return
	}
	if kv["READY"] == "1" {
		m.ready[pid]++
	}
	if kv["STOPPING"] == "1" {
		m.stops[pid]++
	}
	if kv["FDSTOREREMOVE"] == "1" {
		name, ok := kv["FDNAME"]
		if !ok {
			m.errs = append(m.errs, "FDSTOREREMOVE=1 without FDNAME")
		}
		kept := m.store[:0]
		for _, s := range m.store {
			if s.name == name {
				s.f.Close()
				continue
			}
			kept = append(kept, s)
		}
		m.store = kept
	}
	if kv["FDSTORE"] != "1" {
		closeFDs(fds)
		return
	}
	name, ok := kv["FDNAME"]
	if !ok {
		name = "stored"
	}
	if name == "" || len(name) > 255 || strings.ContainsAny(name, ":\n") {
		m.errs = append(m.errs, fmt.Sprintf("invalid FDNAME %q", name))
		closeFDs(fds)
		return
	}
	for _, fd := range fds {
		if m.holdsLocked(fd) {
			// "Suppressing duplicate fd in fd store."
			m.dropped++
			unix.Close(fd)
			continue
		}
		m.store = append(m.store, storedFD{name: name, f: os.NewFile(uintptr(fd), name)})
	}
}

// holdsLocked reports whether the store has fd's open file description
// (systemd's same_fd: kcmp KCMP_FILE).
func (m *fakeSystemd) holdsLocked(fd int) bool {
	pid := uintptr(os.Getpid())
	for _, s := range m.store {
		r, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, 0 /* KCMP_FILE */, s.f.Fd(), uintptr(fd), 0)
		if errno != 0 {
			m.errs = append(m.errs, fmt.Sprintf("kcmp: %v", errno))
			return false
		}
		if r == 0 {
			return true
		}
	}
	return false
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// sync returns once every datagram sent before it has been handled: the
// socket's queue is in order, so a marker of our own comes after them.
// (systemd, too, reads the notification socket before it handles the
// main process's exit.)
func (m *fakeSystemd) sync() {
	m.t.Helper()
	m.mu.Lock()
	m.nsync++
	n := m.nsync
	m.mu.Unlock()
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: m.sock, Net: "unixgram"})
	if err != nil {
		m.t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("X-TEST-SYNC=" + strconv.Itoa(n))); err != nil {
		m.t.Fatal(err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.synced < n {
		select {
		case <-m.done:
			m.t.Fatal("the notification socket is closed")
		default:
		}
		m.cond.Wait()
	}
}

// names lists the store's entries in order.
func (m *fakeSystemd) names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, len(m.store))
	for i, s := range m.store {
		out[i] = s.name
	}
	return out
}

// drop takes the entry named name out of the store behind vrdmad's back.
func (m *fakeSystemd) drop(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, s := range m.store {
		if s.name == name {
			s.f.Close()
			m.store = append(m.store[:i], m.store[i+1:]...)
			return true
		}
	}
	return false
}

// inject puts f in the store under name, as a handover that failed
// halfway may leave it.
func (m *fakeSystemd) inject(name string, f *os.File) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.store = append(m.store, storedFD{name: name, f: f})
}

// clear empties the store, as systemd does when the service stops for
// good (systemctl stop).
func (m *fakeSystemd) clear() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.store {
		s.f.Close()
	}
	m.store = nil
}

// problems are datagrams systemd would have ignored or refused.
func (m *fakeSystemd) problems() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append(append([]string(nil), m.errs...), m.foreign...)
}

// waitReady waits until s has sent READY=1; it fails if s exits first.
func (m *fakeSystemd) waitReady(t *testing.T, s *svcProc) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		m.mu.Lock()
		n := m.ready[s.pid]
		m.mu.Unlock()
		if n > 0 {
			return
		}
		select {
		case <-s.exited:
			t.Fatalf("vrdmad (pid %d) exited before READY=1: %v\n%s", s.pid, s.waitErr, s.log())
		case <-deadline:
			t.Fatalf("no READY=1 from vrdmad (pid %d)\n%s", s.pid, s.log())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// svcProc is the service's main process.
type svcProc struct {
	pid     int
	cmd     *exec.Cmd
	stderr  *lockedBuffer
	exited  chan struct{}
	waitErr error // written before exited is closed
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (s *svcProc) log() string {
	s.stderr.mu.Lock()
	defer s.stderr.mu.Unlock()
	return s.stderr.b.String()
}

// start runs the service's ExecStart as systemd does: with NOTIFY_SOCKET
// and, when the store holds anything, the stored descriptors as fds 3…
// in the store's order, LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID the
// new process's own pid (sh sets it and execs vrdmad in its place).
func (m *fakeSystemd) start(t *testing.T, bin string, args []string) *svcProc {
	t.Helper()
	env := []string{"NOTIFY_SOCKET=" + m.sock}
	for _, e := range os.Environ() {
		if k, _, _ := strings.Cut(e, "="); k != "NOTIFY_SOCKET" && !strings.HasPrefix(k, "LISTEN_") {
			env = append(env, e)
		}
	}
	m.mu.Lock()
	var files []*os.File
	var names []string
	for _, s := range m.store {
		files = append(files, s.f)
		names = append(names, s.name)
	}
	var cmd *exec.Cmd
	if len(files) > 0 {
		cmd = exec.Command("/bin/sh", append([]string{"-c", `LISTEN_PID=$$ exec "$0" "$@"`, bin}, args...)...)
		env = append(env, "LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(names, ":"))
		cmd.ExtraFiles = files
	} else {
		cmd = exec.Command(bin, args...)
	}
	s := &svcProc{cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Env = env
	cmd.Stderr = s.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// Pdeathsig fires when the forking thread ends: a locked goroutine
	// forks and waits, so the thread lives as long as vrdmad does.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	err := <-started
	if err == nil {
		s.pid = cmd.Process.Pid
		m.mainPID = s.pid
	}
	m.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			cmd.Process.Kill()
			<-s.exited
		}
		if t.Failed() {
			t.Logf("vrdmad pid %d's log:\n%s", s.pid, s.log())
		}
	})
	return s
}

// wait waits for s to exit and returns its exit status.
func (s *svcProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
		t.Fatalf("vrdmad pid %d did not exit\n%s", s.pid, s.log())
	}
	var ee *exec.ExitError
	if errors.As(s.waitErr, &ee) {
		return ee.ExitCode()
	}
	if s.waitErr != nil {
		t.Fatalf("vrdmad pid %d: %v", s.pid, s.waitErr)
	}
	return 0
}

// stop is systemctl stop's part before the store is released: SIGTERM,
// and the process exits 0.
func (s *svcProc) stop(t *testing.T) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	if code := s.wait(t); code != 0 {
		t.Fatalf("vrdmad pid %d exited %d after SIGTERM\n%s", s.pid, code, s.log())
	}
}

// fdstoreRig is vrdmad under fakeSystemd with devices a and b, a peer on
// each connected by RC, and a stream between them.
type fdstoreRig struct {
	m    *fakeSystemd
	bin  string
	args []string
	p    *svcProc
	rig  upgradeRig // its p is unused: the service is p here
	ctl  *controlapi.Client
	dir  string
}

func startFDStoreRig(t *testing.T, split bool) *fdstoreRig {
	t.Helper()
	r := &fdstoreRig{m: newFakeSystemd(t), bin: needBinary(t, "vrdmad"), dir: t.TempDir()}
	control := filepath.Join(r.dir, "control.sock")
	r.args = []string{"--control", control, "--state-dir", filepath.Join(r.dir, "state"),
		"--socket", "a=" + filepath.Join(r.dir, "a.sock"), "--socket", "b=" + filepath.Join(r.dir, "b.sock"),
		"--metrics", "unix:" + filepath.Join(r.dir, "metrics.sock"), "--fdstore"}
	r.ctl = controlapi.New(control)
	r.p = r.m.start(t, r.bin, r.args)
	r.m.waitReady(t, r.p)
	a, b := openPeer(t, filepath.Join(r.dir, "a.sock"), 0), openPeer(t, filepath.Join(r.dir, "b.sock"), 0)
	if split {
		if err := a.f.SetMemTableRegions(a.f.SplitRegions(uint64(len(a.f.Memory()) / 2))); err != nil {
			t.Fatalf("SET_MEM_TABLE (split): %v", err)
		}
	}
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	r.rig = upgradeRig{a: a, b: b, s: startStream(a, b)}
	// Before the peers' memory goes (cleanups run last first): a test
	// that failed midway leaves the stream polling it.
	t.Cleanup(func() {
		select {
		case <-r.rig.s.done:
		default:
			r.rig.s.end()
		}
	})
	r.rig.s.waitRounds(t, 50)
	return r
}

// terminate is the first half of systemctl restart: SIGTERM, vrdmad
// stores everything and exits 0. It returns the store's names and the
// document stored, after checking that the store holds exactly what the
// document needs: each descriptor of its list once, by its index, but for
// those it names as aliases of an earlier one.
func (r *fdstoreRig) terminate(t *testing.T) ([]string, *daemon.Handover) {
	t.Helper()
	old := r.p
	r.p.stop(t)
	r.m.sync()
	names := r.m.names()
	r.m.mu.Lock()
	stops, dropped := r.m.stops[old.pid], r.m.dropped
	var state *os.File
	if len(r.m.store) > 0 {
		state = r.m.store[0].f
	}
	r.m.mu.Unlock()
	if stops == 0 {
		t.Errorf("no STOPPING=1 from pid %d", old.pid)
	}
	if dropped != 0 {
		t.Errorf("the store refused %d duplicate descriptors: vrdmad must store an open file once", dropped)
	}
	if len(names) == 0 || names[0] != daemon.StoreStateName {
		t.Fatalf("store after SIGTERM: %q, want %s first\n%s", names, daemon.StoreStateName, old.log())
	}
	fi, err := state.Stat()
	if err != nil {
		t.Fatal(err)
	}
	doc := make([]byte, fi.Size())
	if _, err := state.ReadAt(doc, 0); err != nil {
		t.Fatal(err)
	}
	h, err := daemon.DecodeHandover(doc)
	if err != nil {
		t.Fatalf("the stored document: %v", err)
	}
	want := map[string]bool{daemon.StoreStateName: true}
	alias := map[int]bool{}
	for _, a := range h.Aliases {
		alias[a.Index] = true
	}
	for i := 0; i < h.NumFDs; i++ {
		if !alias[i] {
			want[daemon.StoreFDPrefix+strconv.Itoa(i)] = true
		}
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] || !want[n] {
			t.Errorf("store: %s twice or not in the document's list (%d descriptors, aliases %v): %q", n, h.NumFDs, h.Aliases, names)
		}
		seen[n] = true
	}
	if len(seen) != len(want) {
		t.Errorf("store: %d entries, the document needs %d: %q", len(seen), len(want), names)
	}
	return names, h
}

// TestDaemonFDStoreRestart: systemctl restart vrdmad, twice, with
// --fdstore: the stream goes on verified, with the same QPs, and no guest
// notices; each new process says READY=1 and empties the store.
func TestDaemonFDStoreRestart(t *testing.T) {
	t.Run("one-region", func(t *testing.T) { testFDStoreRestart(t, false) })
	// a's guest memory as two regions of one memory file, as QEMU sends
	// it: the daemon holds the file's open file description twice, which
	// the store keeps once.
	t.Run("split-memory", func(t *testing.T) { testFDStoreRestart(t, true) })
}

func testFDStoreRestart(t *testing.T, split bool) {
	r := startFDStoreRig(t, split)
	base := levelsOf(t, r.p.pid)
	if base.eventfds == 0 || base.memfds == 0 || base.lockedKB == 0 {
		t.Fatalf("vrdmad holds %+v: no guest's descriptors or pins to compare", base)
	}
	qpA, qpB := r.rig.a.qp.Num(), r.rig.b.qp.Num()
	for i := 1; i <= 2; i++ {
		old := r.p.pid
		names, h := r.terminate(t)
		if split && len(h.Aliases) == 0 {
			t.Errorf("restart %d: a's memory file is two regions' descriptor, but the document names no alias", i)
		}
		r.p = r.m.start(t, r.bin, r.args)
		r.m.waitReady(t, r.p)
		// READY=1 comes after FDSTOREREMOVE: everything is removed now.
		if left := r.m.names(); len(left) != 0 {
			t.Errorf("restart %d: the store holds %q after the take-over", i, left)
		}
		t.Logf("restart %d: pid %d -> %d, %d descriptors in the store, %d aliases", i, old, r.p.pid, len(names), len(h.Aliases))
		r.rig.s.waitRounds(t, 50)
		// What the new process holds is what the old one did: the same
		// descriptors, the same pinned memory. (With split memory, the
		// first process also kept the memory table a's MR was registered
		// on; the handover carries the current one, where that MR's
		// pages are pinned the same.)
		lv := levelsOf(t, r.p.pid)
		memfds := base.memfds
		if split && i == 1 {
			memfds = lv.memfds
			if lv.memfds != base.memfds-1 {
				t.Errorf("restart 1: %d memory files, %d before", lv.memfds, base.memfds)
			}
		}
		if lv.eventfds != base.eventfds || lv.memfds != memfds || lv.sockets > base.sockets || lv.lockedKB != base.lockedKB {
			t.Errorf("restart %d: %+v; before the first restart %+v", i, lv, base)
		}
		base.memfds = memfds
		infos, err := r.ctl.Devices(context.Background())
		if err != nil || len(infos) != 2 {
			t.Fatalf("restart %d: devices: %v, %v", i, infos, err)
		}
		for _, in := range infos {
			if !in.Connected {
				t.Errorf("restart %d: device %s is not connected", i, in.ID)
			}
		}
	}
	if r.rig.a.qp.Num() != qpA || r.rig.b.qp.Num() != qpB {
		t.Fatal("QP numbers changed")
	}
	t.Logf("stream: %d rounds, longest pause %v", r.rig.s.rounds.Load(), time.Duration(r.rig.s.maxGap.Load()))
	r.rig.finish(t)
	// systemctl stop: SIGTERM (vrdmad stores again), then systemd
	// releases the store.
	r.p.stop(t)
	r.m.sync()
	r.m.clear()
	if p := r.m.problems(); len(p) > 0 {
		t.Errorf("datagrams systemd would not take: %q", p)
	}
}

// TestDaemonFDStoreIncomplete: the store lacks one of the descriptors the
// document names. The new vrdmad refuses (exits non-zero) and empties the
// store, so the next start is a plain one, which works: the front-ends
// reconnect and see DEVICE_FATAL, the documented fallback.
func TestDaemonFDStoreIncomplete(t *testing.T) {
	r := startFDStoreRig(t, false)
	if err := r.rig.s.end(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	names, _ := r.terminate(t)
	last := names[len(names)-1]
	if !strings.HasPrefix(last, daemon.StoreFDPrefix) || !r.m.drop(last) {
		t.Fatalf("store %q: no descriptor to drop", names)
	}
	p := r.m.start(t, r.bin, r.args)
	if code := p.wait(t); code == 0 {
		t.Fatalf("vrdmad took over from an incomplete store (exit 0)\n%s", p.log())
	}
	if !strings.Contains(p.log(), "missing") {
		t.Errorf("vrdmad's log does not say what is missing:\n%s", p.log())
	}
	r.m.sync()
	if left := r.m.names(); len(left) != 0 {
		t.Fatalf("the refusing vrdmad left %q in the store: every later start would fail the same way", left)
	}
	// A leftover of ours without a document (a handover cut short) does
	// not stop the plain start, which removes it from the store.
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	r.m.inject(daemon.StoreFDPrefix+"3", os.NewFile(uintptr(efd), "stale"))
	r.p = r.m.start(t, r.bin, r.args)
	r.m.waitReady(t, r.p)
	if left := r.m.names(); len(left) != 0 {
		t.Errorf("the plain start left %q in the store", left)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, pr := range []struct {
		name string
		p    *peer
	}{{"a", r.rig.a}, {"b", r.rig.b}} {
		if err := pr.p.f.Reconnect(ctx); err != nil {
			t.Fatalf("%s: reconnect: %v", pr.name, err)
		}
		ev, err := pr.p.ctx.GetAsyncEvent(10 * time.Second)
		if err != nil || ev.Type != abi.EventDeviceFatal {
			t.Errorf("%s: after the plain start: event %+v, %v; want DEVICE_FATAL", pr.name, ev, err)
		}
	}
	r.p.stop(t)
	r.m.sync()
	r.m.clear()
	if p := r.m.problems(); len(p) > 0 {
		t.Errorf("datagrams systemd would not take: %q", p)
	}
}
