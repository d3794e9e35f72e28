package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/internal/rxepair"
	"github.com/vrdma/vrdma/internal/stacklab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// rxeGID is the RoCE v2 GID index perftest uses over rxe: eth0's IPv4
// address (internal/rxepair).
const rxeGID = rxepair.GIDIPv4

// runRxe boots the soft-RoCE pair once and runs every workload runs times.
// It returns the client's results and both consoles.
func runRxe(ctx context.Context, o options, ws []Workload, runs int) ([]guestresult.Result, string, error) {
	jobs := make([]string, len(ws))
	for i, w := range ws {
		jobs[i] = w.PerftestJob()
	}
	return rxepair.Run(ctx, rxepair.Config{
		QEMU: o.qemuBin, Kernel: o.rxeKernel, Initrd: o.rxeInitrd, MemoryMiB: o.memory,
		Jobs: jobs, Runs: runs, GID: rxeGID,
	})
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
func runStack(ctx context.Context, o options, ws []Workload, runs int) ([]guestresult.Result, string, int, error) {
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
		results []guestresult.Result
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
			r, perr := guestresult.Parse(payload)
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
func runVrdma(ctx context.Context, o options, w Workload) ([]guestresult.Result, string, error) {
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
