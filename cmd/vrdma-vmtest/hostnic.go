package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/internal/hostniclab"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/vmm/qemu"
)

const hostnicUsage = `usage: vrdma-vmtest hostnic --op write|read|send|atomic|write_imm[,...] [--reverse] [--local] [--kill] [flags]

hostnic proves vrdmad's verbs RNIC (vrdmad --rnic verbs:DEVICE: the
host's RDMA NIC through rdma-core) with a real kernel RDMA device: Linux
rxe inside a TCG guest. It boots two guests from the rxe image (bin/rxe,
make rxe-image) joined by one virtio-net link (QEMU -netdev dgram over
127.0.0.1): guest A, the "host" (10.77.0.1), creates rxe0 on eth0 and
runs vrdmad with the RNIC and a vrdma client there (a virtio-user
front-end driven with the Go verbs library, as vrdma-vmtest interop's);
guest B (10.77.0.2) runs Debian's perftest on rxe. Both binaries reach
guest A in a second initramfs archive appended at run time (the image is
not rebuilt): vrdmad (--vrdmad) and this program (its hidden
hostnic-agent and hostnic-client subcommands; it must be static,
CGO_ENABLED=0).

By default vrdma is the requester (perftest serves); --reverse: perftest
is the requester, vrdma serves. --local: no guest B; the jobs run between
two vrdma devices of guest A's vrdmad, through its RNIC (rxe loops back
to its own GID); write_imm (WRITE with immediate, which perftest 6.06
lacks) runs only so. --kill adds the kill scenario: a local pair whose
requester gets SIGKILL mid-transfer; vrdmad must then clean up.

--rnic soft runs today's embedded software RNIC instead (vrdmad
--roce-bind 10.77.0.1; guest A then loads no rdma_rxe, whose socket holds
UDP port 4791): the baseline that works without the verbs RNIC.

Checked for every op: the exchange (perftest's own TCP exchange,
internal/pftexchange) gives the peer our QPN, rkey and address, and the
peer reads and writes there; the data (against a local pair: both
memories are exactly what the op must leave; against perftest, whose
bytes are random: completions in order, READs all alike and not ours,
WRITEs and SENDs landed where advertised and nowhere else, FETCH_ADDs
consecutive); with a verbs RNIC, rxe0's objects (rdma resource show,
and the MR listing) while the client's objects exist (vrdma's MR and QP
are rxe0's) and after it closed or was killed (as before the first
client; after vrdmad stops, as before vrdmad); vrdmad's own object counts
after each client (none).

Output: one JSON line per op on standard output: op, job, size, iters,
bytes, gbits_per_s (the requester's: the vrdma client's clock, or
perftest's --report_gbits figure with --reverse), verified, rnic,
reverse, local, gid_index, qpn, rkey, vaddr, peer_qpn, peer_rkey,
peer_vaddr, baseline, idle, during (counts and MRs), at_kill, after, daemon,
checks, error, guest_a_init_s, guest_a_s, guest_b_s. Progress goes to
standard error. Exit status: 0 when every op was verified; 1 otherwise;
2 for bad usage. Needs QEMU and bin/rxe; no root, no namespaces.

flags:
`

// hostnicFlags are the flags of the hostnic scenario.
type hostnicFlags struct {
	ops                  []string
	size, iters          int
	reverse, local, kill bool
	rnic                 string
	killJob              string
	rxeKernel, rxeInitrd string
	agent                string
	memory, smp          int
	settle               time.Duration
}

// hostnicDefaults are each op's size and iterations when not given: a
// few MiB, so that TCG guests finish in seconds.
var hostnicDefaults = map[string][2]int{
	"write": {65536, 64}, "read": {65536, 64}, "send": {65536, 64}, "atomic": {8, 200}, "write_imm": {65536, 64},
}

func parseHostnic(args []string, stderr io.Writer) (hostnicFlags, error) {
	var f hostnicFlags
	var ops string
	fs := flag.NewFlagSet("vrdma-vmtest hostnic", flag.ContinueOnError)
	fs.StringVar(&ops, "op", "write", "the ops, comma-separated: write, read, send, atomic, write_imm (--local only)")
	fs.IntVar(&f.size, "size", 0, "message size in bytes (default: 65536; atomic 8)")
	fs.IntVar(&f.iters, "iters", 0, "iterations (default: 64; atomic 200)")
	fs.BoolVar(&f.reverse, "reverse", false, "perftest is the requester (guest B runs its client), vrdma serves")
	fs.BoolVar(&f.local, "local", false, "run between two vrdma devices of guest A's vrdmad; no guest B")
	fs.BoolVar(&f.kill, "kill", false, "add the kill scenario (a local pair's requester gets SIGKILL mid-transfer)")
	fs.StringVar(&f.killJob, "kill-job", hostniclab.DefaultKillJob, "the kill scenario's `OP:SIZE:ITERS`")
	fs.StringVar(&f.rnic, "rnic", "verbs:rxe0", "vrdmad's RNIC in guest A: verbs:DEVICE[:PORT] or soft")
	fs.StringVar(&f.rxeKernel, "rxe-kernel", "", "the rxe image's kernel (default: bin/rxe/vmlinux beside this program)")
	fs.StringVar(&f.rxeInitrd, "rxe-initrd", "", "the rxe image's initramfs (default: bin/rxe/initramfs.img beside this program)")
	fs.StringVar(&f.agent, "agent", "", "the static vrdma-vmtest `binary` run in guest A (default: this program)")
	fs.IntVar(&f.memory, "guest-memory", hostniclab.DefaultMemoryMiB, "guest A's RAM in `MiB`")
	fs.IntVar(&f.smp, "guest-cpus", hostniclab.DefaultSMP, "guest A's vCPUs")
	fs.DurationVar(&f.settle, "settle", hostniclab.DefaultSettle, "bound on the wait for vrdmad's cleanup after a client ends")
	if err := parseScenario(fs, args, hostnicUsage, stderr); err != nil {
		return f, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "vrdma-vmtest hostnic: unexpected arguments %q\n", fs.Args())
		return f, errUsage
	}
	if ops != "" {
		f.ops = strings.Split(ops, ",")
	}
	if len(f.ops) == 0 && !f.kill {
		fmt.Fprintf(stderr, "vrdma-vmtest hostnic: no --op and no --kill\n")
		return f, errUsage
	}
	if _, _, _, err := hostniclab.RNICArgs(f.rnic); err != nil {
		fmt.Fprintf(stderr, "vrdma-vmtest hostnic: --%v\n", err)
		return f, errUsage
	}
	if f.local && f.reverse {
		fmt.Fprintf(stderr, "vrdma-vmtest hostnic: --reverse is for a perftest peer, not --local\n")
		return f, errUsage
	}
	if _, err := roceinterop.ParseJob(f.killJob); f.kill && err != nil {
		fmt.Fprintf(stderr, "vrdma-vmtest hostnic: --kill-job: %v\n", err)
		return f, errUsage
	}
	if _, err := f.jobs(); err != nil {
		fmt.Fprintf(stderr, "vrdma-vmtest hostnic: %v\n", err)
		return f, errUsage
	}
	return f, nil
}

// jobs are the flags' perftest jobs, in --op's order.
func (f hostnicFlags) jobs() ([]roceinterop.Job, error) {
	var jobs []roceinterop.Job
	for _, op := range f.ops {
		def, ok := hostnicDefaults[op]
		if !ok {
			return nil, fmt.Errorf("--op %q: want write, read, send, atomic or write_imm", op)
		}
		if op == "write_imm" && !f.local {
			return nil, errors.New("--op write_imm: Debian's perftest 6.06 has no WRITE with immediate; it runs between two vrdma devices (--local)")
		}
		size, iters := def[0], def[1]
		if f.size != 0 && op != "atomic" {
			size = f.size
		}
		if f.iters != 0 {
			iters = f.iters
		}
		j, err := roceinterop.ParseJob(fmt.Sprintf("%s_bw:%d:%d", op, size, iters))
		if err != nil {
			return nil, err
		}
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// hostnicLine is one JSON line of the scenario.
type hostnicLine struct {
	hostniclab.JobResult
	HostInitS float64 `json:"guest_a_init_s"`
	HostS     float64 `json:"guest_a_s"`
	PeerS     float64 `json:"guest_b_s,omitempty"`
}

// runHostnic is the hostnic scenario: it returns the exit status.
func runHostnic(args []string, o options, binDir string, stdout, stderr io.Writer) int {
	f, err := parseHostnic(args, stderr)
	if printedHelp(err, stdout) {
		return 0
	}
	if err != nil {
		return 2
	}
	jobs, _ := f.jobs()
	if f.rxeKernel == "" {
		f.rxeKernel = filepath.Join(binDir, "rxe", "vmlinux")
	}
	if f.rxeInitrd == "" {
		f.rxeInitrd = filepath.Join(binDir, "rxe", "initramfs.img")
	}
	if f.agent == "" {
		f.agent, _ = os.Executable()
	}
	if o.qemuBin == "" {
		p, err := qemu.FindBinary(filepath.Dir(binDir))
		if err != nil {
			fmt.Fprintf(stderr, "vrdma-vmtest: %v (build it with make qemu, or pass --qemu)\n", err)
			return 1
		}
		o.qemuBin = p
	}
	for _, c := range []struct{ what, path, hint string }{{"vrdmad", o.vrdmad, "make build"}, {"qemu", o.qemuBin, "make qemu"},
		{"rxe kernel", f.rxeKernel, "make rxe-image"}, {"rxe initramfs", f.rxeInitrd, "make rxe-image"}} {
		if _, err := os.Stat(c.path); err != nil {
			fmt.Fprintf(stderr, "vrdma-vmtest hostnic: %s: %v (%s)\n", c.what, err, c.hint)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	cfg := hostniclab.Config{QEMU: o.qemuBin, Kernel: f.rxeKernel, Initrd: f.rxeInitrd, Vrdmad: o.vrdmad, Agent: f.agent,
		RNIC: f.rnic, Jobs: jobs, Reverse: f.reverse, Local: f.local, MemoryMiB: f.memory, SMP: f.smp, Settle: f.settle,
		Progress: stderr}
	if f.kill {
		cfg.KillJob = f.killJob
	}
	out, err := hostniclab.Run(ctx, cfg)
	if err != nil || o.verbose {
		fmt.Fprint(stderr, out.Log)
	}
	for _, r := range out.Peer {
		fmt.Fprintf(stderr, "guest B: %s\n", r.Line())
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	for _, r := range out.Results {
		enc.Encode(hostnicLine{JobResult: r, HostInitS: out.HostInit.Seconds(), HostS: out.HostTime.Seconds(), PeerS: out.PeerTime.Seconds()})
	}
	if err != nil {
		fmt.Fprintf(stderr, "vrdma-vmtest: hostnic: FAILED: %v\n", err)
		return 1
	}
	fmt.Fprintf(stderr, "vrdma-vmtest: hostnic passed: guest A /init in %.1f s, done in %.1f s; guest B done in %.1f s\n",
		out.HostInit.Seconds(), out.HostTime.Seconds(), out.PeerTime.Seconds())
	return 0
}

// runHostnicAgent is the hidden hostnic-agent subcommand (guest A).
func runHostnicAgent(args []string, stdout, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(stdout, "VRDMA-ERROR %s takes the spec file\n", hostniclab.AgentCommand)
		return 2
	}
	b, err := os.ReadFile(args[0])
	var spec hostniclab.AgentSpec
	if err == nil {
		err = json.Unmarshal(b, &spec)
	}
	if err != nil {
		fmt.Fprintf(stdout, "VRDMA-ERROR %s: %v\n", hostniclab.AgentCommand, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := hostniclab.RunAgent(ctx, spec, stdout, stderr); err != nil {
		// One line: the console protocol's messages are lines.
		fmt.Fprintf(stdout, "VRDMA-ERROR %s\n", strings.ReplaceAll(err.Error(), "\n", " | "))
		return 1
	}
	return 0
}

// runHostnicClient is the hidden hostnic-client subcommand (a vrdma
// client process in guest A).
func runHostnicClient(args []string, stdout, stderr io.Writer) int {
	var spec hostniclab.ClientSpec
	if len(args) != 1 || json.Unmarshal([]byte(args[0]), &spec) != nil {
		fmt.Fprintf(stderr, "%s takes its spec as one JSON argument\n", hostniclab.ClientCommand)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := hostniclab.RunClient(ctx, spec, stdout); err != nil {
		fmt.Fprintf(stderr, "hostnic %s: %v\n", spec.Role, err)
		return 1
	}
	return 0
}
