package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vrdma/vrdma/internal/stacklab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	abi "github.com/vrdma/vrdma/virtio/rdma"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// rxe guests' addresses on their private dgram link.
const (
	rxeServerIP = "10.77.0.1"
	rxeClientIP = "10.77.0.2"
	rxeGID      = 1
)

// freeUDPPorts returns two distinct free UDP ports on 127.0.0.1.
func freeUDPPorts() (int, int, error) {
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

// dgramNIC is the QEMU arguments of a virtio-net NIC on a UDP socket pair
// on the loopback interface.
func dgramNIC(local, remote int, mac string) []string {
	return []string{
		"-netdev", fmt.Sprintf("dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port=%d,remote.type=inet,remote.host=127.0.0.1,remote.port=%d", local, remote),
		"-device", "virtio-net-pci,netdev=n0,romfile=,mac=" + mac,
	}
}

// rxeConfig is one rxe guest.
func rxeConfig(o options, name, role, ip, peer string, jobs []string, runs int, nic []string) guestvm.Config {
	app := fmt.Sprintf("rxe.role=%s rxe.ip=%s rxe.runs=%d rxe.gid=%d", role, ip, runs, rxeGID)
	if peer != "" {
		app += " rxe.peer=" + peer
	}
	return guestvm.Config{
		Name: name, QEMU: o.qemuBin, Kernel: o.rxeKernel, Initrd: o.rxeInitrd,
		MemoryMiB: o.memory, SMP: 1, HugePages: 1, Run: "perftest", Args: jobs,
		Append: app, ExtraQEMUArgs: nic,
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

// runRxe boots the soft-RoCE pair once and runs every workload runs times.
// It returns the client's results and both consoles.
func runRxe(ctx context.Context, o options, ws []Workload, runs int) ([]guestvm.Result, string, error) {
	p1, p2, err := freeUDPPorts()
	if err != nil {
		return nil, "", err
	}
	jobs := make([]string, len(ws))
	for i, w := range ws {
		jobs[i] = w.PerftestJob()
	}
	scfg := rxeConfig(o, "rxe-server", "server", rxeServerIP, "", jobs, runs, dgramNIC(p1, p2, "52:54:00:77:00:01"))
	ccfg := rxeConfig(o, "rxe-client", "client", rxeClientIP, rxeServerIP, jobs, runs, dgramNIC(p2, p1, "52:54:00:77:00:02"))
	srv, err := guestvm.Boot(ctx, scfg)
	if err != nil {
		return nil, "", fmt.Errorf("boot rxe server: %w", err)
	}
	defer srv.Close()
	// perftest's server prints this just before it listens; the client
	// also retries a refused connection (guest/perftest-jobs).
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	err = waitLine(wctx, srv, "Waiting for client")
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

// stackDevice is the vrdma device in a stack guest.
const stackDevice = "vrdma0"

// perftestJobsCommand is a stack guest's command: guest/perftest-jobs with
// ws, runs times, over vrdma0 and the RoCE v2 GID of eth0's IPv4 address
// (-x auto); peer is the server's address for the client, "" for the
// server.
func perftestJobsCommand(role string, ws []Workload, runs int, peer string) string {
	jobs := make([]string, len(ws))
	for i, w := range ws {
		jobs[i] = w.PerftestJob()
	}
	cmd := "perftest-jobs -d " + stackDevice + " -t " + VrdmaPerftest.Transport() + " -x auto -r " + strconv.Itoa(runs) +
		" " + role + " " + strings.Join(jobs, ",")
	if peer != "" {
		cmd += " " + peer
	}
	return cmd
}

// runStack boots two stack guests (the vrdma kernel driver and provider)
// on one vrdmad once and runs every workload runs times with perftest. It
// returns the client's results, both guests' logs (and vrdmad's, when it
// failed), and how many kernel warnings the guests reported (the e2e tests
// judge those; the figures stand).
func runStack(ctx context.Context, o options, ws []Workload, runs int) ([]guestvm.Result, string, int, error) {
	lab, err := stacklab.New(ctx, stacklab.Config{
		Names:  []string{guestvm.RoleServer, guestvm.RoleClient},
		VRDMAD: o.vrdmad, QEMU: o.qemuBin, Kernel: o.stackKernel, Initrd: o.stackInitrd,
		MemoryMiB: o.memory, SMP: 1,
	})
	if err != nil {
		return nil, "", 0, fmt.Errorf("stack pair: %w", err)
	}
	cfg := guestvm.StackPairConfig{Server: lab.Configs[0], Client: lab.Configs[1]}
	cfg.Server.Command = perftestJobsCommand(guestvm.RoleServer, ws, runs, "")
	cfg.Client.Command = perftestJobsCommand(guestvm.RoleClient, ws, runs, lab.Guests[0].IP.Addr().String())
	p, err := guestvm.StartStackPair(ctx, cfg)
	if err != nil {
		return nil, "", 0, errors.Join(fmt.Errorf("boot the stack pair: %w", err), lab.Close())
	}
	var (
		mu      sync.Mutex
		results []guestvm.Result
		errs    []string
	)
	res, err := p.Run(ctx, func(role string, l guestvm.StackLine) {
		if !l.Command {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch k, payload := guestvm.Classify(l.Text); k {
		case guestvm.KindError:
			errs = append(errs, role+": "+payload)
		case guestvm.KindResult:
			if role != guestvm.RoleClient {
				return
			}
			r, perr := guestvm.ParseResult(payload)
			if perr != nil {
				errs = append(errs, fmt.Sprintf("client: unparsable VRDMA-RESULT %q: %v", payload, perr))
				return
			}
			results = append(results, r)
		}
	})
	p.Close()
	log := p.Log()
	// Close's error holds vrdmad's log; the guests' results decide.
	if cerr := lab.Close(); cerr != nil {
		log += fmt.Sprintf("=== vrdmad ===\n%v\n", cerr)
	}
	warnings := len(res.Server.KernelWarnings) + len(res.Client.KernelWarnings)
	mu.Lock()
	defer mu.Unlock()
	if err != nil {
		return results, log, warnings, fmt.Errorf("stack pair: %w", err)
	}
	if code := res.ExitCode(); code != 0 || len(errs) > 0 {
		return results, log, warnings, fmt.Errorf("stack pair: exit %d: %s", code, strings.Join(errs, "; "))
	}
	return results, log, warnings, nil
}

// runVrdma runs one workload once between two vrdma guests on one vrdmad.
func runVrdma(ctx context.Context, o options, w Workload) ([]guestvm.Result, string, error) {
	d, err := vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: o.vrdmad, Devices: []string{"server", "client"}})
	if err != nil {
		return nil, "", err
	}
	// Stop's error is not reported: the guests' verified results decide.
	defer d.Stop()
	cfg := func(name string) guestvm.Config {
		return guestvm.Config{
			Name: name, QEMU: o.qemuBin, Kernel: o.kernel, Initrd: o.initrd,
			MemoryMiB: o.memory, SMP: 1, Run: name, Args: w.VrdmaArgs(),
			Devices: []qemu.VhostUserDevice{{ID: name, Socket: d.Socket(name), VirtioID: abi.DeviceID,
				NumVQs: abi.FirstDoorbellQueue + 1, VQSize: 256, ConfigSize: abi.ConfigSize}},
		}
	}
	p, err := guestvm.StartPair(ctx, cfg("server"), cfg("client"))
	if err != nil {
		return nil, daemonLog(d), err
	}
	res, err := p.Wait(ctx)
	log := p.Log()
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, log + daemonLog(d), err
	}
	if len(res.Server) == 0 {
		return nil, log, errors.New("vrdma server printed no result")
	}
	for _, r := range res.Server {
		if !r.Verified {
			return nil, log, fmt.Errorf("vrdma server: data not verified: %s", r.Raw)
		}
	}
	return res.Client, log, nil
}

// daemonLog is vrdmad's log under a header, for the log file.
func daemonLog(d *vrdmadproc.Proc) string {
	return "=== vrdmad log ===\n" + d.Log()
}
