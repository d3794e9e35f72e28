// Package rxepair boots two soft-RoCE guests (bin/rxe from
// scripts/rxe-image.sh: Debian's generic kernel with rdma_rxe, perftest,
// guest/rxe-init and guest/perftest-jobs) joined by one virtio-net link,
// QEMU's -netdev dgram over two UDP ports on 127.0.0.1, and runs a list of
// perftest jobs between them: the server guest runs each job's perftest
// server, the client its client.
//
// cmd/vrdma-compare measures rxe with it; tests/rxe_capture_test.go
// captures the RoCE v2 packets on the link (QEMU's filter-dump on NetdevID).
package rxepair

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// The guests' addresses and MACs on their private link.
const (
	ServerIP  = "10.77.0.1"
	ClientIP  = "10.77.0.2"
	ServerMAC = "52:54:00:77:00:01"
	ClientMAC = "52:54:00:77:00:02"
	// NetdevID is the id of each guest's -netdev (for a filter-dump's
	// netdev=).
	NetdevID = "n0"
)

// GID indexes of rxe0's port 1, as the Debian 6.1 kernel fills the table
// when guest/rxe-init adds rxe0 on eth0 (which already has its IPv4
// address): both are RoCE v2.
const (
	// GIDIPv6 is eth0's IPv6 link-local address (fe80::, from the MAC):
	// perftest's packets are then IPv6.
	GIDIPv6 = 0
	// GIDIPv4 is eth0's IPv4 address (::ffff:10.77.0.x): IPv4 packets.
	GIDIPv4 = 1
)

// ServerListenTimeout bounds the wait for the server guest to boot and
// listen for its first client.
const ServerListenTimeout = 3 * time.Minute

// Config is one pair.
type Config struct {
	// QEMU, Kernel and Initrd are the binary and the rxe image
	// (bin/rxe/vmlinux, bin/rxe/initramfs.img).
	QEMU, Kernel, Initrd string
	// MemoryMiB is each guest's RAM; zero means guestvm.DefaultMemoryMiB.
	MemoryMiB int
	// Jobs are guest/perftest-jobs' jobs, OP:SIZE:ITERS.
	Jobs []string
	// Runs is how many times the whole job list runs; zero means one.
	Runs int
	// GID is perftest's GID index (-x, rxe-init's rxe.gid): GIDIPv4 or
	// GIDIPv6.
	GID int
	// ServerQEMUArgs and ClientQEMUArgs are appended to each guest's QEMU
	// command line, e.g. "-object", "filter-dump,id=d0,netdev="+NetdevID+",file=...".
	ServerQEMUArgs, ClientQEMUArgs []string
}

// FreeUDPPorts returns two distinct free UDP ports on 127.0.0.1.
func FreeUDPPorts() (int, int, error) {
	var ports [2]int
	var conns []net.PacketConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range ports {
		c, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			return 0, 0, fmt.Errorf("pick a udp port: %w", err)
		}
		conns = append(conns, c)
		ports[i] = c.LocalAddr().(*net.UDPAddr).Port
	}
	return ports[0], ports[1], nil
}

// DgramNIC is the QEMU arguments of a virtio-net NIC (netdev NetdevID) on
// a UDP socket pair on the loopback interface.
func DgramNIC(local, remote int, mac string) []string {
	return []string{
		"-netdev", fmt.Sprintf("dgram,id=%s,local.type=inet,local.host=127.0.0.1,local.port=%d,remote.type=inet,remote.host=127.0.0.1,remote.port=%d", NetdevID, local, remote),
		"-device", "virtio-net-pci,netdev=" + NetdevID + ",romfile=,mac=" + mac,
	}
}

// guestConfig is one rxe guest.
func guestConfig(c Config, name, role, ip, peer string, qemuArgs []string) guestvm.Config {
	runs := c.Runs
	if runs == 0 {
		runs = 1
	}
	app := fmt.Sprintf("rxe.role=%s rxe.ip=%s rxe.runs=%d rxe.gid=%d", role, ip, runs, c.GID)
	if peer != "" {
		app += " rxe.peer=" + peer
	}
	return guestvm.Config{
		Name: name, QEMU: c.QEMU, Kernel: c.Kernel, Initrd: c.Initrd,
		MemoryMiB: c.MemoryMiB, SMP: 1, HugePages: 1, Run: "perftest", Args: c.Jobs,
		Append: app, ExtraQEMUArgs: qemuArgs,
	}
}

// waitLine waits until g prints a line containing one of subs, g stops
// (VRDMA-ERROR, VRDMA-EXIT, console closed) or ctx ends.
func waitLine(ctx context.Context, g *guestvm.Guest, subs ...string) error {
	lines := g.Lines()
	for {
		var line string
		var ok bool
		select {
		case <-ctx.Done():
			return fmt.Errorf("guest %s: wait for the server to listen: %w", g.Name(), ctx.Err())
		case line, ok = <-lines:
		}
		if !ok {
			return fmt.Errorf("guest %s: console closed before the server listened", g.Name())
		}
		for _, s := range subs {
			if strings.Contains(line, s) {
				return nil
			}
		}
		if k, _ := guestvm.Classify(line); k == guestvm.KindError || k == guestvm.KindExit {
			return fmt.Errorf("guest %s: %q before the server listened", g.Name(), line)
		}
	}
}

// Run boots the pair, runs the job list c.Runs times and stops both
// guests. It returns the client's results and both consoles (server
// first), also on error. ctx bounds everything; the server must listen
// within ServerListenTimeout.
func Run(ctx context.Context, c Config) ([]guestresult.Result, string, error) {
	if len(c.Jobs) == 0 {
		return nil, "", errors.New("rxepair: no jobs")
	}
	p1, p2, err := FreeUDPPorts()
	if err != nil {
		return nil, "", err
	}
	sargs := append(DgramNIC(p1, p2, ServerMAC), c.ServerQEMUArgs...)
	cargs := append(DgramNIC(p2, p1, ClientMAC), c.ClientQEMUArgs...)
	scfg := guestConfig(c, "rxe-server", "server", ServerIP, "", sargs)
	ccfg := guestConfig(c, "rxe-client", "client", ClientIP, ServerIP, cargs)
	srv, err := guestvm.Boot(ctx, scfg)
	if err != nil {
		return nil, "", fmt.Errorf("boot rxe server: %w", err)
	}
	defer srv.Close()
	// perftest's server prints "Waiting for client" just before it
	// listens; ucx_perftest's server says nothing, so for a UCX job the
	// job runner's announcement of the server's first job counts (it
	// starts listening within a moment). The client retries a refused
	// connection anyway (guest/perftest-jobs).
	wctx, cancel := context.WithTimeout(ctx, ServerListenTimeout)
	err = waitLine(wctx, srv, "Waiting for client", `PERFTEST-JOB {"role":"server"`)
	cancel()
	if err != nil {
		return nil, srv.Log(), err
	}
	cli, err := guestvm.Boot(ctx, ccfg)
	if err != nil {
		return nil, srv.Log(), fmt.Errorf("boot rxe client: %w", err)
	}
	defer cli.Close()
	var wg sync.WaitGroup
	var serr error
	wg.Add(1)
	go func() { defer wg.Done(); _, serr = srv.WaitResult(ctx) }()
	res, cerr := cli.WaitResult(ctx)
	if cerr != nil {
		srv.Kill()
	}
	wg.Wait()
	log := srv.Log() + cli.Log()
	if cerr != nil {
		return res, log, fmt.Errorf("rxe client: %w", cerr)
	}
	if serr != nil {
		return res, log, fmt.Errorf("rxe server: %w", serr)
	}
	return res, log, nil
}
