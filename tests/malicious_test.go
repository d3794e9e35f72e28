package tests

import (
	"testing"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// TestRingOutsideMemory: ring addresses that are not in guest memory (or
// straddle its end) break that ring when it starts; the daemon goes on.
func TestRingOutsideMemory(t *testing.T) {
	const mem = 16 << 20
	for _, tc := range []struct {
		name              string
		desc, avail, used uint64
	}{
		{"descriptor table outside", mem + 4096, 8192, 12288},
		{"used ring straddles the end", 4096, 8192, mem - 64},
		{"available ring at an address that overflows", 4096, ^uint64(0) - 8, 12288},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hygiene(t)
			d, socks := startDaemon(t, 2)
			f := dial(t, socks[0], frontend.Config{MemorySize: mem, QueueSize: 64})
			feat := f.DeviceFeatures
			steps := []struct {
				req vu.Request
				p   []byte
			}{
				{vu.SetFeatures, vu.EncodeU64(feat)},
				{vu.SetVringNum, vu.VringState{Index: 0, Num: 64}.Encode()},
				{vu.SetVringBase, vu.VringState{Index: 0, Num: 0}.Encode()},
				{vu.SetVringAddr, vu.VringAddr{Index: 0, Desc: tc.desc + frontend.UserBase,
					Avail: tc.avail + frontend.UserBase, Used: tc.used + frontend.UserBase}.Encode()},
			}
			if err := f.SetMemTable(); err != nil {
				t.Fatal(err)
			}
			for _, s := range steps {
				if err := f.Send(s.req, s.p, nil); err != nil {
					t.Fatalf("%s: %v", s.req, err)
				}
			}
			kick, err := eventfd.New()
			if err != nil {
				t.Fatal(err)
			}
			defer kick.Close()
			if err := f.SetVringFile(vu.SetVringKick, 0, kick); err != nil {
				t.Fatal(err)
			}
			waitRingError(t, d, "dev0", f.Queue(0))
			bystanderOK(t, socks[1])
		})
	}
}

// TestKeyOfAnotherDevice: an rkey valid on a third device is no key on
// the peer: REM_ACCESS_ERR, and the data of the third device is untouched.
func TestKeyOfAnotherDevice(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 3)
	a, b, c := openPeer(t, socks[0], 0), openPeer(t, socks[1], 0), openPeer(t, socks[2], 0)
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	for i := range c.buf.Bytes[:4096] {
		c.buf.Bytes[i] = 0x5a
	}
	if err := a.qp.PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{a.mr.SGE(0, 4096)}, RemoteAddr: c.mr.Addr, RKey: c.mr.RKey}); err != nil {
		t.Fatal(err)
	}
	wc := pollOne(t, a.cq)
	if wc.Status != abi.WCRemAccessErr && wc.Status != abi.WCRemInvReqErr {
		t.Fatalf("write with another device's rkey: status %d, want REM_ACCESS_ERR (10)", wc.Status)
	}
	for i, v := range c.buf.Bytes[:4096] {
		if v != 0x5a {
			t.Fatalf("third device's byte %d changed to %#x", i, v)
		}
	}
}
