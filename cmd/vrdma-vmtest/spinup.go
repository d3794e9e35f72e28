package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// spinupResult is what spinup prints with --json (the benchmark generator
// reads it): mean seconds from `vrdmactl device add` to the device probed
// in the guest, and from `vrdmactl vm detach` to `vrdmactl device rm`
// done (QEMU sent DEVICE_DELETED, the daemon released everything).
type spinupResult struct {
	AttachS       float64   `json:"attach_s"`
	DetachS       float64   `json:"detach_s"`
	Rounds        int       `json:"rounds"`
	AttachRoundsS []float64 `json:"attach_rounds_s"`
	DetachRoundsS []float64 `json:"detach_rounds_s"`
}

type spinupFlags struct {
	rounds int
	json   bool
}

func parseSpinup(args []string, stderr io.Writer) (spinupFlags, error) {
	var sf spinupFlags
	fs := flag.NewFlagSet("vrdma-vmtest spinup", flag.ContinueOnError)
	fs.IntVar(&sf.rounds, "rounds", 3, "attach/detach rounds (1..100)")
	fs.BoolVar(&sf.json, "json", false, "print only a JSON object {attach_s, detach_s, rounds, ...} on stdout")
	if err := parseScenario(fs, args, "usage: vrdma-vmtest [flags] spinup [--rounds N] [--json]\n\nflags:\n", stderr); err != nil {
		return sf, err
	}
	if fs.NArg() > 0 || sf.rounds < 1 || sf.rounds > 100 {
		fmt.Fprintf(stderr, "vrdma-vmtest: spinup [--rounds 1..100] [--json], got %q\n", args)
		return sf, errUsage
	}
	return sf, nil
}

// runSpinup boots one VM with no vrdma device, free root ports and an
// operator QMP socket, then per round: vrdmactl device add and vm attach,
// the guest rescans, probes and runs the selftest; vrdmactl vm detach and
// device rm; the daemon must be left with no device.
func runSpinup(ctx context.Context, o options, sf spinupFlags, stdout, stderr io.Writer) error {
	info := stdout
	if sf.json {
		info = stderr
	}
	if _, err := os.Stat(o.vrdmactl); err != nil {
		return fmt.Errorf("vrdmactl: %w (make build)", err)
	}
	d, err := startDaemon(ctx, o)
	if err != nil {
		return err
	}
	defer stopDaemon(d, o.verbose, stderr)
	qmpSock := filepath.Join(d.Dir(), "qmp.sock")
	cfg := guestvm.Config{
		Name: "spinup", QEMU: o.qemuBin, Kernel: o.kernel, Initrd: o.initrd,
		MemoryMiB: o.memory, HugePages: o.hugepages,
		Run: "hotplug", Args: []string{"--rounds", strconv.Itoa(sf.rounds), "--ack"},
		ExtraQEMUArgs: []string{
			"-device", "pcie-root-port,id=vrdma-rp0,bus=pcie.0,chassis=1",
			"-chardev", "socket,id=opqmp,path=" + qmpSock + ",server=on,wait=off",
			"-mon", "chardev=opqmp,mode=control",
		},
	}
	fmt.Fprintf(info, "vrdma-vmtest: booting one VM (%d MiB, TCG) with a free root port for %d hot-plug rounds\n", o.memory, sf.rounds)
	g, err := guestvm.Boot(ctx, cfg)
	if err != nil {
		return err
	}
	res, err := spinupRounds(ctx, o, d, g, qmpSock, sf.rounds, info)
	if err == nil {
		_, err = g.WaitResult(ctx)
	}
	if err != nil || o.verbose {
		fmt.Fprint(stderr, g.Log())
	}
	if cerr := g.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if sf.json {
		return json.NewEncoder(stdout).Encode(res) // one line
	}
	fmt.Fprintf(stdout, "vrdma-vmtest: spin-up over %d rounds: attach (device add to probed in guest) %.3f s, detach (vm detach to device rm done) %.3f s\n",
		res.Rounds, res.AttachS, res.DetachS)
	return nil
}

func spinupRounds(ctx context.Context, o options, d *vrdmadproc.Proc, g *guestvm.Guest, qmpSock string, rounds int, info io.Writer) (spinupResult, error) {
	res := spinupResult{Rounds: rounds}
	lines := g.Lines()
	next := func(want string, round int) error {
		for {
			select {
			case s, ok := <-lines:
				if !ok {
					return fmt.Errorf("guest console closed while waiting for %s of round %d", want, round)
				}
				kind, payload := guestvm.Classify(s)
				if kind == guestvm.KindError {
					return fmt.Errorf("guest: %s", payload)
				}
				if kind != guestvm.KindResult {
					continue
				}
				ok, err := guestresult.DecodeStep(payload, guestresult.RoleHotplug, want, round, nil)
				if err != nil {
					return fmt.Errorf("guest: %w", err)
				}
				if ok {
					return nil
				}
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s of round %d: %w", want, round, ctx.Err())
			}
		}
	}
	ctl := func(args ...string) error {
		cmd := exec.CommandContext(ctx, o.vrdmactl, append([]string{"--control", d.Control()}, args...)...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("vrdmactl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
		}
		return nil
	}
	var sumA, sumD float64
	for r := 1; r <= rounds; r++ {
		if err := next("waiting", r); err != nil {
			return res, err
		}
		start := time.Now()
		if err := ctl("device", "add", "spin0", "--socket", filepath.Join(d.Dir(), "spin0.sock")); err != nil {
			return res, err
		}
		if err := ctl("vm", "attach", "--qmp", qmpSock, "--device", "spin0"); err != nil {
			return res, err
		}
		if err := next("usable", r); err != nil {
			return res, err
		}
		a := time.Since(start).Seconds()
		if err := next("attached", r); err != nil {
			return res, err
		}
		start = time.Now()
		if err := ctl("vm", "detach", "--qmp", qmpSock, "--device", "spin0"); err != nil {
			return res, err
		}
		if err := ctl("device", "rm", "spin0"); err != nil {
			return res, err
		}
		dt := time.Since(start).Seconds()
		if err := next("detached", r); err != nil {
			return res, err
		}
		devs, err := d.Devices()
		if err != nil {
			return res, err
		}
		if len(devs) != 0 {
			return res, errors.New("the daemon still has a device after device rm")
		}
		if err := g.WriteLine("VRDMA-NEXT"); err != nil {
			return res, err
		}
		fmt.Fprintf(info, "vrdma-vmtest: round %d: attach %.3f s, detach %.3f s\n", r, a, dt)
		res.AttachRoundsS = append(res.AttachRoundsS, a)
		res.DetachRoundsS = append(res.DetachRoundsS, dt)
		sumA += a
		sumD += dt
	}
	res.AttachS, res.DetachS = sumA/float64(rounds), sumD/float64(rounds)
	return res, nil
}
