// Command vrdma-vmtest runs vrdma between real guests: it starts vrdmad with
// one device per VM, boots QEMU VMs from the guest image
// (scripts/guest-image.sh) with vmm/guestvm, runs vrdma-guest inside, prints
// every VRDMA-RESULT line verbatim and a short summary, and cleans up (no
// QEMU or vrdmad left behind, sockets removed).
//
//	vrdma-vmtest [flags] exec --cmd 'ibv_devinfo -v'
//	vrdma-vmtest [flags] exec-pair --server 'ib_write_bw -d vrdma0' --client 'ib_write_bw -d vrdma0 {server}'
//	vrdma-vmtest [flags] pair --op write --size 65536 --iters 1000
//	vrdma-vmtest [flags] migrate [--across] [--op write|send] [--cancel] [--no-device] [--duration D]
//	vrdma-vmtest [flags] probe
//	vrdma-vmtest [flags] selftest
//	vrdma-vmtest [flags] spinup [--rounds N] [--json]
//	vrdma-vmtest [flags] interop --op write|read|send|atomic|write_lat [--reverse] [--pcap FILE]
//	vrdma-vmtest [flags] hostnic --op write|read|send|atomic|write_imm[,...] [--reverse] [--local] [--kill] [--rnic verbs:rxe0|soft]
//
// exec and exec-pair boot guests of the standard-stack image
// (scripts/guest-stack-image.sh: the vrdma kernel driver and rdma-core
// provider, perftest, ibverbs-utils) and run shell commands there; their
// exit status is the commands' (see execUsage in exec.go for the rules).
//
// pair boots a server and a client VM (one device each) that exchange their
// endpoints through the harness and move data between each other; both
// must report verified results. migrate live-migrates one of two such
// VMs, with a verified RDMA stream between them, to a second QEMU and
// prints one VRDMA-MIGRATE JSON line (migrateUsage in migrate.go). probe
// and selftest use one VM. spinup
// boots one VM without a vrdma device and measures hot-plug with vrdmactl
// (device add + vm attach until the guest probed the device, vm detach +
// device rm); --json prints {"attach_s", "detach_s", "rounds", ...}.
// interop runs one perftest operation over RoCEv2 between a vrdmad device
// and a soft-RoCE guest in network namespaces and prints one JSON line
// (interopUsage in interop.go). hostnic proves vrdmad's verbs RNIC
// (--rnic verbs:rxe0) against a real kernel RDMA device: vrdmad and a
// vrdma client run inside an rxe guest, Debian's perftest in a second one
// (or a second vrdma device: --local), one JSON line per op
// (hostnicUsage in hostnic.go; internal/hostniclab). Its hidden
// subcommands hostnic-agent and hostnic-client are what runs inside the
// guest. The exit
// status is 0 on success, 1 on a failure (the guest's VRDMA-ERROR message
// is printed), 2 on bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/internal/hostniclab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

const usage = `usage: vrdma-vmtest [flags] SCENARIO [scenario flags]

scenarios:
  exec --cmd 'CMD'                  one VM with the standard RDMA stack runs CMD
  exec-pair --server 'CMD' --client 'CMD'
                                    two such VMs run CMD against each other
                                    (vrdma-vmtest exec --help says more)
  pair --op OP --size N --iters N   two VMs, server and client, OP between them
  migrate [--across] [--op write|send] [--cancel] [--no-device]
                                    two VMs with a verified stream between them,
                                    one live-migrated to a second QEMU
                                    (vrdma-vmtest migrate --help says more)
  probe                             one VM: find and initialise the device
  selftest                          one VM: every verb on a loopback QP pair
  spinup [--rounds N] [--json]      one VM: hot-plug spin-up and tear-down times
  interop --op OP [--reverse]       RoCEv2 between vrdmad (--roce-bind) and an rxe
                                    guest running perftest, data verified
                                    (vrdma-vmtest interop --help says more)
  hostnic --op OP[,OP...] [--reverse] [--local] [--kill] [--rnic verbs:rxe0|soft]
                                    vrdmad's verbs RNIC on rxe inside a guest,
                                    against perftest in a second guest (or a
                                    second vrdma device), data and rxe objects
                                    checked (vrdma-vmtest hostnic --help)

flags:
`

type options struct {
	vrdmad, vrdmactl, qemuBin, kernel, initrd string
	memory, hugepages                         int
	timeout                                   time.Duration
	verbose                                   bool
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(argv []string, stdout, stderr io.Writer) int {
	exe, _ := os.Executable()
	binDir := filepath.Dir(exe)
	var o options
	var version bool
	fs := cli.New("vrdma-vmtest")
	fs.StringVar(&o.vrdmad, "vrdmad", filepath.Join(binDir, "vrdmad"), "the vrdmad `binary`")
	fs.StringVar(&o.vrdmactl, "vrdmactl", filepath.Join(binDir, "vrdmactl"), "the vrdmactl `binary` (spinup)")
	fs.StringVar(&o.qemuBin, "qemu", "", "the patched qemu-system-x86_64 `binary` (default: $VRDMA_QEMU, else qemu-system-x86_64 beside this program)")
	fs.StringVar(&o.kernel, "kernel", filepath.Join(binDir, "guest", "vmlinuz"), "guest kernel `path`")
	fs.StringVar(&o.initrd, "initrd", filepath.Join(binDir, "guest", "initramfs.img"), "guest initramfs `path`")
	fs.IntVar(&o.memory, "memory", guestvm.DefaultMemoryMiB, "guest RAM in `MiB`")
	fs.IntVar(&o.hugepages, "hugepages", guestvm.DefaultHugePages, "2 MiB hugepages each guest reserves")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound on the whole scenario")
	fs.BoolVar(&o.verbose, "v", false, "print the guests' consoles and the daemon's log at the end")
	fs.BoolVar(&version, "version", false, "print the version and exit")
	// The flags above go after the scenario too ("probe --timeout 10m");
	// the hidden guest-side subcommands take their arguments as they are.
	err := cli.ParseHelp(fs, cli.Hoist(fs, argv, hostniclab.AgentCommand, hostniclab.ClientCommand), usage)
	if err != nil {
		return cli.Exit(stdout, stderr, "vrdma-vmtest", err)
	}
	if version {
		fmt.Fprintln(stdout, cli.VersionLine("vrdma-vmtest"))
		return 0
	}
	if fs.NArg() == 0 {
		fmt.Fprintf(stderr, "vrdma-vmtest: no scenario given\n%s", usage)
		cli.PrintDefaults(stderr, fs)
		return 2
	}
	switch fs.Arg(0) {
	case "interop":
		return runInterop(fs.Args()[1:], o, binDir, stdout, stderr)
	case "hostnic":
		return runHostnic(fs.Args()[1:], o, binDir, stdout, stderr)
	case hostniclab.AgentCommand: // inside guest A
		return runHostnicAgent(fs.Args()[1:], stdout, stderr)
	case hostniclab.ClientCommand: // inside guest A, started by the agent
		return runHostnicClient(fs.Args()[1:], stdout, stderr)
	}
	if sc := fs.Arg(0); sc == "exec" || sc == "exec-pair" {
		kernelSet := false
		fs.Visit(func(fl *flag.Flag) { kernelSet = kernelSet || fl.Name == "kernel" || fl.Name == "initrd" })
		return runExec(sc, fs.Args()[1:], o, kernelSet, binDir, stdout, stderr)
	}
	// The scenario's command line is checked before anything is looked
	// for: a typo is bad usage wherever the binaries are.
	scenario, rest := fs.Arg(0), fs.Args()[1:]
	var (
		pf pairFlags
		sf spinupFlags
		mf migrateFlags
	)
	switch scenario {
	case "pair":
		pf, err = parsePair(rest, stderr)
	case "migrate":
		mf, err = parseMigrate(rest, stderr)
	case "spinup":
		sf, err = parseSpinup(rest, stderr)
	case "probe", "selftest":
		if len(rest) > 0 {
			fmt.Fprintf(stderr, "vrdma-vmtest: %s takes no arguments, got %q\n", scenario, rest)
			return 2
		}
	default:
		fmt.Fprintf(stderr, "vrdma-vmtest: unknown scenario %q\n%s", scenario, usage)
		cli.PrintDefaults(stderr, fs)
		return 2
	}
	if printedHelp(err, stdout) {
		return 0
	}
	if err != nil {
		return 2
	}
	if o.qemuBin == "" {
		p, err := qemu.FindBinary(filepath.Dir(binDir))
		if err != nil {
			fmt.Fprintf(stderr, "vrdma-vmtest: %v (build it with make qemu, or pass --qemu)\n", err)
			return 1
		}
		o.qemuBin = p
	}
	for _, f := range []struct{ what, path string }{{"vrdmad", o.vrdmad}, {"qemu", o.qemuBin}, {"guest kernel", o.kernel}, {"guest initramfs", o.initrd}} {
		if _, err := os.Stat(f.path); err != nil {
			fmt.Fprintf(stderr, "vrdma-vmtest: %s: %v (make build / make qemu / make guest-image)\n", f.what, err)
			return 1
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	start := time.Now()
	switch scenario {
	case "pair":
		err = runPair(ctx, o, pf, stdout, stderr)
	case "migrate":
		err = runMigrate(ctx, o, mf, stdout, stderr)
	case "spinup":
		err = runSpinup(ctx, o, sf, stdout, stderr)
		if err == nil && sf.json {
			return 0
		}
	case "probe", "selftest":
		err = runSingle(ctx, o, scenario, stdout, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "vrdma-vmtest: %s: FAILED: %v\n", scenario, err)
		return 1
	}
	fmt.Fprintf(stdout, "vrdma-vmtest: %s passed in %.1f s\n", scenario, time.Since(start).Seconds())
	return 0
}

// errUsage is what a scenario's parser returns for a command line it
// cannot run, after it said why on standard error.
var errUsage = cli.ErrUsage

// parseScenario parses a scenario's flags (fs, named "vrdma-vmtest
// SCENARIO"): nil, a *cli.HelpError holding header and the flags for
// --help, or errUsage once the error is on stderr, in GNU form.
func parseScenario(fs *flag.FlagSet, args []string, header string, stderr io.Writer) error {
	err := cli.ParseHelp(fs, args, header)
	var he *cli.HelpError
	if err == nil || errors.As(err, &he) {
		return err
	}
	cli.Exit(io.Discard, stderr, fs.Name(), err)
	return errUsage
}

// printedHelp prints a scenario's --help (a *cli.HelpError) on stdout and
// reports whether err was one.
func printedHelp(err error, stdout io.Writer) bool {
	var he *cli.HelpError
	if errors.As(err, &he) {
		io.WriteString(stdout, he.Text)
		return true
	}
	return false
}

// pairFlags are the flags of the pair scenario, passed to both guests.
type pairFlags struct {
	op          string
	size, iters int
}

func parsePair(args []string, stderr io.Writer) (pairFlags, error) {
	var p pairFlags
	fs := flag.NewFlagSet("vrdma-vmtest pair", flag.ContinueOnError)
	fs.StringVar(&p.op, "op", "write", "write, read, send or atomic")
	fs.IntVar(&p.size, "size", 65536, "message size in bytes")
	fs.IntVar(&p.iters, "iters", 1000, "iterations")
	if err := parseScenario(fs, args, "usage: vrdma-vmtest [flags] pair [--op OP] [--size N] [--iters N]\n\nflags:\n", stderr); err != nil {
		return p, err
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "vrdma-vmtest pair: unexpected arguments %q\n", fs.Args())
		return p, errUsage
	case p.op != "write" && p.op != "read" && p.op != "send" && p.op != "atomic":
		fmt.Fprintf(stderr, "vrdma-vmtest pair: --op %q: want write, read, send or atomic\n", p.op)
		return p, errUsage
	case p.size <= 0 || p.iters <= 0:
		fmt.Fprintf(stderr, "vrdma-vmtest pair: --size and --iters must be positive\n")
		return p, errUsage
	}
	return p, nil
}

func (p pairFlags) args() []string {
	return []string{"--op", p.op, "--size", strconv.Itoa(p.size), "--iters", strconv.Itoa(p.iters)}
}

func runPair(ctx context.Context, o options, pf pairFlags, stdout, stderr io.Writer) error {
	d, err := startDaemon(ctx, o, "server", "client")
	if err != nil {
		return err
	}
	defer stopDaemon(d, o.verbose, stderr)

	server := guestConfig(o, d, "server", "server", pf.args())
	client := guestConfig(o, d, "client", "client", pf.args())
	fmt.Fprintf(stdout, "vrdma-vmtest: booting two VMs (%d MiB, TCG), %s %d B x %d between them\n", o.memory, pf.op, pf.size, pf.iters)
	p, err := guestvm.StartPair(ctx, server, client)
	if err != nil {
		return err
	}
	res, err := p.Wait(ctx)
	fmt.Fprintf(stdout, "vrdma-vmtest: /init reached in %.1f s (server), %.1f s (client)\n", p.Server.InitTime().Seconds(), p.Client.InitTime().Seconds())
	printResults(stdout, res.Server)
	printResults(stdout, res.Client)
	if err == nil {
		err = checkPair(pf, res)
	}
	if err == nil {
		summary(stdout, pf, res)
	}
	if err != nil || o.verbose {
		fmt.Fprint(stderr, p.Log())
	}
	if cerr := p.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

func runSingle(ctx context.Context, o options, scenario string, stdout, stderr io.Writer) error {
	d, err := startDaemon(ctx, o, "vm1")
	if err != nil {
		return err
	}
	defer stopDaemon(d, o.verbose, stderr)
	fmt.Fprintf(stdout, "vrdma-vmtest: booting one VM (%d MiB, TCG) for %s\n", o.memory, scenario)
	g, err := guestvm.Boot(ctx, guestConfig(o, d, "vm1", scenario, nil))
	if err != nil {
		return err
	}
	res, err := g.WaitResult(ctx)
	fmt.Fprintf(stdout, "vrdma-vmtest: /init reached in %.1f s\n", g.InitTime().Seconds())
	printResults(stdout, res)
	if err == nil {
		err = checkSingle(scenario, res)
	}
	if err != nil || o.verbose {
		fmt.Fprint(stderr, g.Log())
	}
	if cerr := g.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

func guestConfig(o options, d *vrdmadproc.Proc, dev, run string, args []string) guestvm.Config {
	return guestvm.Config{
		Name: dev, QEMU: o.qemuBin, Kernel: o.kernel, Initrd: o.initrd,
		MemoryMiB: o.memory, HugePages: o.hugepages, Run: run, Args: args,
		Devices: []qemu.VhostUserDevice{device(dev, d.Socket(dev))},
	}
}

// device is the QEMU side of a vrdmad device with one doorbell queue (one
// vCPU).
func device(id, socket string) qemu.VhostUserDevice {
	return qemu.VhostUserDevice{ID: id, Socket: socket, VirtioID: abi.DeviceID,
		NumVQs: abi.FirstDoorbellQueue + 1, VQSize: 256, ConfigSize: abi.ConfigSize}
}

// printResults prints the guest's result lines verbatim.
func printResults(w io.Writer, rs []guestresult.Result) {
	for _, r := range rs {
		fmt.Fprintln(w, r.Line())
	}
}

func checkSingle(scenario string, rs []guestresult.Result) error {
	if len(rs) == 0 {
		return fmt.Errorf("%s printed no VRDMA-RESULT", scenario)
	}
	if scenario == "selftest" {
		for _, r := range rs {
			if !r.Verified {
				return fmt.Errorf("selftest %s: not verified", r.Op)
			}
		}
		if last := rs[len(rs)-1]; last.Op != "all" {
			return fmt.Errorf("selftest printed no final \"all\" result")
		}
	}
	return nil
}

// checkPair checks that both sides reported verified results for pf.op.
func checkPair(pf pairFlags, res guestvm.PairResult) error {
	for _, side := range []struct {
		name string
		rs   []guestresult.Result
	}{{"server", res.Server}, {"client", res.Client}} {
		if len(side.rs) == 0 {
			return fmt.Errorf("%s printed no VRDMA-RESULT", side.name)
		}
		for _, r := range side.rs {
			if !r.Verified {
				return fmt.Errorf("%s: %s not verified: %s", side.name, r.Op, r.Raw)
			}
			if r.Op != "" && r.Op != pf.op {
				return fmt.Errorf("%s: result for op %q, want %q", side.name, r.Op, pf.op)
			}
		}
	}
	return nil
}

func summary(w io.Writer, pf pairFlags, res guestvm.PairResult) {
	c := res.Client[len(res.Client)-1]
	fmt.Fprintf(w, "vrdma-vmtest: %s %d B x %d VM to VM: %.3f GB/s, %.3f Mops, latency p50 %.1f us, p99 %.1f us; verified on both sides\n",
		pf.op, pf.size, pf.iters, c.GBytesPerS, c.Mops, c.LatP50, c.LatP99)
}

// startDaemon starts vrdmad (o.vrdmad) with the named devices, each on a
// socket in a temporary directory, and waits for its control API.
func startDaemon(ctx context.Context, o options, devices ...string) (*vrdmadproc.Proc, error) {
	return vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: o.vrdmad, Devices: devices})
}

// stopDaemon stops vrdmad (SIGTERM, then SIGKILL after 10 s), which removes
// its sockets, and prints its log when it did not exit cleanly or verbose
// is set.
func stopDaemon(d *vrdmadproc.Proc, verbose bool, w io.Writer) {
	if err := d.Stop(); err != nil {
		fmt.Fprintf(w, "vrdma-vmtest: %v\n", err) // the error holds the log
	} else if verbose {
		fmt.Fprintf(w, "=== vrdmad log ===\n%s", d.Log())
	}
}
