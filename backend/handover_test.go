package backend

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// serveOn starts serving srv and returns Serve's result channel.
func serveOn(srv *Server) chan error {
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background()) }()
	return done
}

// expectNothing checks that nothing waits on the backend channel.
func expectNothing(t *testing.T, bc *vu.Conn) {
	t.Helper()
	rc, err := bc.UnixConn().SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if ierr != nil || n != 0 {
		t.Fatalf("backend channel holds %d bytes (%v), want none", n, ierr)
	}
}

// TestFreezeAdopt: a front-end with memory, a backend channel and two
// running rings is handed from server A to server B (the state through
// JSON, the fds A's dups): it goes on without a message or a reset —
// a kick sent while frozen is served by B, rings, config reads and later
// ring messages work, B's device can notify — then a disconnect tears B
// down and a reconnect is served.
func TestFreezeAdopt(t *testing.T) {
	devA, devB := newFakeDevice(2), newFakeDevice(2)
	checkNoLeaks(t, func() {
		srvA, doneA := serveDevice(t, devA)
		f := dialFrontend(t, srvA)
		f.ready()
		bc, _ := f.backendChannel()
		r0, r1 := f.startRing(0, 0), f.startRing(1, 0)
		f.mustAck(vu.SetStatus, vu.EncodeU64(0xf))
		for range 3 {
			f.roundTrip(r0, "before")
		}
		f.roundTrip(r1, "before")
		devA.takeCalls()

		st, fds, err := srvA.Freeze()
		if err != nil {
			t.Fatalf("Freeze: %v", err)
		}
		if _, _, err := srvA.Freeze(); !errors.Is(err, errFrozen) {
			t.Fatalf("second Freeze: %v, want errFrozen", err)
		}
		// A kick while frozen: nobody serves it yet, it stays in the eventfd.
		out := f.post(r0, []byte("frozen"))
		b, err := json.Marshal(st)
		if err != nil {
			t.Fatal(err)
		}
		var got ServerState
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if ss := got.Session; ss == nil || len(ss.Rings) != 2 || !ss.Rings[0].Started || ss.Rings[0].LastAvail != 3 ||
			ss.Rings[0].UsedIdx != 3 || len(ss.Regions) != 1 || ss.Backend < 0 || ss.Status != 0xf {
			t.Fatalf("state: %s", b)
		}
		srvB, err := Adopt(Config{Socket: srvA.Socket(), Device: devB}, &got, fds, WithLogger(discardLog()))
		if err != nil {
			t.Fatalf("Adopt: %v", err)
		}
		if calls := devB.takeCalls(); !slices.Equal(calls, []string{"Attach", "MemoryChanged"}) {
			t.Fatalf("device B calls at Adopt: %q, want Attach, MemoryChanged", calls)
		}
		// A goes away: its Close resets its own device but sends nothing
		// and closes only its own descriptors; the socket file stays.
		if err := srvA.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-doneA; err != nil {
			t.Fatalf("Serve A: %v", err)
		}
		if _, err := os.Lstat(srvA.Socket()); err != nil {
			t.Fatalf("socket file after the frozen server's Close: %v", err)
		}
		doneB := serveOn(srvB)

		if _, err := r0.call.WaitTimeout(waitLong); err != nil {
			t.Fatalf("the kick sent while frozen was not served: %v", err)
		}
		if _, n, ok, err := r0.dq.Used(); err != nil || !ok || string(f.mem[out:out+uint64(n)]) != "frozen" {
			t.Fatalf("used after handover: ok=%v err=%v", ok, err)
		}
		f.roundTrip(r0, "after")
		f.roundTrip(r1, "after")
		if cfg := f.getConfig(0, 4); string(cfg) != "0123" {
			t.Fatalf("GET_CONFIG after handover: %q", cfg)
		}
		if got := f.getU64(vu.GetStatus); got != 0xf {
			t.Fatalf("GET_STATUS after handover: %#x, want 0xf", got)
		}
		// Ring 1: stop, read its base, start it again from there.
		m := f.call(vu.GetVringBase, state(1, 0))
		vs, err := vu.DecodeVringState(m.Payload)
		if err != nil || vs.Num != 2 {
			t.Fatalf("GET_VRING_BASE ring 1: %+v, %v; want 2", vs, err)
		}
		f.mustAck(vu.SetVringBase, state(1, vs.Num))
		f.mustAck(vu.SetVringKick, vringFile(1, false), r1.kick.Fd())
		f.roundTrip(r1, "restarted")
		if devB.Host().Resumed() {
			t.Fatal("Resumed: true after a handover")
		}
		if err := devB.Host().NotifyConfigChange(); err != nil {
			t.Fatal(err)
		}
		if m, err := bc.ReadMessage(); err != nil || m.Header.Request != uint32(vu.BackendConfigChangeMsg) {
			t.Fatalf("backend channel after handover: %v, %v", m, err)
		}
		expectNothing(t, bc)
		if p, ok := srvB.Peer(); !ok || !p.Known || p.PID != int32(os.Getpid()) {
			t.Fatalf("Peer after handover: %+v, %v", p, ok)
		}
		if c := devB.takeCalls(); slices.Contains(c, "Reset") {
			t.Fatalf("device B was reset: %q", c)
		}
		if st := srvB.Stats(); st.Sessions != 1 || st.MemTables != 1 || st.RingErrors != 0 {
			t.Fatalf("stats of B: %+v", st)
		}

		f.close()
		bc.Close()
		waitDetached(t, devB, 1)
		waitFor(t, "B's session to end", func() bool { return !srvB.Connected() })
		g := dialFrontend(t, srvB)
		g.ready(0)
		g.roundTrip(g.rings[0], "reconnected")
		g.close()
		waitDetached(t, devB, 2)
		if err := srvB.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-doneB; err != nil {
			t.Fatalf("Serve B: %v", err)
		}
		if _, err := os.Lstat(srvB.Socket()); !os.IsNotExist(err) {
			t.Fatalf("socket file after B's Close: %v", err)
		}
	})
}

// TestFreezeThaw: a frozen server that is thawed goes on as before: the
// kick sent while frozen is served, a front-end that connected meanwhile
// waits, the ring messages and the device's config changes work.
func TestFreezeThaw(t *testing.T) {
	dev := newFakeDevice(1)
	srv, _ := serveDevice(t, dev)
	f := dialFrontend(t, srv)
	f.ready(0)
	bc, _ := f.backendChannel()
	r := f.rings[0]
	f.roundTrip(r, "one")
	st, fds, err := srv.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	closeFds(fds)
	if st.Session == nil || st.Session.Rings[0].LastAvail != 1 {
		t.Fatalf("state: %+v", st.Session)
	}
	out := f.post(r, []byte("frozen"))
	if err := dev.Host().NotifyConfigChange(); err != nil { // recorded, not sent
		t.Fatal(err)
	}
	expectNothing(t, bc)
	f.write(vu.GetQueueNum, 0, nil, nil) // waits in the socket
	srv.Thaw()
	srv.Thaw() // a no-op
	m, err := f.read()
	if err != nil || vu.CheckReply(vu.GetQueueNum, m) != nil {
		t.Fatalf("GET_QUEUE_NUM sent while frozen: %v, %v", m, err)
	}
	if _, err := r.call.WaitTimeout(waitLong); err != nil {
		t.Fatalf("kick sent while frozen not served after Thaw: %v", err)
	}
	if _, n, ok, err := r.dq.Used(); err != nil || !ok || string(f.mem[out:out+uint64(n)]) != "frozen" {
		t.Fatalf("used after Thaw: ok=%v err=%v", ok, err)
	}
	if m, err := bc.ReadMessage(); err != nil || m.Header.Request != uint32(vu.BackendConfigChangeMsg) {
		t.Fatalf("config change recorded while frozen: %v, %v", m, err)
	}
	f.roundTrip(r, "two")
	if slices.Contains(dev.takeCalls(), "Reset") {
		t.Fatal("device reset by Freeze/Thaw")
	}
	// Freeze again, then the front-end goes: Close of the frozen server
	// still ends everything.
	if _, fds, err = srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	closeFds(fds)
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	waitDetached(t, dev, 1)
	if _, _, err := srv.Freeze(); !errors.Is(err, errClosed) {
		t.Fatalf("Freeze after Close: %v, want errClosed", err)
	}
}

// TestFreezeIdle: a server without a front-end freezes to a listener
// alone, and an adopted one serves the next front-end.
func TestFreezeIdle(t *testing.T) {
	devA, devB := newFakeDevice(1), newFakeDevice(1)
	srvA, _ := serveDevice(t, devA)
	st, fds, err := srvA.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	if st.Session != nil || len(fds) != 1 || !st.UnlinkOnClose {
		t.Fatalf("idle state: %+v, %d fds", st, len(fds))
	}
	srvB, err := Adopt(Config{Socket: srvA.Socket(), Device: devB}, st, fds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srvB.Close() })
	srvA.Close()
	serveOn(srvB)
	f := dialFrontend(t, srvB)
	f.ready(0)
	f.roundTrip(f.rings[0], "new")
	if devA.count("Attach") != 0 {
		t.Fatal("the frozen server served the front-end")
	}
}

// validState is a state for adoptFds' fds: the listener at 0, the
// connection at 1, a region at 2, a kick at 3; two rings.
func validState() *ServerState {
	return &ServerState{
		Listener: 0,
		Session: &SessionState{
			Conn: 1, Backend: -1, Features: 1 << 32,
			Regions: []RegionState{{GuestAddr: 0, Size: 0x10000, UserAddr: userBase, FD: 2}},
			Rings: []RingState{
				{Num: 64, AddrSet: true, Desc: userBase, Avail: userBase + 0x1000, Used: userBase + 0x2000, Started: true, Enabled: true, Kick: 3, Call: -1, Err: -1},
				{Kick: -1, Call: -1, Err: -1},
			},
		},
	}
}

// adoptFds makes real descriptors for validState: a listening socket on
// sock, one end of a socketpair, a memfd, an eventfd, and (at 4) a regular
// file.
func adoptFds(t *testing.T, sock string) []int {
	t.Helper()
	ln, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(ln, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(ln, 1); err != nil {
		t.Fatal(err)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(pair[1]) })
	mem, err := unix.MemfdCreate("vrdma-backend-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(mem, 0x10000); err != nil {
		t.Fatal(err)
	}
	ev, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	file, err := unix.Open(filepath.Join(t.TempDir(), "f"), unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(file, 0x10000); err != nil {
		t.Fatal(err)
	}
	return []int{ln, pair[0], mem, ev, file}
}

// TestAdoptRejects: Adopt refuses bad states and closes every descriptor
// the state names (the regular file at 4 is named only by some cases;
// when it is not named it stays the caller's).
func TestAdoptRejects(t *testing.T) {
	tests := []struct {
		name string
		edit func(st *ServerState)
	}{
		{"no listener", func(st *ServerState) { st.Listener = -1 }},
		{"listener index out of range", func(st *ServerState) { st.Listener = 9 }},
		{"fd index reused", func(st *ServerState) { st.Session.Rings[1].Call = 3 }},
		{"ring count", func(st *ServerState) { st.Session.Rings = st.Session.Rings[:1] }},
		{"ring size", func(st *ServerState) { st.Session.Rings[0].Num = 48 }},
		{"ring size above the device's", func(st *ServerState) { st.Session.Rings[0].Num = 512 }},
		{"started without kick", func(st *ServerState) { st.Session.Rings[0].Kick = -1 }},
		{"feature not offered", func(st *ServerState) { st.Session.Features = 1 << 33 }},
		{"protocol features not offered", func(st *ServerState) {
			st.Session.Protocol, st.Session.ProtocolSet = 1<<40, true
		}},
		{"backend channel without BACKEND_REQ", func(st *ServerState) { st.Session.Backend = 4 }},
		{"region overlap", func(st *ServerState) {
			st.Session.Regions = append(st.Session.Regions, RegionState{GuestAddr: 0x8000, Size: 0x1000, UserAddr: 0x1000, FD: 4})
		}},
		{"region past its file", func(st *ServerState) { st.Session.Regions[0].Size = 0x20000 }},
		{"region of a non-mappable file", func(st *ServerState) { st.Session.Regions[0].FD = 3; st.Session.Rings[0].Kick = 2 }},
		{"listener not a socket", func(st *ServerState) { st.Listener, st.Session.Rings[1].Err = 4, 0 }},
		{"conn not a socket", func(st *ServerState) { st.Session.Conn, st.Session.Rings[1].Err = 4, 1 }},
		{"conn is the listener", func(st *ServerState) { st.Listener, st.Session.Conn = 1, 0 }},
		{"kick not an eventfd", func(st *ServerState) { st.Session.Rings[0].Kick, st.Session.Rings[1].Kick = 4, 3 }},
		{"broken reason too long", func(st *ServerState) { st.Session.Rings[0].Broken = string(make([]byte, maxBrokenLen+1)) }},
		{"no session rings", func(st *ServerState) { st.Session.Rings = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "s.sock")
			before := openFds(t)
			fds := adoptFds(t, sock)
			st := validState()
			tt.edit(st)
			named := map[int]bool{}
			for _, i := range st.indexes() {
				if i >= 0 && i < len(fds) {
					named[i] = true
				}
			}
			srv, err := Adopt(Config{Socket: sock, Device: newFakeDevice(2)}, st, fds)
			if err == nil {
				srv.Close()
				t.Fatal("Adopt accepted the state")
			}
			t.Log(err)
			for i, fd := range fds {
				_, ferr := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
				if open := ferr == nil; open == named[i] {
					t.Errorf("fd %d (index %d): open %v after a refused Adopt, named %v", fd, i, open, named[i])
				}
				if !named[i] && ferr == nil {
					unix.Close(fd)
				}
			}
			if got := openFds(t); got != before+1 { // the socketpair's other end
				t.Errorf("open fds: %d, want %d", got, before+1)
			}
		})
	}
	// The valid state itself is adopted (the checks above can fail).
	sock := filepath.Join(t.TempDir(), "s.sock")
	fds := adoptFds(t, sock)
	srv, err := Adopt(Config{Socket: sock, Device: newFakeDevice(2)}, validState(), fds)
	if err != nil {
		t.Fatalf("Adopt of the valid state: %v", err)
	}
	unix.Close(fds[4])
	srv.Close()
}
