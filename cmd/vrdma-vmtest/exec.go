package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/internal/stacklab"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

const execUsage = `usage: vrdma-vmtest exec --cmd 'CMD' [flags]
       vrdma-vmtest exec-pair --server 'CMD' --client 'CMD' [flags]

exec boots one guest of the standard-stack image (bin/guest-stack: the
vrdma kernel driver, libibverbs with the vrdma provider, ibverbs-utils,
perftest, iproute2, strace) with one vrdma device on a vrdmad it starts,
runs CMD there with sh -c, as root, and prints the guest's console: init's
lines (VRDMA-INIT, vrdma-init: ..., the GID table, VRDMA-CMD-START), CMD's
stdout and stderr, then VRDMA-CMD-EXIT <code>, VRDMA-RMMOD ok|failed: ...,
one VRDMA-KERNEL-WARNING <line> per suspicious kernel log line, and
VRDMA-EXIT <code>. -q prints CMD's output only.

exec-pair boots two such guests, "server" (10.11.0.1) and "client"
(10.11.0.2), a vrdma device each on one vrdmad, joined by a private
virtio-net link (unix datagram sockets; no privileges, nothing leaves the
machine). {server} and {client} in either command become those addresses
(the names server and client resolve too). Every line is printed with the
prefix "server| " or "client| ".

When the client starts: both guests boot at once; the client's command
waits until the server's command listens on a TCP port (the guest reports
it), or the server's command ended, or --ready-timeout after the server's
command started. So a perftest or ibv_rc_pingpong client never meets a
server that is not listening yet, and needs no retry loop.

With --upgrades N, vrdmad hands its devices over to a new vrdmad process
(a live upgrade, vrdmactl daemon upgrade) N times while the commands run:
the first --upgrade-interval after the client's command started, then every
--upgrade-interval, as long as the client's command runs. Each handover
prints one line "VRDMA-UPGRADE {json}" with the old and new pid, the
daemon's pause_ms and whether it succeeded; a failed one makes the exit
status 1 (unless a command failed first).

Each guest's NIC has MAC 52:54:00:00:00:0N and its vrdma device the node
GUID 5254:00ff:fe00:000N (the MAC's EUI-64), which the kernel driver uses
to bind the RDMA port to eth0 (RoCE GIDs from its addresses). The device
is vrdma0 in the guest.

Exit status:
  exec        CMD's exit status
  exec-pair   0 when both commands exited 0; else the failing side's
              status, the client's when both failed. When one side fails,
              the other gets --grace to finish, then its guest is stopped
              (and does not count as failing)
  124         --timeout passed first
  125         no exit status from a command: vrdmad, QEMU or the boot
              failed, init could not run the command, or the guest died
  130         interrupted (SIGINT, SIGTERM); everything is cleaned up
  2           bad usage

flags:
`

// execFlags are the flags of exec and exec-pair.
type execFlags struct {
	cmd, server, client string
	qemuBin, vrdmad     string
	kernel, initrd      string
	append              string
	memory, smp         int
	timeout             time.Duration
	readyTimeout, grace time.Duration
	verbose, quiet      bool
	upgrades            int
	upgradeInterval     time.Duration
}

// execGuests are the guests of exec (one) or exec-pair (server, client).
func execGuests(pair bool) []stacklab.Guest {
	if pair {
		return stacklab.Guests([]string{guestvm.RoleServer, guestvm.RoleClient})
	}
	return stacklab.Guests([]string{"vm"})
}

// parseExec parses exec's or exec-pair's flags; o gives the defaults (the
// global flags), kernelSet whether --kernel/--initrd were given there.
func parseExec(scenario string, args []string, o options, kernelSet bool, binDir string, stderr io.Writer) (execFlags, error) {
	pair := scenario == "exec-pair"
	f := execFlags{qemuBin: o.qemuBin, vrdmad: o.vrdmad, kernel: o.kernel, initrd: o.initrd}
	if !kernelSet {
		f.kernel = filepath.Join(binDir, "guest-stack", "vmlinuz")
		f.initrd = filepath.Join(binDir, "guest-stack", "initramfs.img")
	}
	fs := flag.NewFlagSet("vrdma-vmtest "+scenario, flag.ContinueOnError)
	if pair {
		fs.StringVar(&f.server, "server", "", "the server guest's `command` (required)")
		fs.StringVar(&f.client, "client", "", "the client guest's `command` (required); {server} is the server's address")
		fs.DurationVar(&f.readyTimeout, "ready-timeout", guestvm.DefaultReadyTimeout, "longest wait for the server's command to listen before the client's starts (negative: none)")
		fs.DurationVar(&f.grace, "grace", guestvm.DefaultPeerGrace, "how long one side may run on after the other failed")
		fs.IntVar(&f.upgrades, "upgrades", 0, "hand vrdmad over to a new process (live upgrade) `N` times while the commands run")
		fs.DurationVar(&f.upgradeInterval, "upgrade-interval", 5*time.Second, "time before the first handover (after the client's command started) and between two")
	} else {
		fs.StringVar(&f.cmd, "cmd", "", "the `command` to run in the guest (required)")
	}
	fs.StringVar(&f.kernel, "kernel", f.kernel, "guest kernel `path`")
	fs.StringVar(&f.initrd, "initrd", f.initrd, "guest initramfs `path` (scripts/guest-stack-image.sh)")
	fs.StringVar(&f.qemuBin, "qemu", f.qemuBin, "the patched qemu-system-x86_64 `binary` (default: $VRDMA_QEMU, else beside this program)")
	fs.StringVar(&f.vrdmad, "vrdmad", f.vrdmad, "the vrdmad `binary`")
	fs.StringVar(&f.append, "append", "", "more kernel command line, e.g. 'loglevel=7 vrdma.dyndbg=+p'")
	fs.IntVar(&f.memory, "memory", o.memory, "guest RAM in `MiB`")
	fs.IntVar(&f.smp, "smp", 1, "vCPUs per guest (and doorbell queues per device)")
	fs.DurationVar(&f.timeout, "timeout", o.timeout, "bound on the whole run")
	fs.BoolVar(&f.verbose, "v", o.verbose, "print each guest's kernel console and QEMU's stderr, and the vrdmad log, on stderr at the end")
	fs.BoolVar(&f.quiet, "q", false, "print only the commands' output (init's failures and kernel warnings go to stderr)")
	if err := parseScenario(fs, args, execUsage, stderr); err != nil {
		return f, err
	}
	bad := func(format string, a ...any) (execFlags, error) {
		fmt.Fprintf(stderr, "vrdma-vmtest %s: "+format+"\n", append([]any{scenario}, a...)...)
		return f, errUsage
	}
	switch {
	case fs.NArg() > 0:
		return bad("unexpected arguments %q (quote the command: --cmd 'ibv_devices')", fs.Args())
	case !pair && strings.TrimSpace(f.cmd) == "":
		return bad("--cmd is required")
	case pair && (strings.TrimSpace(f.server) == "" || strings.TrimSpace(f.client) == ""):
		return bad("--server and --client are required")
	case f.memory < 64:
		return bad("--memory %d: at least 64 MiB", f.memory)
	case f.smp < 1 || f.smp > 64:
		return bad("--smp %d: want 1..64", f.smp)
	case f.timeout <= 0:
		return bad("--timeout must be positive")
	case pair && f.grace <= 0:
		return bad("--grace must be positive")
	case pair && (f.upgrades < 0 || f.upgrades > 100):
		return bad("--upgrades %d: want 0..100", f.upgrades)
	case pair && f.upgradeInterval <= 0:
		return bad("--upgrade-interval must be positive")
	}
	return f, nil
}

// runExec runs exec or exec-pair and returns the exit status.
func runExec(scenario string, args []string, o options, kernelSet bool, binDir string, stdout, stderr io.Writer) int {
	f, err := parseExec(scenario, args, o, kernelSet, binDir, stderr)
	if printedHelp(err, stdout) {
		return 0
	}
	if err != nil {
		return 2
	}
	pair := scenario == "exec-pair"
	guests := execGuests(pair)
	if err := checkCommands(f, guests); err != nil {
		fmt.Fprintf(stderr, "vrdma-vmtest %s: %v\n", scenario, err)
		return 2
	}
	say := func(format string, a ...any) {
		fmt.Fprintf(stderr, "vrdma-vmtest: %s: "+format+"\n", append([]any{scenario}, a...)...)
	}
	if f.qemuBin == "" {
		p, err := qemu.FindBinary(filepath.Dir(binDir))
		if err != nil {
			say("%v (build it with make qemu, or pass --qemu)", err)
			return guestvm.ExitHarness
		}
		f.qemuBin = p
	}
	for _, c := range []struct{ what, path, hint string }{
		{"vrdmad", f.vrdmad, "make build"}, {"qemu", f.qemuBin, "make qemu"},
		{"guest kernel", f.kernel, "make guest-stack-image"}, {"guest initramfs", f.initrd, "make guest-stack-image"},
	} {
		if _, err := os.Stat(c.path); err != nil {
			say("%s: %v (%s)", c.what, err, c.hint)
			return guestvm.ExitHarness
		}
	}

	sigCtx, stopSig := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stopSig()
	ctx, cancel := context.WithTimeout(sigCtx, f.timeout)
	defer cancel()
	// code is the exit status for the run's status c: 130 when a signal
	// ended the run.
	interrupted := func() bool { return sigCtx.Err() != nil }
	code := func(c int) int {
		if interrupted() {
			say("interrupted; cleaned up")
			return 130
		}
		if c == guestvm.ExitTimeout && ctx.Err() != nil {
			say("--timeout %v passed", f.timeout)
		}
		return c
	}

	names := make([]string, len(guests))
	for i, g := range guests {
		names[i] = g.Name
	}
	lab, err := stacklab.New(ctx, stacklab.Config{Names: names, VRDMAD: f.vrdmad, QEMU: f.qemuBin,
		Kernel: f.kernel, Initrd: f.initrd, MemoryMiB: f.memory, SMP: f.smp, Append: f.append})
	if err != nil {
		say("%v", err)
		return code(guestvm.ExitHarness)
	}
	defer func() {
		if err := lab.Close(); err != nil {
			fmt.Fprintf(stderr, "vrdma-vmtest: %v\n", err) // the error holds the log
		}
	}()
	cfgs, d := lab.Configs, lab.Daemon
	pr := &linePrinter{out: stdout, err: stderr, quiet: f.quiet}
	start := time.Now()
	if !pair {
		cfg := cfgs[0]
		cfg.Command = f.cmd
		say("booting one VM (%d MiB, %d vCPU, TCG) with vrdma0 on vrdmad", f.memory, f.smp)
		g, err := guestvm.BootStack(ctx, cfg)
		if err != nil {
			say("boot: %v", err)
			return code(guestvm.ExitHarness)
		}
		res, err := g.RunCommand(ctx, func(l guestvm.StackLine) { pr.print("", l) })
		cerr := g.Close()
		report(say, "", g, res, err)
		if f.verbose || (!interrupted() && (err != nil || !res.Reported)) {
			fmt.Fprint(stderr, g.Log())
		}
		if cerr != nil {
			say("close: %v", cerr)
		}
		if f.verbose {
			fmt.Fprintf(stderr, "=== vrdmad log ===\n%s", d.Log())
		}
		c := code(res.ExitCode)
		say("exit %d after %.1f s", c, time.Since(start).Seconds())
		return c
	}

	pcfg := guestvm.StackPairConfig{Server: cfgs[0], Client: cfgs[1], ReadyTimeout: f.readyTimeout, PeerGrace: f.grace}
	pcfg.Server.Command = stacklab.Substitute(f.server, guests)
	pcfg.Client.Command = stacklab.Substitute(f.client, guests)
	say("booting two VMs (%d MiB, %d vCPU each, TCG), a vrdma device each on one vrdmad, joined by virtio-net", f.memory, f.smp)
	p, err := guestvm.StartStackPair(ctx, pcfg)
	if err != nil {
		say("boot: %v", err)
		return code(guestvm.ExitHarness)
	}
	up := newUpgrader(d, f.upgrades, f.upgradeInterval, pr, say)
	res, err := p.Run(ctx, func(role string, l guestvm.StackLine) {
		pr.print(role, l)
		if role == guestvm.RoleClient && l.Kind == guestvm.KindCmdStart {
			up.start(ctx)
		}
	})
	upFailed := up.stop()
	if !interrupted() && (err != nil || res.ExitCode() != 0) {
		// While the guests still hold their objects: what vrdmad's QPs
		// say (state, counters: RNR, drops, errors) tells a hung pair
		// from a lost message.
		dumpQPs(d, stderr)
	}
	cerr := p.Close()
	report(say, guestvm.RoleServer, p.Server, res.Server, nil)
	report(say, guestvm.RoleClient, p.Client, res.Client, nil)
	say("client released: %s", orNone(res.Released))
	if res.ServerStopped {
		say("server: stopped %v after the client failed", f.grace)
	}
	if res.ClientStopped {
		say("client: stopped %v after the server failed", f.grace)
	}
	if err != nil {
		say("%v", err)
	}
	if f.verbose || (!interrupted() && err != nil) {
		fmt.Fprint(stderr, p.Log())
	}
	if cerr != nil {
		say("close: %v", cerr)
	}
	if f.verbose || (!interrupted() && err != nil) {
		fmt.Fprintf(stderr, "=== vrdmad log ===\n%s", d.Log())
	}
	c := code(res.ExitCode())
	if c == 0 && upFailed {
		c = 1
	}
	say("exit %d after %.1f s (server %s, client %s)", c, time.Since(start).Seconds(), status(res.Server, res.ServerStopped), status(res.Client, res.ClientStopped))
	return c
}

func orNone(s string) string {
	if s == "" {
		return "never"
	}
	return s
}

// status describes how one side ended, for the summary line.
func status(r guestvm.CommandResult, stopped bool) string {
	switch {
	case stopped:
		return "stopped"
	case r.Reported:
		return fmt.Sprintf("exit %d", r.ExitCode)
	case !r.Started:
		return "command never started"
	}
	return "no exit status"
}

// report prints a guest's timings and what init said besides the command.
func report(say func(string, ...any), role string, g *guestvm.Guest, r guestvm.CommandResult, err error) {
	who := g.Name()
	if role != "" {
		who = role
	}
	if r.Started {
		say("%s: /init %.1f s, command started %.1f s after boot", who, g.InitTime().Seconds(), r.BootToCommand.Seconds())
	} else {
		say("%s: the command never started", who)
	}
	for _, e := range r.Errors {
		say("%s: init: %s", who, e)
	}
	if n := len(r.KernelWarnings); n > 0 {
		say("%s: %d kernel warning line(s) (VRDMA-KERNEL-WARNING)", who, n)
	}
	if r.Rmmod != "" && r.Rmmod != "ok" {
		say("%s: rmmod vrdma %s", who, r.Rmmod)
	}
	if err != nil {
		say("%s: %v", who, err)
	}
}

// checkCommands checks, before anything starts, that each command (with
// {server} and {client} replaced) fits on its guest's kernel command line
// with f.append.
func checkCommands(f execFlags, guests []stacklab.Guest) error {
	cmds := []string{f.cmd}
	if len(guests) == 2 {
		cmds = []string{f.server, f.client}
	}
	var hosts []guestvm.Host
	for _, g := range guests {
		hosts = append(hosts, guestvm.Host{Name: g.Name, IP: g.IP.Addr()})
	}
	for i, g := range guests {
		c := guestvm.StackConfig{Name: g.Name, QEMU: "qemu", Kernel: "kernel", Initrd: "initrd",
			Command: stacklab.Substitute(cmds[i], guests), NIC: &qemu.NIC{ID: "net0", MAC: g.MAC}, IP: g.IP,
			Hosts: hosts, Append: f.append, MemoryMiB: f.memory}
		if err := c.Validate(); err != nil {
			return fmt.Errorf("%s: %w", g.Name, err)
		}
	}
	return nil
}

// linePrinter prints the guests' console lines, whole lines at a time,
// from any goroutine: with the prefix "ROLE| " when a role is given; with
// quiet, only the commands' output on out, and init's failures, kernel
// warnings and a failed rmmod on err.
type linePrinter struct {
	mu       sync.Mutex
	out, err io.Writer // protected by mu
	quiet    bool      // immutable
}

func (p *linePrinter) print(role string, l guestvm.StackLine) {
	w := p.out
	if p.quiet && !l.Command {
		switch {
		case l.Kind == guestvm.KindError, l.Kind == guestvm.KindKernelWarning,
			l.Kind == guestvm.KindRmmod && !strings.HasPrefix(l.Text, guestvm.PrefixRmmod+" ok"):
			w = p.err
		default:
			return
		}
	}
	prefix := ""
	if role != "" {
		prefix = role + "| "
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(w, "%s%s\n", prefix, l.Text)
}

// dumpQPs prints every device's QPs as vrdmad lists them (GET
// /v1/devices/{id}/qps: state, PSNs, counters), one JSON line each, at
// most 64 a device, for a run that failed.
func dumpQPs(d *vrdmadproc.Proc, w io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := d.Client()
	devs, err := c.Devices(ctx)
	if err != nil {
		fmt.Fprintf(w, "=== vrdmad QPs: %v ===\n", err)
		return
	}
	for _, dev := range devs {
		qps, err := c.QPs(ctx, dev.ID)
		fmt.Fprintf(w, "=== vrdmad: device %s, %d QPs ===\n", dev.ID, len(qps))
		if err != nil {
			fmt.Fprintf(w, "%v\n", err)
			continue
		}
		for i, q := range qps {
			if i == 64 {
				fmt.Fprintf(w, "... %d more\n", len(qps)-i)
				break
			}
			b, _ := json.Marshal(q)
			fmt.Fprintf(w, "%s\n", b)
		}
	}
}
