package tests

import (
	"context"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestDaemonUpgradeRoCE: live upgrade with a QP connected over the network
// (issue 29). Two vrdmads in two network namespaces joined by a veth, each
// with --roce-bind on its end, serve one device each; a peer in this
// process on each device (their sockets are paths, reachable from any
// namespace) connects an RC QP pair over RoCEv2 from GID index 1, the host
// address, and runs the verified stream of upgrade_test.go (a SEND and a
// WRITE a round, every byte checked). Daemon A, the stream's sender, is
// upgraded twice while the stream runs: its RoCE sockets, the QP's
// transport state (PSNs, the work requests in flight) and the device pass
// to the new process, which stays in A's namespace (it inherits it from
// the old one, started there by `ip netns exec`). Every round is
// verified, no guest sees an async event, and the QP numbers do not
// change.
func TestDaemonUpgradeRoCE(t *testing.T) {
	vrdmad := needBinary(t, "vrdmad")
	lab := netlab.NewT(t)
	addrA, addrB := netip.MustParseAddr("10.200.93.1"), netip.MustParseAddr("10.200.93.2")
	nsA, nsB := vethHosts(t, lab, "ua", "ub", []netip.Prefix{netip.PrefixFrom(addrA, 24)}, []netip.Prefix{netip.PrefixFrom(addrB, 24)})
	pa := startVrdmadIn(t, vrdmad, nsA, []string{"d0"}, "--roce-bind", addrA.String())
	pb := startVrdmadIn(t, vrdmad, nsB, []string{"d0"}, "--roce-bind", addrB.String())
	a, b := openPeer(t, pa.Socket("d0"), 0), openPeer(t, pb.Socket("d0"), 0)
	ga, err := a.ctx.QueryGIDAt(1)
	if err != nil {
		t.Fatal(err)
	}
	gb, err := b.ctx.QueryGIDAt(1)
	if err != nil {
		t.Fatal(err)
	}
	if netip.AddrFrom16(ga).Unmap() != addrA || netip.AddrFrom16(gb).Unmap() != addrB {
		t.Fatalf("GID index 1: %x and %x, want the host addresses %v and %v", ga, gb, addrA, addrB)
	}
	access := abi.AccessAll &^ abi.AccessLocalWrite
	opts := verbs.ConnectOpts{SGIDIndex: 1, PathMTU: abi.MTU1024}
	if err := a.qp.ConnectRCOpts(gb, b.qp.Num(), b.qp.PSN(), access, opts); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRCOpts(ga, a.qp.Num(), a.qp.PSN(), access, opts); err != nil {
		t.Fatal(err)
	}
	s := startStream(a, b)
	s.waitRounds(t, 50)

	qpA, qpB := a.qp.Num(), b.qp.Num()
	netnsOf := func(pid int) string {
		t.Helper()
		l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	nsOfA := netnsOf(pa.Pid())
	if nsOfA == netnsOf(os.Getpid()) {
		t.Fatal("vrdmad A runs in the test's network namespace")
	}
	for i := range 2 {
		old := pa.Pid()
		ctx, cancel := context.WithTimeout(context.Background(), controlapi.UpgradeTimeout)
		ans, err := pa.Upgrade(ctx, "")
		cancel()
		if err != nil {
			t.Fatalf("upgrade %d: %v", i+1, err)
		}
		if ans.PID == old || ans.PID != pa.Pid() || ans.Devices != 1 || ans.Connected != 1 {
			t.Fatalf("upgrade %d: answer %+v (old pid %d)", i+1, ans, old)
		}
		if got := netnsOf(pa.Pid()); got != nsOfA {
			t.Fatalf("upgrade %d: the new vrdmad runs in network namespace %s, the old one ran in %s", i+1, got, nsOfA)
		}
		t.Logf("upgrade %d: pid %d -> %d, data paths paused %.1f ms, state %d bytes", i+1, old, ans.PID, ans.PauseMS, ans.StateBytes)
		s.waitRounds(t, 50)
	}
	if a.qp.Num() != qpA || b.qp.Num() != qpB {
		t.Fatal("QP numbers changed")
	}
	for name, p := range map[string]*peer{"a": a, "b": b} {
		attr, err := p.qp.Query()
		if err != nil || attr.QPState != abi.QPSRTS {
			t.Fatalf("%s's QP after the upgrades: state %d, %v", name, attr.QPState, err)
		}
	}
	t.Logf("stream: %d rounds, longest pause %v", s.rounds.Load(), time.Duration(s.maxGap.Load()))
	if err := s.end(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	noAsyncEvent(t, "a", a)
	noAsyncEvent(t, "b", b)
	a.teardown(t)
	b.teardown(t)
}
