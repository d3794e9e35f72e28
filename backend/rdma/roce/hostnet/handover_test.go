package hostnet

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// newNet returns a network whose endpoints bind port (tests use their own
// loopback addresses, 127.77.x.y, so that they bind nothing another test
// binds).
func newNet(t *testing.T, port uint16) *Network {
	t.Helper()
	n, err := New(udp.Config{Port: port, Tick: time.Millisecond}, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

func listenOn(t *testing.T, n *Network, addr string) *udp.Endpoint {
	t.Helper()
	e, err := n.Listen(netip.MustParseAddr(addr))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// sendJunk sends count datagrams of 40 bytes to dst from a socket of its
// own: the endpoint counts each received (malformed), which is all a test
// of the sockets needs.
func sendJunk(t *testing.T, dst netip.AddrPort, count int) {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 0)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := make([]byte, 40)
	for i := range count {
		b[0] = byte(i)
		if _, err := c.WriteToUDPAddrPort(b, dst); err != nil {
			t.Fatal(err)
		}
	}
}

func waitRx(t *testing.T, e *udp.Endpoint, want uint64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for e.Counters().RxDatagrams < want {
		if time.Now().After(deadline) {
			t.Fatalf("endpoint %v received %d datagrams, want %d", e.LocalAddr(), e.Counters().RxDatagrams, want)
		}
		time.Sleep(time.Millisecond)
	}
	if got := e.Counters().RxDatagrams; got != want {
		t.Fatalf("endpoint %v received %d datagrams, want %d", e.LocalAddr(), got, want)
	}
}

// fdOpen reports whether fd is an open descriptor.
func fdOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

// openFDs counts the process's open descriptors (a descriptor number may
// be reused at once, so tests count rather than look at numbers).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestFreezeThaw: datagrams that arrive while the network is frozen stay
// in the socket and are received, every one, after Thaw; a frozen
// network's new endpoint starts frozen.
func TestFreezeThaw(t *testing.T) {
	n := newNet(t, 4791)
	e := listenOn(t, n, "127.77.1.1")
	sendJunk(t, e.LocalAddr(), 3)
	waitRx(t, e, 3)
	st, fds, err := n.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if len(st.Endpoints) != 1 || st.Endpoints[0] != (EndpointState{Addr: "127.77.1.1", Port: 4791, FD: 0}) {
		t.Fatalf("state %+v", st)
	}
	late := listenOn(t, n, "127.77.1.2")
	if !e.Frozen() || !late.Frozen() || !n.Frozen() {
		t.Fatal("frozen network with a running endpoint")
	}
	sendJunk(t, e.LocalAddr(), 50)
	sendJunk(t, late.LocalAddr(), 5)
	time.Sleep(20 * time.Millisecond) // a running receiver would count them by now
	if got := e.Counters().RxDatagrams; got != 3 {
		t.Fatalf("frozen endpoint received %d datagrams, want 3", got)
	}
	n.Thaw()
	waitRx(t, e, 53)
	waitRx(t, late, 5)
	n.Thaw() // no-op
	if e.Frozen() || n.Frozen() {
		t.Fatal("thawed network still frozen")
	}
}

// TestAdopt hands a network's sockets to a new network: the datagrams that
// arrive between the freeze and the thaw of the new one, and after the old
// one is closed, are all received by the new one.
func TestAdopt(t *testing.T) {
	old := newNet(t, 4791)
	e1 := listenOn(t, old, "127.77.2.1")
	e2 := listenOn(t, old, "127.77.2.2")
	sendJunk(t, e1.LocalAddr(), 2)
	waitRx(t, e1, 2)
	st, fds, err := old.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Endpoints) != 2 || len(fds) != 2 {
		t.Fatalf("state %+v, %d descriptors", st, len(fds))
	}
	sendJunk(t, e1.LocalAddr(), 10)
	sendJunk(t, e2.LocalAddr(), 7)

	nw := newNet(t, 4791)
	before := openFDs(t)
	if err := nw.Adopt(st, fds); err != nil {
		t.Fatal(err)
	}
	// Each descriptor given is closed, each endpoint holds one of its own.
	if got := openFDs(t); got != before {
		t.Errorf("%d descriptors open after Adopt, %d before", got, before)
	}
	eps := nw.Endpoints()
	if len(eps) != 2 || eps[0].LocalAddr() != e1.LocalAddr() || eps[1].LocalAddr() != e2.LocalAddr() {
		t.Fatalf("adopted endpoints %v, want %v and %v", eps, e1.LocalAddr(), e2.LocalAddr())
	}
	// Listen gives the adopted endpoint, not a new socket.
	if e := listenOn(t, nw, "127.77.2.1"); e != eps[0] {
		t.Fatal("Listen bound a new endpoint for an adopted address")
	}
	time.Sleep(20 * time.Millisecond)
	if eps[0].Counters().RxDatagrams != 0 || !nw.Frozen() {
		t.Fatal("the adopted network received before Thaw")
	}
	// The old process goes away; the socket lives on in the new one.
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	nw.Thaw()
	waitRx(t, eps[0], 10)
	waitRx(t, eps[1], 7)
	sendJunk(t, e1.LocalAddr(), 4)
	waitRx(t, eps[0], 14)
}

// TestAdoptRefused: states and descriptors Adopt refuses, each leaving the
// network empty and every descriptor closed.
func TestAdoptRefused(t *testing.T) {
	udpSock := func(addr string) int {
		t.Helper()
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		a := netip.MustParseAddr(addr).As4()
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 4791, Addr: a}); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	tcpSock := func() int {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: 4791, Addr: [4]byte{127, 77, 3, 1}}); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	pipe := func() int {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(p[1])
		return p[0]
	}
	one := func(addr string, port uint16, fd int) *NetworkState {
		return &NetworkState{Endpoints: []EndpointState{{Addr: addr, Port: port, FD: fd}}}
	}
	tests := []struct {
		name string
		st   *NetworkState
		fds  func() []int
	}{
		{"nil state", nil, func() []int { return []int{udpSock("127.77.3.1")} }},
		{"bad address", one("127.77.3.x", 4791, 0), func() []int { return []int{udpSock("127.77.3.1")} }},
		{"unspecified address", one("0.0.0.0", 4791, 0), func() []int { return []int{udpSock("127.77.3.1")} }},
		{"mapped address", one("::ffff:127.77.3.1", 4791, 0), func() []int { return []int{udpSock("127.77.3.1")} }},
		{"port 0", one("127.77.3.1", 0, 0), func() []int { return []int{udpSock("127.77.3.1")} }},
		{"index out of range", one("127.77.3.1", 4791, 1), func() []int { return []int{udpSock("127.77.3.1")} }},
		{"negative index", one("127.77.3.1", 4791, -1), func() []int { return []int{udpSock("127.77.3.1")} }},
		{"index twice", &NetworkState{Endpoints: []EndpointState{{Addr: "127.77.3.1", Port: 4791}, {Addr: "127.77.3.2", Port: 4791}}},
			func() []int { return []int{udpSock("127.77.3.1")} }},
		{"address twice", &NetworkState{Endpoints: []EndpointState{{Addr: "127.77.3.1", Port: 4791}, {Addr: "127.77.3.1", Port: 4791, FD: 1}}},
			func() []int { return []int{udpSock("127.77.3.1"), udpSock("127.77.3.2")} }},
		{"socket of another address", one("127.77.3.1", 4791, 0), func() []int { return []int{udpSock("127.77.3.3")} }},
		{"socket of another port", one("127.77.3.1", 4792, 0), func() []int { return []int{udpSock("127.77.3.1")} }},
		{"TCP socket", one("127.77.3.1", 4791, 0), func() []int { return []int{tcpSock()} }},
		{"not a socket", one("127.77.3.1", 4791, 0), func() []int { return []int{pipe()} }},
		{"second endpoint bad", &NetworkState{Endpoints: []EndpointState{{Addr: "127.77.3.1", Port: 4791}, {Addr: "127.77.3.2", Port: 4791, FD: 1}}},
			func() []int { return []int{udpSock("127.77.3.1"), pipe()} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNet(t, 4791)
			fds := tt.fds()
			before := openFDs(t)
			err := n.Adopt(tt.st, fds)
			if err == nil {
				t.Fatal("Adopt accepted it")
			}
			t.Log(err)
			if len(n.Endpoints()) != 0 {
				t.Fatalf("refused Adopt left %d endpoints", len(n.Endpoints()))
			}
			if got := openFDs(t); got != before-len(fds) {
				t.Errorf("%d descriptors open after a refused Adopt of %d, %d before", got, len(fds), before)
			}
			if tt.st != nil && len(tt.st.Endpoints) == 1 && !errors.Is(err, ErrState) && !errors.Is(err, udp.ErrConfig) {
				t.Errorf("error %v is neither ErrState nor udp.ErrConfig", err)
			}
		})
	}
	// A network that has endpoints adopts nothing.
	n := newNet(t, 4791)
	listenOn(t, n, "127.77.3.9")
	fd := udpSock("127.77.3.1")
	if err := n.Adopt(one("127.77.3.1", 4791, 0), []int{fd}); err == nil || fdOpen(fd) {
		t.Fatalf("Adopt into a network with endpoints: %v (descriptor open: %v)", err, fdOpen(fd))
	}
}
