package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// migrate --across: the migrant's guest moves to a QEMU served by a second
// vrdmad in another network namespace, the peer staying on the first.
//
// Two namespaces joined by a veth, each with a vrdmad (--roce-bind its
// host address). On A the devices "peer" and "migrant" send from
// addresses of their own (roce_bind 10.200.96.11 and .12, on A's veth):
// the stream's RC QPs connect from GID index 1 and cross RoCEv2 between
// those addresses (through A's kernel while both are on A). The
// migration's destination is "migrant-dst" on B: incoming, the migrant's
// UUID and address (bound before the address is there: IP_FREEBIND). At
// the switch-over vrdmad A holds the migrant's network QP (frozen with
// its VM), the state carries it, and B restores it frozen until the VM
// runs there. Once QEMU reports the migration completed, the address
// moves from A's namespace to B's, as a cloud's network moves a VM's
// address with it; the peer's retransmissions reach B and the stream
// goes on. The guests connect with an ACK timeout of 2^18 × 4.096 µs (1 s,
// 7 retries): the blackout is the switch-over and the address move.
var (
	acrossHostA = netip.MustParseAddr("10.200.96.1")
	acrossHostB = netip.MustParseAddr("10.200.96.2")
	acrossPeer  = netip.MustParseAddr("10.200.96.11")
	acrossMig   = netip.MustParseAddr("10.200.96.12")
)

// acrossAckTimeout is the guests' ACK timeout code with --across.
const acrossAckTimeout = "18"

func runMigrateAcross(ctx context.Context, o options, mf migrateFlags, stdout, stderr io.Writer) error {
	if err := netlab.Available(); err != nil {
		return fmt.Errorf("migrate --across: %w", err)
	}
	lab, err := netlab.New(netlab.Config{})
	if err != nil {
		return err
	}
	defer lab.Close()
	nsA, nsB, err := lab.VethHosts("mga", "mgb",
		[]netip.Prefix{netip.PrefixFrom(acrossHostA, 24), netip.PrefixFrom(acrossPeer, 32), netip.PrefixFrom(acrossMig, 32)},
		[]netip.Prefix{netip.PrefixFrom(acrossHostB, 24)})
	if err != nil {
		return fmt.Errorf("migrate --across: network: %w", err)
	}
	start := func(ns *netlab.NS, addr netip.Addr) (*vrdmadproc.Proc, error) {
		return vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: o.vrdmad, NetNS: ns.Name,
			Args: []string{"--roce-bind", addr.String()}, StateDir: vrdmadproc.NoState})
	}
	da, err := start(nsA, acrossHostA)
	if err != nil {
		return err
	}
	defer stopDaemon(da, o.verbose, stderr)
	db, err := start(nsB, acrossHostB)
	if err != nil {
		return err
	}
	defer stopDaemon(db, o.verbose, stderr)
	sock := func(d *vrdmadproc.Proc, id string) string { return filepath.Join(d.Dir(), id+".sock") }
	if _, err := da.AddDevice(ctx, controlapi.AddRequest{ID: "peer", Socket: sock(da, "peer"),
		RoCEBind: []string{acrossPeer.String()}}); err != nil {
		return err
	}
	mig, err := da.AddDevice(ctx, controlapi.AddRequest{ID: "migrant", Socket: sock(da, "migrant"),
		RoCEBind: []string{acrossMig.String()}})
	if err != nil {
		return err
	}
	args := append(mf.args(), "--gid-index", "1", "--ack-timeout", acrossAckTimeout)
	guest := func(id, run string) guestvm.Config {
		return guestvm.Config{Name: id, QEMU: o.qemuBin, Kernel: o.kernel, Initrd: o.initrd,
			MemoryMiB: o.memory, HugePages: o.hugepages, Run: run, Args: args,
			Devices: []qemu.VhostUserDevice{device(id, sock(da, id))}}
	}
	fmt.Fprintf(stdout, "vrdma-vmtest: vrdmad A (%v: peer %v, migrant %v) and vrdmad B (%v) in two network namespaces\n",
		acrossHostA, acrossPeer, acrossMig, acrossHostB)
	return migrateScenario(ctx, o, mf, guest("migrant", "server"), guest("peer", "client"), func(g *guestvm.Guest) (guestvm.MigrationResult, error) {
		dst := sock(db, "migrant-dst")
		if _, err := db.AddDevice(ctx, controlapi.AddRequest{ID: "migrant-dst", Socket: dst, UUID: mig.UUID,
			Incoming: true, RoCEBind: []string{acrossMig.String()}}); err != nil {
			return guestvm.MigrationResult{}, err
		}
		res, err := migrateGuest(ctx, g, dst, mf, stdout)
		if err != nil || res.Info.Status != qemu.MigrationCompleted {
			return res, err // the address stays: the migrant runs on A
		}
		t0 := time.Now()
		if err := nsB.AddAddr("vb", netip.PrefixFrom(acrossMig, 32)); err != nil {
			return res, fmt.Errorf("move %v to B: %w", acrossMig, err)
		}
		if out, err := nsA.IP("addr", "del", netip.PrefixFrom(acrossMig, 32).String(), "dev", "va"); err != nil {
			return res, fmt.Errorf("move %v from A: %w: %s", acrossMig, err, out)
		}
		fmt.Fprintf(stdout, "vrdma-vmtest: the migrant's address %v moved to vrdmad B's namespace in %.1f ms\n",
			acrossMig, float64(time.Since(t0))/float64(time.Millisecond))
		return res, nil
	}, stdout, stderr)
}
