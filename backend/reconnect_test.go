package backend

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// serveDevice starts a Server for dev on a fresh socket and returns it
// with a channel that receives Serve's result.
func serveDevice(t *testing.T, dev *fakeDevice) (*Server, chan error) {
	t.Helper()
	s, err := Listen(Config{Socket: filepath.Join(t.TempDir(), "dev.sock"), Device: dev}, WithLogger(discardLog()))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background()) }()
	t.Cleanup(func() { s.Close() })
	return s, done
}

// waitDetached waits until the device has been detached n times in all.
func waitDetached(t *testing.T, dev *fakeDevice, n int) {
	t.Helper()
	waitFor(t, "Detach", func() bool { return dev.count("Detach") == n })
}

// TestReconnect: a front-end that set everything up (memory, running
// rings, backend channel) disconnects and a new one connects: the device
// was reset and detached, the new session starts from nothing, and no fd
// or mapping of the first one survives.
func TestReconnect(t *testing.T) {
	dev := newFakeDevice(2)
	srv, done := serveDevice(t, dev)
	checkNoLeaks(t, func() {
		for round := range 3 {
			f := dialFrontend(t, srv)
			if got := f.getU64(vu.GetStatus); got != 0 {
				t.Fatalf("round %d: GET_STATUS at connect: %#x, want 0", round, got)
			}
			f.ready()
			bc, _ := f.backendChannel()
			// A new session starts its rings from scratch: a base of 0
			// is not a resume, and there is nothing to resume from.
			f.startRing(0, 0)
			f.startRing(1, 0)
			f.mustAck(vu.SetStatus, vu.EncodeU64(0xf))
			for i := range 2 {
				f.roundTrip(f.rings[i], "round")
			}
			if !srv.Connected() {
				t.Fatal("Connected: false with a front-end")
			}
			f.close()
			bc.Close()
			waitDetached(t, dev, round+1)
			waitFor(t, "the session to end", func() bool { return !srv.Connected() })
		}
	})
	calls := dev.takeCalls()
	if n := slices.Index(calls, "Detach"); n < 1 || calls[n-1] != "Reset" || calls[0] != "Attach" {
		t.Fatalf("device calls: %q, want Attach ... Reset, Detach", calls)
	}
	st := srv.Stats()
	if st.Sessions != 3 || st.Refused != 0 || st.ProtocolErrors != 0 || st.MemTables != 3 {
		t.Fatalf("stats: %+v", st)
	}
	if st.Messages == 0 || st.Interrupts < 6 {
		t.Fatalf("stats: %+v", st)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if _, err := os.Lstat(srv.Socket()); !os.IsNotExist(err) {
		t.Fatalf("socket file after Close: %v", err)
	}
	if err := srv.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestReconnectResumes: a front-end that comes back with running rings
// (QEMU's reconnect-ms) restarts them from the used index in guest memory,
// which this session never handed out: the device learns that its state
// for the driver is lost.
func TestReconnectResumes(t *testing.T) {
	dev := newFakeDevice(1)
	srv, _ := serveDevice(t, dev)
	f := dialFrontend(t, srv)
	f.ready(0)
	for range 3 {
		f.roundTrip(f.rings[0], "x")
	}
	used := abi.LoadUint16(f.rings[0].usedRings, 2)
	f.conn.Close()
	waitDetached(t, dev, 1)

	g := dialFrontend(t, srv)
	g.ready()
	g.mustAck(vu.SetVringNum, state(0, queueSize))
	g.mustAck(vu.SetVringBase, state(0, uint32(used)))
	if !dev.Host().Resumed() {
		t.Fatal("Resumed: false after a restart from index 3 on a new connection")
	}
}

// TestHandover: a front-end that connects while the previous one is still
// connected waits for it to go (a reconnecting QEMU whose old connection
// is being torn down) and is then served.
func TestHandover(t *testing.T) {
	dev := newFakeDevice(1)
	srv, _ := serveDevice(t, dev)
	first := dialFrontend(t, srv)
	first.ready(0)
	second := dialFrontend(t, srv)
	second.write(vu.GetQueueNum, 0, nil, nil)
	time.Sleep(50 * time.Millisecond)
	first.close()
	m, err := second.read()
	if err != nil || vu.CheckReply(vu.GetQueueNum, m) != nil {
		t.Fatalf("second front-end not served after the first left: %v", err)
	}
	if st := srv.Stats(); st.Sessions != 2 || st.Refused != 0 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestDisconnect: Server.Disconnect ends the session as a front-end
// disconnect would, and the server takes the next front-end.
func TestDisconnect(t *testing.T) {
	dev := newFakeDevice(1)
	srv, _ := serveDevice(t, dev)
	srv.Disconnect() // nobody connected: a no-op
	f := dialFrontend(t, srv)
	f.ready(0)
	f.roundTrip(f.rings[0], "x")
	srv.Disconnect()
	f.expectClosed(nil)
	waitDetached(t, dev, 1)
	g := dialFrontend(t, srv)
	g.sync()
}

// TestCloseWithFrontend: Close ends the connected session (releasing its
// device) and Serve returns; a front-end arriving after Close is refused.
func TestCloseWithFrontend(t *testing.T) {
	dev := newFakeDevice(1)
	srv, done := serveDevice(t, dev)
	f := dialFrontend(t, srv)
	f.ready(0)
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if dev.count("Detach") != 1 {
		t.Fatal("Close returned before the session released the device")
	}
	f.expectClosed(nil)
	if _, err := net.Dial("unix", srv.Socket()); err == nil {
		t.Fatal("dial after Close succeeded")
	}
}

// TestServeContext: cancelling Serve's context closes the server.
func TestServeContext(t *testing.T) {
	dev := newFakeDevice(1)
	s, err := Listen(Config{Socket: filepath.Join(t.TempDir(), "ctx.sock"), Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	f := dialFrontend(t, s)
	f.sync()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(waitLong):
		t.Fatal("Serve did not return after its context ended")
	}
	if s.Device() != dev {
		t.Fatal("Device: not the configured device")
	}
}

// TestAdmitAfterClose: a connection accepted just as the server closes is
// closed, not served.
func TestAdmitAfterClose(t *testing.T) {
	s, err := Listen(Config{Socket: filepath.Join(t.TempDir(), "a.sock"), Device: newFakeDevice(1)})
	if err != nil {
		t.Fatal(err)
	}
	a, b := socketpair(t)
	defer a.Close()
	s.Close()
	s.wg.Add(1)
	s.admit(b)
	a.SetReadDeadline(time.Now().Add(waitLong))
	if n, err := a.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("read: %d, %v; want the connection closed", n, err)
	}
}

func TestListenErrors(t *testing.T) {
	dir := t.TempDir()
	dev := newFakeDevice(1)
	if _, err := Listen(Config{Device: dev}); err == nil {
		t.Error("Listen without a socket path: got nil error")
	}
	if _, err := Listen(Config{Socket: filepath.Join(dir, "x.sock")}); err == nil {
		t.Error("Listen without a device: got nil error")
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(Config{Socket: file, Device: dev}); err == nil {
		t.Error("Listen over a regular file: got nil error")
	}
	if _, err := Listen(Config{Socket: filepath.Join(dir, "missing", "x.sock"), Device: dev}); err == nil {
		t.Error("Listen in a missing directory: got nil error")
	}
	if _, err := Listen(Config{Socket: filepath.Join(file, "x.sock"), Device: dev}); err == nil {
		t.Error("Listen under a regular file: got nil error")
	}
	// A live socket is not replaced.
	live, _ := serveDevice(t, dev)
	if _, err := Listen(Config{Socket: live.Socket(), Device: dev}); err == nil {
		t.Error("Listen over a live socket: got nil error")
	}
	// A stale one (nobody listening) is.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	s, err := Listen(Config{Socket: stale, Device: dev, Mode: 0o660})
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	defer s.Close()
	if fi, err := os.Stat(stale); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode: %v %v, want 0660", fi.Mode().Perm(), err)
	}
}

func TestFromListenerNil(t *testing.T) {
	if _, err := FromListener(nil, Config{Device: newFakeDevice(1)}); err == nil {
		t.Fatal("FromListener(nil): got nil error")
	}
}

// TestServerSessionError: a session that ends with a protocol error frees
// the device for the next front-end like a clean disconnect.
func TestServerSessionError(t *testing.T) {
	dev := newFakeDevice(1)
	srv, _ := serveDevice(t, dev)
	f := dialFrontend(t, srv)
	f.ready(0)
	f.writeRaw(header(vu.GetFeatures, 3, 0))
	f.expectClosed(nil)
	waitDetached(t, dev, 1)
	g := dialFrontend(t, srv)
	g.sync()
	if st := srv.Stats(); st.Sessions != 2 {
		t.Fatalf("stats: %+v", st)
	}
}
