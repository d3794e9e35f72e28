package tests

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma"
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
