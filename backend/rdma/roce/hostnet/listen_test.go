package hostnet

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
)

// TestListenFree: an address on no interface of this host (TEST-NET-1)
// cannot be listened on, but a migration's destination opens it with
// ListenFree (IP_FREEBIND); its path MTU is not known until the address
// arrives, so nothing is cached for it. Nothing is sent.
func TestListenFree(t *testing.T) {
	n, err := New(udp.Config{}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	away := netip.MustParseAddr("192.0.2.77")
	if _, ok := udp.FindLinkPMTU(away); ok {
		t.Skipf("%v is on an interface of this host", away)
	}
	if _, err := n.Listen(away); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("Listen on an address of no interface: got %v, want EADDRNOTAVAIL", err)
	}
	e, err := n.ListenFree(away)
	if err != nil {
		t.Fatalf("ListenFree: %v", err)
	}
	if got := e.LocalAddr().Addr(); got != away {
		t.Fatalf("the endpoint is on %v, want %v", got, away)
	}
	if again, err := n.Listen(away); err != nil || again != e {
		t.Fatalf("Listen after ListenFree: %v, %v: want the same endpoint", again, err)
	}
	n.mu.Lock()
	_, cached := n.pmtu[away]
	m := n.pmtuLocked(away)
	n.mu.Unlock()
	if cached || m != 0 {
		t.Fatalf("path MTU of an address on no interface: cached %v, %d; want none", cached, m)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	if _, err := n.ListenFree(lo); err != nil {
		t.Fatal(err)
	}
	n.mu.Lock()
	m = n.pmtuLocked(lo)
	n.mu.Unlock()
	if want := udp.LinkPMTU(lo); m != want {
		t.Fatalf("path MTU of loopback opened with ListenFree: %d, want %d", m, want)
	}
}
