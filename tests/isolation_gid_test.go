package tests

import (
	"math/rand/v2"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// TestIsolationGIDClaims: GIDs are the operator's to assign (issue 25,
// item 2). On one daemon, attacker A (assigned nothing) tries ADD_GID of
// victim B's port GID, of the address B's operator assigned B and B's
// driver added, and of addresses nobody holds: each answers ACCESS and A's
// table is unchanged. C, assigned the same /24 as B, gets BUSY for B's
// address (assigned to both, held by B) and OK for another in its
// assignment. Then bystander D connects to B through the address GID, and
// their verified traffic passes: the claims disturbed nothing.
func TestIsolationGIDClaims(t *testing.T) {
	hygiene(t)
	dir := t.TempDir()
	d := daemon.New(testLogger(t), daemon.Config{})
	t.Cleanup(func() { d.Close() })
	assign := map[string][]netip.Prefix{
		"b": {netip.MustParsePrefix("10.11.0.2/32")},
		"c": {netip.MustParsePrefix("10.11.0.0/24")},
	}
	socks := map[string]string{}
	for _, id := range []string{"a", "b", "c", "d"} {
		socks[id] = filepath.Join(dir, id+".sock")
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: id, Socket: socks[id],
			Device: rdma.Config{ID: id, AllowedGIDs: assign[id]}}); err != nil {
			t.Fatal(err)
		}
	}
	a := openPeerCfg(t, socks["a"], frontend.Config{})
	b := openPeerCfg(t, socks["b"], frontend.Config{})
	c := openPeerCfg(t, socks["c"], frontend.Config{})
	dd := openPeerCfg(t, socks["d"], frontend.Config{})

	addGID := func(p *peer, index uint32, g [16]byte) abi.Status {
		st, _ := rawCmd(t, p, abi.CmdAddGID, abi.Marshal(&abi.GIDEntry{PortNum: 1, Index: index, GID: g, GIDType: abi.GIDTypeRoCEv2}), 0)
		return st
	}
	queryGID := func(p *peer, index uint32) [16]byte {
		st, out := rawCmd(t, p, abi.CmdQueryGID, abi.Marshal(&abi.GIDReq{PortNum: 1, Index: index}), 16)
		if st != abi.StatusOK {
			t.Fatalf("QUERY_GID %d: %v", index, st)
		}
		var g abi.GID
		if err := abi.Unmarshal(out, &g); err != nil {
			t.Fatal(err)
		}
		return g.Raw
	}
	bAddr := netip.MustParseAddr("::ffff:10.11.0.2").As16()

	// B's driver adds its assigned address, as RoCE does for eth0's.
	if st := addGID(b, 1, bAddr); st != abi.StatusOK {
		t.Fatalf("B's ADD_GID of its assigned address: got %v, want OK", st)
	}
	for _, tc := range []struct {
		name string
		g    [16]byte
	}{
		{"B's port GID", b.gid},
		{"B's assigned address", bAddr},
		{"an address nobody holds", netip.MustParseAddr("::ffff:10.11.0.99").As16()},
		{"an IPv6 address", netip.MustParseAddr("2001:db8::7").As16()},
		{"another link-local GID", netip.MustParseAddr("fe80::1").As16()},
	} {
		if st := addGID(a, 2, tc.g); st != abi.StatusAccess {
			t.Errorf("A's ADD_GID of %s: got %v, want ACCESS", tc.name, st)
		}
	}
	if g := queryGID(a, 2); g != ([16]byte{}) {
		t.Fatalf("A's entry 2 after refused claims: %x, want empty", g)
	}
	// A's own port GID at another index is its own.
	if st := addGID(a, 1, a.gid); st != abi.StatusOK {
		t.Fatalf("A's ADD_GID of its own port GID: got %v, want OK", st)
	}
	if st := addGID(c, 1, bAddr); st != abi.StatusBusy {
		t.Fatalf("C's ADD_GID of B's address (assigned to both): got %v, want BUSY", st)
	}
	if st := addGID(c, 1, netip.MustParseAddr("::ffff:10.11.0.3").As16()); st != abi.StatusOK {
		t.Fatalf("C's ADD_GID of an address in its assignment: got %v, want OK", st)
	}
	if info, ok := d.Device("b"); !ok || len(info.Info().Addresses) != 1 || info.Info().Addresses[0] != "10.11.0.2/32" {
		t.Fatalf("B's addresses in the control API: %+v", info.Info().Addresses)
	}

	// D reaches B through B's address GID, and B sends from it (entry 1,
	// as perftest -x 1 would): traffic both ways is verified.
	acc := abi.AccessAll &^ abi.AccessLocalWrite
	if err := dd.qp.ConnectRC(bAddr, b.qp.Num(), b.qp.PSN(), acc); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRCOpts(dd.gid, dd.qp.Num(), dd.qp.PSN(), acc, verbs.ConnectOpts{SGIDIndex: 1}); err != nil {
		t.Fatal(err)
	}
	verifiedWrite(t, dd, b, 0x31)
	verifiedWrite(t, b, dd, 0x32)
	noRingErrors(t, d, "a", "b", "c", "d")
}

// TestIsolationGIDClaimsRemote: a host's network address can never be
// claimed locally, however wide the operator's assignment. Daemons X and Y
// carry RoCE on two loopback addresses; V on X is connected to W on Y
// through them. Attacker A on X, assigned all of 127.0.0.0/8, tries
// ADD_GID of Y's address (a remote peer in use) and of X's own address
// (its shared network GID: held, never owned): the first answers ACCESS,
// the second OK without making A its owner; V and W then exchange
// verified traffic, so nothing of it resolves to A.
func TestIsolationGIDClaimsRemote(t *testing.T) {
	hygiene(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 25))
	addrX := netip.AddrFrom4([4]byte{127, byte(1 + rng.IntN(250)), byte(rng.IntN(256)), byte(1 + rng.IntN(250))})
	addrY := addrX.Next()
	dx, sx := roceDaemon(t, addrX, rdma.Config{ID: "a", AllowedGIDs: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}},
		rdma.Config{ID: "v"})
	dy, sy := roceDaemon(t, addrY, rdma.Config{ID: "w"})
	a := openPeerCfg(t, sx[0], frontend.Config{})
	v := openPeerCfg(t, sx[1], frontend.Config{})
	w := openPeerCfg(t, sy[0], frontend.Config{})
	gidX, gidY := udp.GID(addrX), udp.GID(addrY)

	acc := abi.AccessAll &^ abi.AccessLocalWrite
	opts := verbs.ConnectOpts{SGIDIndex: 1, PathMTU: abi.MTU1024}
	if err := v.qp.ConnectRCOpts(gidY, w.qp.Num(), w.qp.PSN(), acc, opts); err != nil {
		t.Fatal(err)
	}
	if err := w.qp.ConnectRCOpts(gidX, v.qp.Num(), v.qp.PSN(), acc, opts); err != nil {
		t.Fatal(err)
	}
	addGID := func(p *peer, index uint32, g [16]byte) abi.Status {
		st, _ := rawCmd(t, p, abi.CmdAddGID, abi.Marshal(&abi.GIDEntry{PortNum: 1, Index: index, GID: g, GIDType: abi.GIDTypeRoCEv2}), 0)
		return st
	}
	if st := addGID(a, 2, gidY); st != abi.StatusAccess {
		t.Fatalf("A's ADD_GID of the remote peer's address (assigned 127.0.0.0/8): got %v, want ACCESS", st)
	}
	if st := addGID(a, 3, gidX); st != abi.StatusOK {
		t.Fatalf("A's ADD_GID of its own network GID: got %v, want OK (shared)", st)
	}
	// addrX's and addrY's second octet is at least 1: 127.0.0.77 is neither.
	if st := addGID(a, 4, netip.MustParseAddr("::ffff:127.0.0.77").As16()); st != abi.StatusOK {
		t.Fatalf("A's ADD_GID of an assigned address nobody uses: got %v, want OK", st)
	}
	verifiedWrite(t, v, w, 0x41)
	verifiedWrite(t, w, v, 0x42)
	noRingErrors(t, dx, "a", "v")
	noRingErrors(t, dy, "w")
}
