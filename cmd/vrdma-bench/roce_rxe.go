package main

// The roce section's rxe rows (issue 16, part 5): perftest's ib_write_bw
// in a Linux soft-RoCE (rdma_rxe) guest against a vrdma device, beside the
// same guest against a second rxe guest on the same bridge, in one run.
// Both guests run under TCG, so the figures are small; the ratio is what
// is judged.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

const (
	rxeSize       = 64 << 10 // ib_write_bw -s
	rxeIters      = 256      // ib_write_bw -n: 16 MiB, a few seconds under TCG
	rxeQuickIters = 64
	rxeMaxJobs    = 5 // jobs per boot (the kernel command line lists them)
	// rxeTimeout bounds the rows: four pairings under TCG, each about
	// ten seconds from boot to power-off on an idle 2-core machine.
	rxeTimeout = 8 * time.Minute
	// rxePeerTap and rxePeerMAC are the second rxe guest's link: a tap on
	// the interop lab's bridge in g, beside the first guest's tap0.
	rxePeerTap = "tap1"
	rxePeerMAC = "52:54:00:77:00:01"
)

// rxeDir is one direction of the rxe rows: Gbit/s of ib_write_bw with
// the rxe guest of tap0 against vrdma and against the second rxe guest.
type rxeDir struct {
	vrdma, rxe   float64   // medians
	vrdmas, rxes []float64 // each job's
	checks       []string  // what the vrdma side verified
	guestS       [2]float64
}

// rxeResult is what the rxe rows measured.
type rxeResult struct {
	// in: the rxe guest is the requester (perftest's client; its own
	// figures); out: the rxe guest is the responder, the requester
	// vrdma (its clock) or the second rxe guest (perftest's figures).
	in, out rxeDir
	iters   int
}

// rxeRows is the section's roceRxeRows: it skips with a note (and no row)
// where QEMU or the rxe image are missing, or where a pairing failed.
func rxeRows(s settings, w io.Writer) (roceMore, error) {
	root, _ := os.Getwd() // make bench runs at the repository's root
	qemuBin, err := qemu.FindBinary(root)
	if err == nil {
		_, _, err = roceinterop.RxeImage(root)
	}
	if err != nil {
		return roceMore{notes: []string{"vrdma↔rxe against rxe↔rxe: not measured in this run: " + err.Error() + "."}}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), rxeTimeout)
	defer cancel()
	iters := rxeIters
	if s.quick {
		iters = rxeQuickIters
	}
	job, err := roceinterop.ParseJob(fmt.Sprintf("%s:%d:%d", pftexchange.WriteBW, rxeSize, iters))
	if err != nil {
		return roceMore{}, err
	}
	n := min(s.repeats, rxeMaxJobs)
	res, err := rxeMeasure(ctx, root, qemuBin, job, n, w)
	if err != nil {
		// The guests are outside vrdma (QEMU, TCG, a Debian kernel):
		// a failed pairing costs the row, not the whole suite, and
		// says so (the consoles go to the progress output).
		progress(w, "roce: the rxe rows failed: %v", err)
		return roceMore{notes: []string{"vrdma↔rxe against rxe↔rxe: **failed** in this run (no row): " +
			firstLineOf(err.Error()) + "."}}, nil
	}
	return roceMore{rows: rxeRowsOf(res), notes: rxeNotes(res, n)}, nil
}

// rxeMeasure builds the interop lab (g: a bridge with the rxe guest's
// tap0, a second tap for the other rxe guest, and a veth to h), runs the
// jobs rxe↔rxe and then rxe↔vrdma, and removes the lab.
func rxeMeasure(ctx context.Context, root, qemuBin string, job roceinterop.Job, repeats int, w io.Writer) (rxeResult, error) {
	res := rxeResult{iters: job.Iters}
	kernel, initrd, err := roceinterop.RxeImage(root)
	if err != nil {
		return res, err
	}
	nl, err := netlab.New(netlab.Config{Prefix: roceLabPrefix})
	if err != nil {
		return res, err
	}
	defer nl.Close()
	lab, err := roceinterop.NewLabOn(nl)
	if err != nil {
		return res, err
	}
	if err := errors.Join(lab.G.AddTap(rxePeerTap), lab.G.SetMaster(rxePeerTap, "br0")); err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp("", "vrdma-bench-rxe-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	jobs := make([]roceinterop.Job, repeats)
	for i := range jobs {
		jobs[i] = job
	}

	// The vrdma side: an in-process daemon whose device's RoCE endpoint
	// is h's address.
	n, err := hostnet.New(udp.Config{RecoverIPv4ID: true}, 1)
	if err != nil {
		return res, err
	}
	defer n.Close()
	if err := lab.H.Do(func() error { _, err := n.Listen(roceinterop.HostIP); return err }); err != nil {
		return res, fmt.Errorf("roce endpoint in h: %w", err)
	}
	quiet := logrus.New()
	quiet.SetLevel(logrus.PanicLevel)
	r := &rig{d: daemon.New(logrus.NewEntry(quiet), daemon.Config{Pool: enginePool, Pin: memmap.PinConfig{},
		RoCE: n, RoCEAddrs: []netip.Addr{roceinterop.HostIP}}), dir: filepath.Join(dir, "daemon")}
	if err := os.Mkdir(r.dir, 0o700); err != nil {
		return res, err
	}
	defer r.close()
	sock, err := r.device()
	if err != nil {
		return res, err
	}
	dev, err := roceinterop.OpenDevice(ctx, sock, roceinterop.HostIP, 0)
	if err != nil {
		return res, err
	}
	defer dev.Close()

	for _, d := range []struct {
		role string // the first rxe guest's
		res  *rxeDir
	}{{"client", &res.in}, {"server", &res.out}} {
		g := roceinterop.Guest{QEMU: qemuBin, Kernel: kernel, Initrd: initrd, Role: d.role, Jobs: jobs}
		// rxe↔rxe: h's end of the veth is down, and the second guest
		// holds h's address (HostIP), so the first guest's command line
		// is the same in both pairings.
		progress(w, "roce: ib_write_bw 64 KiB, rxe guest (perftest %s) against a second rxe guest (TCG)", d.role)
		if err := lab.H.SetUp("vh", false); err != nil {
			return res, err
		}
		g.Dump = filepath.Join(dir, "rxe-rxe-"+d.role+".pcap")
		results, t, err := rxePair(ctx, lab, g, qemuBin, kernel, initrd)
		if err != nil {
			return res, fmt.Errorf("rxe↔rxe (first guest %s): %w", d.role, err)
		}
		d.res.guestS[0] = t.Seconds()
		if d.res.rxes, err = rxeGbits(results, job, repeats); err != nil {
			return res, fmt.Errorf("rxe↔rxe (first guest %s): %w", d.role, err)
		}

		progress(w, "roce: ib_write_bw 64 KiB, rxe guest (perftest %s) against vrdma (TCG)", d.role)
		if err := lab.H.SetUp("vh", true); err != nil {
			return res, err
		}
		g.Dump = filepath.Join(dir, "rxe-vrdma-"+d.role+".pcap")
		out, err := lab.RunVrdma(ctx, dev, g)
		if err != nil {
			out.Close()
			return res, fmt.Errorf("rxe↔vrdma (guest %s): %w\n%s", d.role, err, tail(out.GuestLog, 2000))
		}
		d.res.guestS[1] = out.GuestTime.Seconds()
		d.res.checks = out.Checks
		if d.role == "client" {
			d.res.vrdmas, err = rxeGbits(out.Results, job, repeats)
		} else {
			for _, r := range out.Runs {
				d.res.vrdmas = append(d.res.vrdmas, r.Gbits())
			}
		}
		out.Close()
		if err != nil {
			return res, fmt.Errorf("rxe↔vrdma (guest %s): %w", d.role, err)
		}
		if len(d.res.checks) != repeats || len(d.res.vrdmas) != repeats {
			return res, fmt.Errorf("rxe↔vrdma (guest %s): %d of %d jobs verified, %d rates", d.role,
				len(d.res.checks), repeats, len(d.res.vrdmas))
		}
		d.res.vrdma, d.res.rxe = median(d.res.vrdmas), median(d.res.rxes)
	}
	return res, nil
}

// rxePair boots the first rxe guest (lab.RunGuest: tap0, in first's
// role) and the second (the other role, on rxePeerTap with h's address)
// together and returns the client's results and the first guest's time
// from boot to power-off.
func rxePair(ctx context.Context, lab *roceinterop.Lab, first roceinterop.Guest, qemuBin, kernel, initrd string) ([]guestvm.Result, time.Duration, error) {
	jobs := make([]string, len(first.Jobs))
	for i, j := range first.Jobs {
		jobs[i] = j.String()
	}
	role, app := "server", ""
	if first.Role == "server" {
		role, app = "client", " rxe.peer="+roceinterop.GuestIP.String()
	}
	peer := guestvm.Config{Name: "rxe-bench-" + role, QEMU: qemuBin, Kernel: kernel, Initrd: initrd,
		SMP: 1, HugePages: 1, Run: "perftest", Args: jobs,
		Append: "rxe.role=" + role + " rxe.ip=" + roceinterop.HostIP.String() + " rxe.runs=1 rxe.gid=1" + app,
		ExtraQEMUArgs: []string{
			"-netdev", "tap,id=n0,ifname=" + rxePeerTap + ",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=n0,romfile=,mac=" + rxePeerMAC,
		}}
	// A guest whose peer failed would wait for it until the timeout.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	peerDone := make(chan error, 1)
	var peerResults []guestvm.Result
	var peerLog string
	go func() {
		// QEMU lives in g and is tied to the thread that started it.
		err := lab.G.Do(func() error {
			g, err := guestvm.Boot(pctx, peer)
			if err != nil {
				return err
			}
			defer g.Close()
			peerResults, err = g.WaitResult(pctx)
			peerLog = g.Log()
			return err
		})
		if err != nil {
			cancel()
		}
		peerDone <- err
	}()
	start := time.Now()
	results, flog, err := lab.RunGuest(pctx, first)
	took := time.Since(start)
	if err != nil {
		cancel()
	}
	perr := <-peerDone
	if err != nil || perr != nil {
		return nil, 0, fmt.Errorf("first guest (%s): %v; second guest (%s): %v\nfirst console:\n%s\nsecond console:\n%s",
			first.Role, err, role, perr, tail(flog, 2000), tail(peerLog, 2000))
	}
	if role == "client" {
		results = peerResults
	}
	return results, took, nil
}

// rxeGbits returns the Gbit/s of each result, checking there is one
// write_bw result per job.
func rxeGbits(rs []guestvm.Result, job roceinterop.Job, n int) ([]float64, error) {
	if len(rs) != n {
		return nil, fmt.Errorf("%d results for %d jobs", len(rs), n)
	}
	var gs []float64
	for _, r := range rs {
		if r.Op != string(job.Op) || r.Size != uint64(job.Size) {
			return nil, fmt.Errorf("result %s: want %s", r.Line(), job)
		}
		if r.GBytesPerS <= 0 {
			// Seen once under --quick on a loaded machine: perftest
			// printed 0.00 Gb/s (it rounds its figure). No measurement.
			return nil, fmt.Errorf("result %s: no rate (perftest printed zero)", r.Line())
		}
		gs = append(gs, r.GBytesPerS*8)
	}
	return gs, nil
}

// firstLineOf returns s up to its first newline.
func firstLineOf(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func rxeRowsOf(r rxeResult) []row {
	return []row{
		{name: "ib_write_bw 64 KiB, rxe guest → vrdma (TCG)", figure: r.in.vrdma, unit: "Gbit/s",
			baseName: "the same rxe guest → a second rxe guest", baseline: r.in.rxe, baseUnit: "Gbit/s"},
		{name: "64 KiB WRITE, vrdma → rxe guest (TCG; vrdma's clock)", figure: r.out.vrdma, unit: "Gbit/s",
			baseName: "a second rxe guest → the same rxe guest (ib_write_bw)", baseline: r.out.rxe, baseUnit: "Gbit/s"},
	}
}

func rxeNotes(r rxeResult, repeats int) []string {
	return []string{fmt.Sprintf("vrdma against soft-RoCE (the two rxe rows): internal/roceinterop's topology, namespace "+
		"g holding a bridge with the rxe guest's tap, namespace h a veth's end on that bridge with 10.200.77.1 "+
		"(MTU 1500). The rxe guest (bin/rxe: Debian's generic kernel, rdma_rxe on virtio-net, Debian's perftest "+
		"through guest/perftest-jobs, `ib_write_bw -d rxe0 -i 1 -x 1 -F -s 65536 -n %d --report_gbits`; QEMU TCG, "+
		"one vCPU, 512 MiB) at 10.200.77.2 runs the job %d times in one boot, each pairing once as perftest's "+
		"client (the requester: the first row, perftest's own figures) and once as its server (the responder: "+
		"the second row). Baseline first, each time: h's veth end is down and a second rxe guest (the same "+
		"image, on a second tap of the same bridge) holds 10.200.77.1 and plays the other side, the two guests "+
		"booted together. Then h's end is up and an in-process daemon's device with its RoCE endpoint on "+
		"10.200.77.1 in h plays it with a fresh QP per job (internal/roceinterop's perftest peer: perftest's own "+
		"TCP exchange, then plain RoCEv2 RC), checking every byte in its memory and in the capture of the "+
		"guest's link; as the requester it times from its first post to its last completion. Each job "+
		"(Gbit/s), rxe guest → vrdma %s, → rxe %s; vrdma → rxe guest %s, rxe → %s. Verified: %d and %d of %d "+
		"jobs. Guest time (s; rxe↔rxe, rxe↔vrdma): %.0f, %.0f and %.0f, %.0f. So the first guest, its kernel, its "+
		"command line and its link are the same in both pairings, only the other side differs; the rxe↔rxe "+
		"pairs have a second TCG guest on the machine's two cores where the vrdma pairings have the daemon, "+
		"and their frames cross the bridge from tap to tap where vrdma's cross it to the veth. Under TCG the rxe "+
		"guests are the bottleneck, so the ratios say how much the other side costs the rxe guest, not what "+
		"vrdma does on hardware (the first rows, and `make compare-rxe` guest to guest, measure that). No "+
		"target: the issue asks for the comparison only.", r.iters, repeats, fmtList(r.in.vrdmas), fmtList(r.in.rxes),
		fmtList(r.out.vrdmas), fmtList(r.out.rxes), len(r.in.checks), len(r.out.checks), repeats,
		r.in.guestS[0], r.in.guestS[1], r.out.guestS[0], r.out.guestS[1])}
}
