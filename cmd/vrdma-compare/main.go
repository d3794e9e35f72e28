// Command vrdma-compare answers "why not rxe?" with a measurement: it runs
// the same workloads on three pairs of TCG guests under the same QEMU,
// -smp 1 and RAM, in one run, and prints each pair's median with its
// spread and the ratios:
//
//   - vrdma Go guest: two vrdma guests (bin/guest) on one vrdmad whose
//     vrdma-guest server/client drive the device from user space and
//     verify the data;
//   - vrdma perftest: two guests of the standard-stack image
//     (bin/guest-stack: the vrdma kernel driver, libibverbs with the vrdma
//     provider) on one vrdmad, running Debian's perftest 4.5;
//   - rxe perftest: two guests running the same perftest over Linux
//     soft-RoCE (rdma_rxe on virtio-net joined by QEMU's dgram backend on
//     127.0.0.1, bin/rxe).
//
// Both perftest pairs run guest/perftest-jobs, which both images install:
// the same jobs, the same perftest binaries and flags (-i 1 -F -s SIZE -n
// ITERS, --report_gbits for bandwidth), differing only in the device (-d
// vrdma0, rxe0) and its RoCE v2 GID index (-x). The ratios are each vrdma
// column against perftest over rxe; the Go-guest column beside the
// perftest one shows what the standard stack costs.
//
//	vrdma-compare [--short | --only WORDS] [--runs N] [--doc docs/benchmarks.md] [--log bin/compare-rxe.log]
//
// The full form writes its table into docs/benchmarks.md between
// "<!-- BEGIN compare-rxe -->" and "<!-- END compare-rxe -->" (replacing
// the block, or appending it). --short (make test) runs one bandwidth and
// one latency workload once on each pair and writes no document unless
// --doc is given; --only runs the rows whose names contain one of the
// comma-separated WORDS (case-insensitive), to look at a few rows, and
// writes no document either unless --doc is given. Every guest console, perftest's own output lines
// included, goes to the log file. Exit status: 0 success, 1 failure, 2 bad
// usage.
//
// Images: bin/guest (scripts/guest-image.sh) for the Go guests,
// bin/guest-stack (scripts/guest-stack-image.sh) for perftest over vrdma,
// bin/rxe (scripts/rxe-image.sh) for soft-RoCE.
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
	"strings"
	"syscall"
	"time"

	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

type options struct {
	vrdmad, qemuBin, kernel, initrd string
	stackKernel, stackInitrd        string
	rxeKernel, rxeInitrd            string
	memory, runs                    int
	short                           bool
	only                            string
	doc, logPath                    string
	timeout                         time.Duration
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(argv []string, stdout, stderr io.Writer) int {
	exe, _ := os.Executable()
	binDir := filepath.Dir(exe)
	root := filepath.Dir(binDir)
	var o options
	var version bool
	fs := cli.New("vrdma-compare")
	fs.StringVar(&o.vrdmad, "vrdmad", filepath.Join(binDir, "vrdmad"), "the vrdmad `binary`")
	fs.StringVar(&o.qemuBin, "qemu", "", "the patched qemu-system-x86_64 `binary` (default: $VRDMA_QEMU, else beside this program)")
	fs.StringVar(&o.kernel, "kernel", filepath.Join(binDir, "guest", "vmlinuz"), "vrdma Go guest kernel `path`")
	fs.StringVar(&o.initrd, "initrd", filepath.Join(binDir, "guest", "initramfs.img"), "vrdma Go guest initramfs `path`")
	fs.StringVar(&o.stackKernel, "stack-kernel", filepath.Join(binDir, "guest-stack", "vmlinuz"), "stack guest kernel `path` (perftest over vrdma)")
	fs.StringVar(&o.stackInitrd, "stack-initrd", filepath.Join(binDir, "guest-stack", "initramfs.img"), "stack guest initramfs `path` (perftest over vrdma)")
	fs.StringVar(&o.rxeKernel, "rxe-kernel", filepath.Join(binDir, "rxe", "vmlinux"), "rxe guest kernel `path` (uncompressed, PVH)")
	fs.StringVar(&o.rxeInitrd, "rxe-initrd", filepath.Join(binDir, "rxe", "initramfs.img"), "rxe guest initramfs `path`")
	fs.IntVar(&o.memory, "memory", guestvm.DefaultMemoryMiB, "RAM of every guest in `MiB`")
	fs.IntVar(&o.runs, "runs", 5, "runs of every workload on each pair (the median is reported)")
	fs.BoolVar(&o.short, "short", false, "one run of a bandwidth and a latency workload (make test)")
	fs.StringVar(&o.only, "only", "", "run only the rows whose names contain one of these comma-separated `WORDS` (case-insensitive)")
	fs.StringVar(&o.doc, "doc", "", "the document (`FILE`) to write the compare-rxe block into (default: docs/benchmarks.md, none with --short)")
	fs.StringVar(&o.logPath, "log", filepath.Join(binDir, "compare-rxe.log"), "log `file` for every guest console")
	fs.DurationVar(&o.timeout, "timeout", 0, "bound on the whole run (default 10m with --short, 90m otherwise)")
	fs.BoolVar(&version, "version", false, "print the version and exit")
	if err := cli.ParseHelp(fs, argv, compareUsage); err != nil {
		return cli.Exit(stdout, stderr, "vrdma-compare", err)
	}
	if version {
		fmt.Fprintln(stdout, cli.VersionLine("vrdma-compare"))
		return 0
	}
	if fs.NArg() > 0 {
		return cli.Exit(stdout, stderr, "vrdma-compare", cli.Usagef("unexpected arguments %q", fs.Args()))
	}
	setRuns := false
	fs.Visit(func(f *flag.Flag) { setRuns = setRuns || f.Name == "runs" })
	ws := Workloads
	switch {
	case o.short && o.only != "":
		fmt.Fprintln(stderr, "vrdma-compare: --short and --only exclude each other")
		return 2
	case o.short:
		ws = ShortWorkloads
		if !setRuns {
			o.runs = 1
		}
	case o.only != "":
		if ws = Select(Workloads, o.only); len(ws) == 0 {
			fmt.Fprintf(stderr, "vrdma-compare: --only %q names no row\n", o.only)
			return 2
		}
	case o.doc == "":
		o.doc = filepath.Join(root, "docs", "benchmarks.md")
	}
	if o.runs < 1 || o.runs > 100 {
		return cli.Exit(stdout, stderr, "vrdma-compare", cli.Usagef("--runs %d: want 1..100", o.runs))
	}
	if o.timeout == 0 {
		o.timeout = 90 * time.Minute
		if o.short {
			o.timeout = 10 * time.Minute
		}
	}
	if o.qemuBin == "" {
		p, err := qemu.FindBinary(root)
		if err != nil {
			fmt.Fprintf(stderr, "vrdma-compare: %v (make qemu, or pass --qemu)\n", err)
			return 1
		}
		o.qemuBin = p
	}
	files := []struct{ what, path string }{
		{"vrdmad", o.vrdmad}, {"qemu", o.qemuBin},
		{"stack guest kernel", o.stackKernel}, {"stack guest initramfs", o.stackInitrd},
		{"rxe guest kernel", o.rxeKernel}, {"rxe guest initramfs", o.rxeInitrd},
	}
	for _, w := range ws {
		if w.Runs(GoGuest) {
			files = append(files, struct{ what, path string }{"vrdma guest kernel", o.kernel},
				struct{ what, path string }{"vrdma guest initramfs", o.initrd})
			break
		}
	}
	for _, f := range files {
		if _, err := os.Stat(f.path); err != nil {
			fmt.Fprintf(stderr, "vrdma-compare: %s: %v (make build qemu guest-image guest-stack-image rxe-image)\n", f.what, err)
			return 1
		}
	}
	logf, err := os.Create(o.logPath)
	if err != nil {
		fmt.Fprintf(stderr, "vrdma-compare: %v\n", err)
		return 1
	}
	defer logf.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	rows, err := compare(ctx, o, ws, stdout, logf)
	if err != nil {
		fmt.Fprintf(stderr, "vrdma-compare: FAILED: %v (consoles in %s)\n", err, o.logPath)
		return 1
	}
	fmt.Fprintln(stdout)
	fmt.Fprint(stdout, Table(rows))
	fmt.Fprintln(stdout, Verdict(rows))
	if o.doc != "" {
		setup := fmt.Sprintf("All three pairs: QEMU %s, TCG, -smp 1, %d MiB per guest, in one run. "+
			"vrdma Go guest: Debian's cloud 6.1 kernel, vrdma-guest driving the device from user space, two vrdma devices on one vrdmad. "+
			"vrdma perftest: Debian's cloud 6.1 kernel with the vrdma kernel driver, libibverbs 44.0 with the vrdma provider, a vrdma device each on one vrdmad, "+
			"eth0 on a private virtio-net link for perftest's TCP exchange, RoCE v2 GID of eth0's IPv4 address. "+
			"rxe perftest: Debian's generic 6.1 kernel, rdma_rxe on virtio-net over -netdev dgram on 127.0.0.1, RoCE v2 GID index %d. "+
			"Both perftest pairs run Debian's perftest 4.5 through guest/perftest-jobs with the same flags "+
			"(ib_write_bw, ib_read_bw with --report_gbits; ib_write_lat, ib_send_lat; -i 1 -F -s SIZE -n ITERS; "+
			"ib_send_lat -R connects through rdma_cm), and Debian's UCX 1.13 ucx_perftest -t tag_bw/tag_lat -s SIZE -n ITERS "+
			"with UCX_TLS=rc_verbs,ud_verbs:aux (every message of the test over RC QPs; UD only wires them up).",
			filepath.Base(o.qemuBin), o.memory, rxeGID)
		block := Block(rows, o.runs, setup, time.Now().UTC().Format("2006-01-02 15:04 UTC"))
		if err := writeDoc(o.doc, block); err != nil {
			fmt.Fprintf(stderr, "vrdma-compare: %v\n", err)
			return 1
		}
		fmt.Fprintf(stdout, "vrdma-compare: wrote the compare-rxe block of %s\n", o.doc)
	}
	return 0
}

func writeDoc(path, block string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("read %s: %w", path, err)
	}
	doc, err := ReplaceBlock(string(old), block)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// compare runs the three pairs and summarises them.
func compare(ctx context.Context, o options, ws []Workload, stdout, logw io.Writer) ([]Row, error) {
	var vals [NumPairs][][]float64
	for p := range vals {
		vals[p] = make([][]float64, len(ws))
	}
	// add files perftest results of pair p under their workloads.
	add := func(p Pair, res []guestresult.Result) error {
		for _, r := range res {
			matched := false
			for i, w := range ws {
				if r.Op != w.PerftestOp || r.Size != uint64(w.Size) {
					continue
				}
				v, err := w.Figure(r, p)
				if err != nil {
					return err
				}
				vals[p][i] = append(vals[p][i], v)
				matched = true
				break
			}
			if !matched {
				return fmt.Errorf("%s client printed a result for no workload: %s", p, r.Raw)
			}
		}
		return nil
	}

	// perftest over rxe: one boot of the rxe pair runs every workload
	// o.runs times.
	fmt.Fprintf(stdout, "vrdma-compare: rxe pair: %d workloads x %d runs (perftest over rdma_rxe, TCG)\n", len(ws), o.runs)
	start := time.Now()
	res, log, err := runRxe(ctx, o, ws, o.runs)
	fmt.Fprintf(logw, "===== rxe pair =====\n%s\n", log)
	if err != nil {
		return nil, err
	}
	if err := add(RxePerftest, res); err != nil {
		return nil, err
	}
	if !strings.Contains(log, "#bytes") {
		return nil, errors.New("rxe log holds no perftest result table")
	}
	fmt.Fprintf(stdout, "vrdma-compare: rxe pair done in %.0f s\n", time.Since(start).Seconds())

	// perftest over vrdma: the same, in one boot of the stack pair.
	fmt.Fprintf(stdout, "vrdma-compare: stack pair: %d workloads x %d runs (perftest over the vrdma kernel driver and provider, TCG)\n", len(ws), o.runs)
	start = time.Now()
	res, log, warnings, err := runStack(ctx, o, ws, o.runs)
	fmt.Fprintf(logw, "===== vrdma stack pair =====\n%s\n", log)
	if err != nil {
		return nil, err
	}
	if err := add(VrdmaPerftest, res); err != nil {
		return nil, err
	}
	if !strings.Contains(log, "#bytes") {
		return nil, errors.New("stack log holds no perftest result table")
	}
	if warnings > 0 {
		fmt.Fprintf(stdout, "vrdma-compare: WARNING: the stack guests reported %d kernel warnings (VRDMA-KERNEL-WARNING in %s)\n", warnings, o.logPath)
	}
	fmt.Fprintf(stdout, "vrdma-compare: stack pair done in %.0f s\n", time.Since(start).Seconds())

	// vrdma Go guests: vrdma-guest runs one workload per boot.
	for run := 1; run <= o.runs; run++ {
		for i, w := range ws {
			if !w.Runs(GoGuest) {
				continue
			}
			t := time.Now()
			res, log, err := runVrdma(ctx, o, w)
			fmt.Fprintf(logw, "===== vrdma Go guest pair: %s, run %d =====\n%s\n", w.Name, run, log)
			if err != nil {
				return nil, fmt.Errorf("vrdma %s run %d: %w", w.Name, run, err)
			}
			if len(res) == 0 {
				return nil, fmt.Errorf("vrdma %s run %d: client printed no result", w.Name, run)
			}
			v, err := w.Figure(res[len(res)-1], GoGuest)
			if err != nil {
				return nil, fmt.Errorf("vrdma run %d: %w", run, err)
			}
			vals[GoGuest][i] = append(vals[GoGuest][i], v)
			fmt.Fprintf(stdout, "vrdma-compare: vrdma Go guest %s run %d: %.3f %s (%.0f s)\n", w.Name, run, v, unit(w.Metric), time.Since(t).Seconds())
		}
	}

	rows := make([]Row, len(ws))
	for i, w := range ws {
		rows[i].W = w
		for p := Pair(0); p < NumPairs; p++ {
			rows[i].S[p], _ = Summarize(vals[p][i])
			want := o.runs
			if !w.Runs(p) {
				want = 0
			}
			if n := rows[i].S[p].N; n != want {
				return nil, fmt.Errorf("%s: %d %s runs, want %d", w.Name, n, p, want)
			}
		}
	}
	return rows, nil
}

// compareUsage heads --help; the flags follow.
const compareUsage = `Usage: vrdma-compare [--short] [--runs N] [--only WORDS] [--doc FILE] [OPTIONS]

Run the same workloads on three pairs of TCG guests under one QEMU (vrdma
with the Go guest, perftest over vrdma's kernel driver and provider,
perftest over Linux soft-RoCE) and print each pair's median, its spread and
the ratios; the full run writes the table into docs/benchmarks.md.

Exit status: 0 success, 1 failure, 2 bad usage.

Options:
`
