package tests

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// TestMigrateAcrossDaemons: a live migration to another vrdmad (issue 29,
// docs/operations.md "Live-migrating a VM with its vrdma device"), with Go
// front-ends doing what QEMU does. Two vrdmads in two network namespaces
// joined by a veth; on A the devices "peer" and "migrant", each sending
// from an address of its own (roce_bind), their RC QPs connected over
// RoCEv2 between those addresses. The migrant's QEMU turns dirty logging
// on and stops the VM: vrdmad holds the migrant's network QP (its
// transport frozen), and the peer's WRITE into it is not taken. The state
// is saved; on B a device added incoming with the migrant's UUID and
// address (not on B yet: bound with IP_FREEBIND) loads it on a copy of
// the memory; the address moves from A's namespace to B's and the
// destination's rings start. The peer's held WRITE lands in the
// destination's memory, not the source's; the peer READs back through the
// destination; the source QEMU quits without disturbing the peer, and
// the peer's QP never leaves RTS nor sees an event.
func TestMigrateAcrossDaemons(t *testing.T) {
	vrdmad := needBinary(t, "vrdmad")
	lab := netlab.NewT(t)
	hostA, hostB := netip.MustParseAddr("10.200.95.1"), netip.MustParseAddr("10.200.95.2")
	peerAddr, migAddr := netip.MustParseAddr("10.200.95.11"), netip.MustParseAddr("10.200.95.12")
	nsA, nsB := vethHosts(t, lab, "ma", "mb",
		[]netip.Prefix{netip.PrefixFrom(hostA, 24), netip.PrefixFrom(peerAddr, 32), netip.PrefixFrom(migAddr, 32)},
		[]netip.Prefix{netip.PrefixFrom(hostB, 24)})
	pa := startVrdmadIn(t, vrdmad, nsA, nil, "--roce-bind", hostA.String())
	pb := startVrdmadIn(t, vrdmad, nsB, nil, "--roce-bind", hostB.String())
	u := uuid.New()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	add := func(p *vrdmadproc.Proc, req controlapi.AddRequest) string {
		t.Helper()
		req.Socket = p.Dir() + "/" + req.ID + ".sock"
		if _, err := p.AddDevice(ctx, req); err != nil {
			t.Fatal(err)
		}
		return req.Socket
	}
	peerSock := add(pa, controlapi.AddRequest{ID: "peer", RoCEBind: []string{peerAddr.String()}})
	migSock := add(pa, controlapi.AddRequest{ID: "migrant", UUID: u.String(), RoCEBind: []string{migAddr.String()}})
	p, m := openPeer(t, peerSock, 0), openPeer(t, migSock, 0)
	gp, err := p.ctx.QueryGIDAt(1)
	if err != nil {
		t.Fatal(err)
	}
	gm, err := m.ctx.QueryGIDAt(1)
	if err != nil {
		t.Fatal(err)
	}
	if netip.AddrFrom16(gp).Unmap() != peerAddr || netip.AddrFrom16(gm).Unmap() != migAddr {
		t.Fatalf("GID index 1: %x and %x, want the devices' addresses %v and %v", gp, gm, peerAddr, migAddr)
	}
	// A timeout of 2^18 × 4.096 µs (1.07 s), 7 retries: the QPs ride
	// out the migration's blackout, as a tenant's must (the default's
	// 67 ms × 7 is shorter than a switch-over and an address move).
	opts := verbs.ConnectOpts{SGIDIndex: 1, Timeout: 18} // MTU 4096, lowered to the link's
	if err := p.qp.ConnectRCOpts(gm, m.qp.Num(), m.qp.PSN(), abi.AccessAll, opts); err != nil {
		t.Fatal(err)
	}
	if err := m.qp.ConnectRCOpts(gp, p.qp.Num(), p.qp.PSN(), abi.AccessAll, opts); err != nil {
		t.Fatal(err)
	}
	post := func(from, to *peer, id uint64, op int, off int, fill byte) {
		t.Helper()
		if fill != 0 {
			copy(from.mr.Bytes()[off:off+64], bytes.Repeat([]byte{fill}, 64))
		}
		if err := from.qp.PostSend(verbs.SendWR{WRID: id, Opcode: op, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{from.mr.SGE(off, 64)}, RemoteAddr: to.mr.Addr + uint64(off), RKey: to.mr.RKey}); err != nil {
			t.Fatal(err)
		}
	}
	done := func(who *peer, id uint64) {
		t.Helper()
		wc, err := pollWC(who.cq, 20*time.Second)
		if err != nil || wc.WRID != id || wc.Status != abi.WCSuccess {
			t.Fatalf("completion of wr %d: %+v, %v", id, wc, err)
		}
	}
	// Both ways over RoCEv2 before.
	post(p, m, 1, abi.WROpRDMAWrite, 0, 0x11)
	done(p, 1)
	post(m, p, 2, abi.WROpRDMAWrite, 64, 0x22)
	done(m, 2)

	// The source QEMU: dirty logging on, the VM stops. The peer's WRITE
	// into the migrant is held off (its retransmissions dropped).
	if _, err := m.f.StartDirtyLog(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.f.Stop(); err != nil {
		t.Fatal(err)
	}
	const off = 4096
	post(p, m, 3, abi.WROpRDMAWrite, off, 0x33)
	time.Sleep(100 * time.Millisecond)
	gpa := m.buf.Addr + off
	if !bytes.Equal(m.f.Memory()[gpa:gpa+64], make([]byte, 64)) {
		t.Fatal("the peer's WRITE landed in the stopped source's memory")
	}
	saved, err := m.f.SaveDeviceState()
	if err != nil {
		t.Fatalf("save: %v", err)
	}

	// The destination: vrdmad B gets the migrant's UUID and address,
	// incoming; a QEMU with a copy of the guest memory loads the state.
	dstSock := add(pb, controlapi.AddRequest{ID: "migrant-dst", UUID: u.String(), Incoming: true,
		RoCEBind: []string{migAddr.String()}})
	dst, err := frontend.Dial(ctx, frontend.Config{Socket: dstSock, MemorySize: uint64(len(m.f.Memory()))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dst.Close() })
	copy(dst.Memory(), m.f.Memory())
	if err := dst.SetMemTable(); err != nil {
		t.Fatal(err)
	}
	if err := dst.LoadDeviceState(saved); err != nil {
		t.Fatalf("load: %v", err)
	}
	// The address moves with the VM, then the VM runs there.
	if out, err := nsA.IP("addr", "del", netip.PrefixFrom(migAddr, 32).String(), "dev", "va"); err != nil {
		t.Fatalf("ip addr del: %v: %s", err, out)
	}
	if err := nsB.AddAddr("vb", netip.PrefixFrom(migAddr, 32)); err != nil {
		t.Fatal(err)
	}
	if err := dst.Start(abi.EventQueue); err != nil {
		t.Fatal(err)
	}
	done(p, 3)
	if !bytes.Equal(dst.Memory()[gpa:gpa+64], bytes.Repeat([]byte{0x33}, 64)) {
		t.Fatal("the held WRITE is not in the destination's memory")
	}
	if !bytes.Equal(m.f.Memory()[gpa:gpa+64], make([]byte, 64)) {
		t.Fatal("the held WRITE landed in the source's memory")
	}

	// The source QEMU quits; the peer goes on with the destination: a
	// WRITE, then a READ of what the migrant's memory holds.
	m.ctx.Close()
	m.f.Close()
	post(p, m, 4, abi.WROpRDMAWrite, off+64, 0x44)
	done(p, 4)
	post(p, m, 5, abi.WROpRDMARead, 64, 0)
	done(p, 5)
	if !bytes.Equal(p.mr.Bytes()[64:128], bytes.Repeat([]byte{0x22}, 64)) {
		t.Fatal("the peer READ other bytes than the migrant's memory holds")
	}
	if !bytes.Equal(dst.Memory()[gpa+64:gpa+128], bytes.Repeat([]byte{0x44}, 64)) {
		t.Fatal("the WRITE after the source quit is not in the destination's memory")
	}
	attr, err := p.qp.Query()
	if err != nil || attr.QPState != abi.QPSRTS {
		t.Fatalf("the peer's QP: %+v %v, want RTS", attr, err)
	}
	noAsyncEvent(t, "peer", p)
	devs, err := pb.Devices()
	if err != nil || len(devs) != 1 || devs[0].Migration != controlapi.MigrationIn {
		t.Fatalf("vrdmad B's devices: %+v %v, want migrant-dst migrated in", devs, err)
	}
}
