package main

// The verbs RNIC section (issue 26, item 5): vrdmad --rnic verbs:rxe0, the
// host's RDMA NIC moving a vrdma device's data, measured where this
// machine has a kernel RDMA device: Linux rxe inside a TCG guest
// (internal/hostniclab). Two figures: perftest's ib_write_bw against a
// vrdma device on rxe0 beside the same perftest against rxe0 itself, and
// what vrdmad spends per posted work request.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/hostniclab"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/vmm/qemu"
)

const (
	verbsSize       = 64 << 10 // ib_write_bw -s
	verbsIters      = 256      // ib_write_bw -n: 16 MiB, about a second under TCG
	verbsQuickIters = 64
	verbsMaxPairs   = 4 // plain/vrdma pairs of ib_write_bw jobs
	// The per-WQE jobs: 64 B WRITEs between two vrdma devices on rxe0,
	// enough WQEs that a window's CPU time is tens of milliseconds or
	// more under TCG.
	verbsWQESize       = 64
	verbsWQEIters      = 4000
	verbsWQEQuickIters = 500
	// verbsTimeout bounds the one boot of the two guests.
	verbsTimeout = 8 * time.Minute
	// verbsTarget: the para-virtual layer costs less than a fifth of the
	// NIC's own throughput.
	verbsTarget = 0.8
	// mlx5PostNs is the order of magnitude assumed for ibv_post_send of
	// one WQE on mlx5 (a WQE written to the send queue in user space and
	// a doorbell record plus a BlueFlame/doorbell register write, no
	// system call); not measured here (no ConnectX on this machine).
	mlx5PostNs = 100.0
	// connectX6MsgRate is ConnectX-6's specified message rate (NVIDIA's
	// product brief: up to 215 million messages per second).
	connectX6MsgRate = 215e6
)

// verbsResult is what the section measured.
type verbsResult struct {
	vrdma, plain []float64 // ib_write_bw Gbit/s (perftest's figures), in the order run
	order        []string  // "plain" or "vrdma", in the order run
	windows      []hostniclab.Window
	iters        int // of the ib_write_bw jobs
	wqeIters     int // of the per-WQE jobs
	// Guest A's boot to /init and to its end, guest B's to its end.
	hostInit, hostTime, peerTime time.Duration
	// The same calibration in this process (no TCG).
	hostMemcpy, hostGetppid float64
}

// verbsSection measures the verbs RNIC in one boot of two rxe guests
// (internal/hostniclab): guest B's perftest client runs ib_write_bw
// 64 KiB against guest A, served alternately by Debian's perftest on rxe0
// itself and by a vrdma client on a vrdmad device whose RNIC is rxe0;
// then, in guest A, two vrdma devices of that vrdmad run 64 B WRITEs
// through rxe0 while vrdmad's CPU and the NIC's posts are accounted. It
// writes a note instead of rows where QEMU, the rxe image or the
// binaries are missing (run from the repository's root after make build,
// make qemu and make rxe-image), or where the guests failed.
func verbsSection(o options, w io.Writer) (section, error) {
	sec := section{title: "Verbs RNIC (vrdmad --rnic verbs:rxe0, under TCG)", intro: verbsIntro}
	s := o.s
	root, _ := os.Getwd() // make bench runs at the repository's root
	qemuBin, err := qemu.FindBinary(root)
	var kernel, initrd string
	if err == nil {
		kernel, initrd, err = roceinterop.RxeImage(root)
	}
	vrdmad := filepath.Join(root, "bin", "vrdmad")
	if err == nil {
		err = verbsBinaries(vrdmad, o.vmtest)
	}
	if err != nil {
		sec.notes = append(sec.notes, "Not measured in this run: "+err.Error()+".")
		return sec, nil
	}
	iters, wqeIters := verbsIters, verbsWQEIters
	if s.quick {
		iters, wqeIters = verbsQuickIters, verbsWQEQuickIters
	}
	bw, err1 := roceinterop.ParseJob(fmt.Sprintf("%s:%d:%d", pftexchange.WriteBW, verbsSize, iters))
	wqe, err2 := roceinterop.ParseJob(fmt.Sprintf("%s:%d:%d", pftexchange.WriteBW, verbsWQESize, wqeIters))
	if err := errors.Join(err1, err2); err != nil {
		return sec, err
	}
	pairs := min(max(s.repeats, 2), verbsMaxPairs)
	cfg := hostniclab.Config{QEMU: qemuBin, Kernel: kernel, Initrd: initrd, Vrdmad: vrdmad, Agent: o.vmtest,
		RNIC: "verbs:rxe0", Reverse: true, Plain: true, Account: true, Progress: w}
	for range pairs {
		cfg.Jobs = append(cfg.Jobs, bw)
	}
	for range max(s.repeats, 1) {
		cfg.LocalJobs = append(cfg.LocalJobs, wqe)
	}
	progress(w, "verbs: %d × ib_write_bw 64 KiB plain and through vrdma, %d × %d 64 B WRITEs through vrdmad (two TCG guests)",
		pairs, len(cfg.LocalJobs), wqeIters)
	ctx, cancel := context.WithTimeout(context.Background(), verbsTimeout)
	defer cancel()
	out, err := hostniclab.Run(ctx, cfg)
	if err == nil {
		var r verbsResult
		r, err = verbsCollect(out, iters, wqeIters)
		if err == nil {
			r.hostMemcpy, r.hostGetppid = hostniclab.Calibrate()
			sec.rows = verbsRows(r)
			sec.notes = append(sec.notes, verdict(sec.rows, verbsMiss), verbsNotes(r))
			return sec, nil
		}
	}
	// The guests are outside vrdma (QEMU, TCG, a Debian kernel): a failed
	// boot costs the section's rows, not the suite, and says so.
	progress(w, "verbs: failed: %v\n%s", err, verbsTail(out.Log, 4000))
	sec.notes = append(sec.notes, "**Failed** in this run (no row): "+verbsFirstLine(err.Error())+".")
	return sec, nil
}

// verbsBinaries checks that vrdmad and the agent (a static
// vrdma-vmtest) exist.
func verbsBinaries(vrdmad, agent string) error {
	for _, b := range []struct{ path, hint string }{{vrdmad, "make build"}, {agent, "make build"}} {
		if _, err := os.Stat(b.path); err != nil {
			return fmt.Errorf("%s is not built (%s)", b.path, b.hint)
		}
	}
	return hostniclab.CheckAgent(agent)
}

// verbsCollect sorts a run's results: the plain and vrdma ib_write_bw
// figures (perftest's own), and the per-WQE jobs' windows.
func verbsCollect(out *hostniclab.Outcome, iters, wqeIters int) (verbsResult, error) {
	r := verbsResult{iters: iters, wqeIters: wqeIters, hostInit: out.HostInit, hostTime: out.HostTime, peerTime: out.PeerTime}
	for _, jr := range out.Results {
		switch {
		case jr.Local:
			if jr.Window == nil || jr.Window.Posted == 0 {
				return r, fmt.Errorf("%s: no accounting window (posted nothing?)", jr.Job)
			}
			r.windows = append(r.windows, *jr.Window)
		case jr.PeerGbitsPerS <= 0:
			return r, fmt.Errorf("%s: perftest reported no rate", jr.Job)
		case jr.Plain:
			r.plain = append(r.plain, jr.PeerGbitsPerS)
			r.order = append(r.order, "plain")
		default:
			r.vrdma = append(r.vrdma, jr.PeerGbitsPerS)
			r.order = append(r.order, "vrdma")
		}
	}
	if len(r.plain) == 0 || len(r.plain) != len(r.vrdma) || len(r.windows) == 0 {
		return r, fmt.Errorf("%d plain, %d vrdma figures and %d windows", len(r.plain), len(r.vrdma), len(r.windows))
	}
	return r, nil
}

// perWQE returns vrdmad's CPU per WQE, the part inside
// ibv_post_send/recv and the rest (vrdmad's own) of the median window (by
// CPU per WQE; the lower one of an even count), so that the parts add up,
// and the medians of the guest's 64 B copy and null system call, in ns.
func (r verbsResult) perWQE() (total, post, own, memcpy, getppid float64) {
	ws := slices.Clone(r.windows)
	slices.SortFunc(ws, func(a, b hostniclab.Window) int {
		x, _ := a.PerWQE()
		y, _ := b.PerWQE()
		return cmp.Compare(x, y)
	})
	if len(ws) > 0 {
		total, post = ws[(len(ws)-1)/2].PerWQE()
	}
	var ms, gs []float64
	for _, w := range r.windows {
		ms, gs = append(ms, w.Memcpy64Ns), append(gs, w.GetppidNs)
	}
	return total, post, total - post, median(ms), median(gs)
}

func verbsRows(r verbsResult) []row {
	total, post, own, memcpy, _ := r.perWQE()
	rw := row{name: "ib_write_bw 64 KiB, perftest guest → vrdma device on rxe0 (perftest's figure)", figure: median(r.vrdma),
		unit: "Gbit/s", baseName: "the same perftest → perftest on rxe0 itself", baseline: median(r.plain), baseUnit: "Gbit/s",
		target: fmt.Sprintf("≥ %.1f×", verbsTarget)}
	rw.met = boolp(rw.ratio() >= verbsTarget)
	return []row{rw,
		{name: "vrdmad CPU per posted WQE (64 B WRITE through rxe0)", figure: total, unit: "ns",
			baseName: "a 64 B copy in the same guest", baseline: memcpy, baseUnit: "ns"},
		{name: "… of which inside ibv_post_send (rxe: a system call)", figure: post, unit: "ns",
			baseName: "vrdmad CPU per WQE", baseline: total, baseUnit: "ns"},
		{name: "… of which vrdmad's own (engine, completions, runtime)", figure: own, unit: "ns",
			baseName: "vrdmad CPU per WQE", baseline: total, baseUnit: "ns"},
	}
}

const verbsIntro = "vrdmad's verbs RNIC (`--rnic verbs:DEVICE`: a device's QPs, CQs and MRs are the host NIC's " +
	"objects through rdma-core, the NIC moves the data) on the one kernel RDMA device this machine has: Linux rxe " +
	"inside a TCG guest (internal/hostniclab, `vrdma-vmtest hostnic`). Guest A (2 vCPUs, 1 GiB) creates rxe0 on " +
	"its virtio-net link and runs vrdmad with `--rnic verbs:rxe0` and vrdma clients (virtio-user front-ends with " +
	"the Go verbs library, speaking perftest's TCP exchange); guest B (1 vCPU) runs Debian's perftest on its own " +
	"rxe0; the two are joined by one QEMU `-netdev dgram` link. Both are slow under TCG: the ratios are what is " +
	"judged, on the same emulated link in the same boot."

// verbsMiss is printed under the table when the throughput row misses.
const verbsMiss = "Under TCG the rxe devices are the bottleneck (their kernel threads and guest B's perftest " +
	"share the machine's cores with guest A's vrdmad and client); a miss means vrdmad's engine, its CQ " +
	"polling or the client's busy-polling took emulated CPU from guest A's rxe0, which the plain server does not " +
	"compete with. Check the per-job figures below for noise (one slow job) before reading it as a cost."

func verbsNotes(r verbsResult) string {
	total, post, own, memcpy, getppid := r.perWQE()
	var posted, compl, cpu, wall, postNs uint64
	for _, w := range r.windows {
		posted += w.Posted
		compl += w.Completions
		cpu += w.VrdmadCPUNs
		wall += w.WallNs
		postNs += w.PostNs
	}
	inflMemcpy, inflSys := memcpy/r.hostMemcpy, getppid/r.hostGetppid
	ownHost := own / inflMemcpy // vrdmad's own part at this host's speed, scaled as a copy is
	cx := ownHost + mlx5PostNs
	var b strings.Builder
	fmt.Fprintf(&b, "How it was measured: one boot of both guests (guest A /init after %.0f s, done after %.0f s; guest B "+
		"done after %.0f s). Throughput: guest B's client runs `ib_write_bw -d rxe0 -i 1 -x 1 -F -s 65536 -n %d "+
		"--report_gbits` (perftest is the requester; its own figure is compared) %d times against guest A, served "+
		"alternately, in the order %s, by Debian's perftest server on guest A's rxe0 (no vrdma: the NIC's own "+
		"throughput, the baseline) and by a vrdma client on a device of guest A's vrdmad whose QP, CQ and MR are "+
		"rxe0's (a fresh QP per job, checked as `vrdma-vmtest hostnic --reverse` checks it). So the perftest guest, "+
		"the link, guest A and its rxe0 are the same in both; only the para-virtual layer differs (a second rxe "+
		"guest, internal/rxepair's, as the baseline would have one vCPU where guest A has two, and alternating with "+
		"it would cost a boot per job). Each job (Gbit/s): "+
		"vrdma %s; plain %s.",
		r.hostInit.Seconds(), r.hostTime.Seconds(), r.peerTime.Seconds(), r.iters, len(r.order), strings.Join(r.order, ", "),
		verbsList(r.vrdma), verbsList(r.plain))
	fmt.Fprintf(&b, "\n\nPer-WQE cost: after the perftest jobs, two vrdma devices of the same vrdmad run %d × %d WRITEs "+
		"of 64 B through rxe0 (a local pair; the requester keeps up to 64 in flight). The requester samples vrdmad "+
		"just before its first post and just after its last completion: vrdmad's CPU time (every thread's, "+
		"/proc/PID/task/*/schedstat) and the NIC's counters from vrdmad's metrics "+
		"(`vrdma_hostnic_posted_work_requests_total`, `vrdma_hostnic_post_seconds_total`: the time inside "+
		"ibv_post_send/recv, cgo's transition included). Over the windows: %d WQEs posted, %d completions, "+
		"%.0f ms of vrdmad CPU in %.0f ms, %.0f ms inside ibv_post_send. Per WQE (%s): %.0f ns, of "+
		"which %.0f ns in ibv_post_send and %.0f ns vrdmad's own. In the same guest a 64 B copy takes %.1f ns and a "+
		"null system call (getppid) %.0f ns of its thread's CPU time; in this process, natively, %.1f ns and %.0f ns: "+
		"TCG (and this machine's other load, which a guest counts as its own time) inflates them "+
		"%.1f× and %.1f× (a null system call can cost more on this machine, itself a VM, than in the TCG guest: "+
		"only the copy's factor is a usable scale).",
		len(r.windows), r.wqeIters, posted, compl, float64(cpu)/1e6, float64(wall)/1e6, float64(postNs)/1e6, verbsPerWQEList(r.windows),
		total, post, own, memcpy, getppid, r.hostMemcpy, r.hostGetppid, inflMemcpy, inflSys)
	rate := 1e3 / cx // M WQEs/s of one core
	fmt.Fprintf(&b, "\n\nProjecting it on a real NIC: vrdmad's own part per WQE does not depend on the NIC (the "+
		"engine reads and validates the guest's WQE, posts it in a chain, waits for and polls the host CQ and writes "+
		"the guest's CQE, with the Go runtime's wake-ups around it); the ibv_post_send part is the provider's. rxe's "+
		"provider makes a system call per post into the kernel, which builds and sends the packets (here it also "+
		"loops them back to the responder), so under rxe it is the larger part; mlx5's writes the WQE into the send "+
		"queue in user space and rings a doorbell (no system call: of the order of %.0f ns, assumed, not measured "+
		"here). On a ConnectX the cost per WQE is therefore ≈ vrdmad's own part + mlx5's post. Divided by the copy's "+
		"inflation (a rough guide only: TCG slows branches, atomics and system calls unlike copies), vrdmad's own "+
		"part is ≈ %s ns on this machine's cores, so ≈ %s ns per WQE with mlx5, and one vrdmad core sustains "+
		"≈ 1 s ÷ %s ns ≈ %s M WQEs/s. A ConnectX-6 is specified for up to %.0f M messages/s, ≈ %s cores' worth at "+
		"this cost: with small messages vrdmad, not the NIC, bounds the rate unless it has that many engine threads "+
		"(vrdmad --engine-threads); at 100 Gbit/s, 4 KiB messages are 3.05 M/s (%s cores) and 64 KiB ones 0.19 M/s "+
		"(%s of one core).",
		mlx5PostNs, fmtNum(ownHost), fmtNum(cx), fmtNum(cx), fmtNum(rate), connectX6MsgRate/1e6,
		fmtNum(connectX6MsgRate/1e6/rate), fmtNum(3.05/rate), fmtNum(0.19/rate))
	return b.String()
}

// verbsPerWQEList prints each window's CPU per WQE and the median's
// choice.
func verbsPerWQEList(ws []hostniclab.Window) string {
	xs := make([]float64, len(ws))
	for i, w := range ws {
		xs[i], _ = w.PerWQE()
	}
	return "each window's " + verbsList(xs) + " ns; the median window's parts"
}

// verbsList prints figures separated by commas.
func verbsList(xs []float64) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = fmtNum(x)
	}
	return strings.Join(s, ", ")
}

// verbsFirstLine returns s up to its first newline.
func verbsFirstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// verbsTail returns the last n bytes of s.
func verbsTail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
