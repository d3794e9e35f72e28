// Command vrdma-bench is `make bench`: it runs vrdma's benchmark suite on
// the host through virtio-user front-ends on in-process daemons (no QEMU),
// prints the tables and writes docs/benchmarks.md, the bandwidth chart
// docs/benchmarks-bw.png, the scaling chart docs/benchmarks-scaling.png
// (aggregate bandwidth against busy device pairs) and the roce section's
// docs/benchmarks-roce-loss.png (goodput against the loss rate of one of
// four paths, sprayed and single-path). Every figure stands
// beside a baseline measured in the same run (memcpy, mlock, pin-all, a
// bare control round trip, a two-goroutine queue hand-off, one device pair,
// a victim pair alone, vrdma-perf in one process, a WRITE stream without
// a live upgrade, the same TCG guest migrated without its vrdma device)
// because the machines are shared and noisy: the ratios are judged,
// absolute numbers are printed. The migrate section (migrate.go) is the
// one that boots TCG guests (through --vmtest).
//
// Usage:
//
//	vrdma-bench [--out docs/benchmarks.md] [--png docs/benchmarks-bw.png]
//	            [--row-time 300ms] [--repeats 3] [--quick] [--micro FILE]
//	            [--vmtest bin/vrdma-vmtest] [--perf bin/vrdma-perf]
//	            [--cpuprofile FILE] [--trace FILE]
//	            [--density 500,1000,2000,5000,10000] [--density-idle 10s]
//	            [--only SECTIONS] [--pairs 1,2,4,8,32,128] [--spin-clients]
//	            [--engine-threads N] [--vrdmad bin/vrdmad] [--upgrades N]
package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

func main() {
	os.Exit(cli.Exit(os.Stdout, os.Stderr, "vrdma-bench", run(os.Args[1:], os.Stdout)))
}

// benchUsage heads --help; the flags follow.
const benchUsage = `Usage: vrdma-bench [--quick] [--only SECTIONS] [--out FILE] [--png FILE] [OPTIONS]

Run vrdma's benchmark suite on this host (make bench): virtio-user
front-ends on in-process daemons, no QEMU. Each figure is printed beside a
baseline measured in the same run; the report goes to --out and the charts
beside --png.

Exit status: 0 success, 1 failure, 2 bad usage.

Options:
`

type options struct {
	out, png, micro, vmtest, cpuprofile string
	perf                                string // vrdma-perf, for the perftest section
	vrdmad                              string // vrdmad, for the upgrade section
	upgrades                            int    // handovers of the upgrade section
	trace                               string // runtime/trace output (go tool trace)
	threads                             int    // --engine-threads
	only                                string
	loadStart                           string
	s                                   settings
	density                             string        // device counts of the density section
	densityIdle                         time.Duration // its idle-CPU window
}

// parseFlags parses the command line: a *cli.HelpError for --help, a
// *cli.UsageError for one it cannot run.
func parseFlags(args []string) (options, error) {
	fs := cli.New("vrdma-bench")
	var o options
	var version bool
	var quick bool
	var pairs string
	var threads int
	fs.StringVar(&o.out, "out", "docs/benchmarks.md", "markdown report to write (empty: none)")
	fs.StringVar(&o.png, "png", "docs/benchmarks-bw.png", "bandwidth chart to write; the scaling chart goes beside it as "+
		scalingPNG+", the roce section's goodput against loss as "+lossPNG+" (empty: no charts)")
	fs.StringVar(&o.micro, "micro", "", "go test -bench output to include (optional)")
	fs.StringVar(&o.vmtest, "vmtest", "bin/vrdma-vmtest", "vrdma-vmtest binary for the spin-up and verbs sections (the verbs section runs it in a guest: static)")
	fs.StringVar(&o.perf, "perf", "bin/vrdma-perf", "vrdma-perf binary for the perftest section (one process against two)")
	fs.StringVar(&o.vrdmad, "vrdmad", "bin/vrdmad", "vrdmad binary for the upgrade section (a process that hands over to itself)")
	fs.IntVar(&o.upgrades, "upgrades", 0, fmt.Sprintf("live upgrades of the upgrade section (0: %d; --quick %d)", upgradeCount, upgradeQuickCount))
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run")
	fs.StringVar(&o.trace, "trace", "", "write an execution trace of the whole run (go tool trace FILE)")
	fs.StringVar(&o.only, "only", "", "run only these sections (comma-separated: bw,rate,lat,perftest,reg,startup,control,scaling,iso,density,roce,verbs,upgrade,migrate)")
	fs.DurationVar(&o.s.rowTime, "row-time", 500*time.Millisecond, "time box of one repeat of a row")
	fs.IntVar(&o.s.repeats, "repeats", 3, "repeats per row (the median is reported)")
	fs.BoolVar(&quick, "quick", false, "small sizes and guests, for a smoke test")
	fs.StringVar(&o.density, "density", "500,1000,2000,5000,10000", "device counts of the density section (those that do not fit the machine are replaced by the largest that does)")
	fs.BoolVar(&o.s.spin, "spin-clients", false, "the scaling and isolation sections' clients busy-poll their CQs without ever yielding (as the single-pair sections' do)")
	fs.IntVar(&threads, "engine-threads", 0, "engine workers of the rigs' daemons, as vrdmad's --engine-threads (0: the default pool, GOMAXPROCS workers)")
	fs.StringVar(&pairs, "pairs", "", "pair counts of the scaling section, from 1 (default 1,2,4,8,32,128; --quick 1,2,4)")
	fs.DurationVar(&o.densityIdle, "density-idle", 10*time.Second, "how long the density section measures the idle daemon's CPU")
	fs.BoolVar(&version, "version", false, "print the version and exit")
	if err := cli.ParseHelp(fs, args, benchUsage); err != nil {
		return o, err
	}
	if version {
		return o, &cli.HelpError{Text: cli.VersionLine("vrdma-bench") + "\n"}
	}
	if fs.NArg() != 0 {
		return o, cli.Usagef("unexpected arguments %q", fs.Args())
	}
	if o.s.rowTime <= 0 || o.s.repeats < 1 || o.s.repeats > 100 {
		return o, cli.Usagef("--row-time must be positive and --repeats 1 … 100")
	}
	o.s.sizes = []uint64{64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}
	o.s.guestMems = []uint64{1 << 30, 4 << 30, 16 << 30}
	o.s.regSize = 1 << 30
	o.s.pairs = []int{1, 2, 4, 8, 32, 128}
	o.s.quick = quick
	if quick {
		o.s.sizes = []uint64{64, 4 << 10, 64 << 10}
		o.s.guestMems = []uint64{64 << 20, 128 << 20}
		o.s.regSize = 16 << 20
		o.s.pairs = []int{1, 2, 4}
		o.density = "" // density_test.go measures it (the section takes minutes)
	}
	switch {
	case o.upgrades < 0:
		return o, cli.Usagef("--upgrades %d: want 0 (the default) or more", o.upgrades)
	case o.upgrades == 0 && quick:
		o.upgrades = upgradeQuickCount
	case o.upgrades == 0:
		o.upgrades = upgradeCount
	}
	if threads < 0 {
		return o, cli.Usagef("--engine-threads %d: want 0 (the default) or more", threads)
	}
	o.threads = threads
	if pairs != "" {
		ps, err := parseCounts(pairs)
		if err != nil || ps[0] != 1 {
			return o, cli.Usagef("--pairs %q: want pair counts starting at 1 (the baseline), comma-separated", pairs)
		}
		o.s.pairs = ps
	}
	return o, nil
}

func (o options) want(sec string) bool {
	if o.only == "" {
		return true
	}
	for _, x := range strings.Split(o.only, ",") {
		if x == sec {
			return true
		}
	}
	return false
}

func run(args []string, stdout io.Writer) error {
	o, err := parseFlags(args)
	if err != nil {
		return err
	}
	if err := setEngineThreads(o.threads); err != nil {
		return err
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.trace != "" {
		f, err := os.Create(o.trace)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return err
		}
		defer trace.Stop()
	}
	start := time.Now()
	o.loadStart = loadavg()
	secs, pts, scale, loss, err := suite(o, stdout)
	if err != nil {
		return err
	}
	took := time.Since(start)
	writeText(stdout, secs)
	if o.png != "" && len(pts) > 0 {
		if err := writeChart(o.png, pts); err != nil {
			return err
		}
	}
	if o.png != "" && len(scale) > 0 {
		if err := writeScalingChart(filepath.Join(filepath.Dir(o.png), scalingPNG), scale); err != nil {
			return err
		}
	}
	if o.png != "" && len(loss) > 0 {
		if err := writePNG(filepath.Join(filepath.Dir(o.png), lossPNG), drawLossChart(loss)); err != nil {
			return err
		}
	}
	if o.out != "" {
		var b bytes.Buffer
		writeMarkdown(&b, environment(o), secs, took)
		if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(o.out, carryCompareRxe(readOld(o.out), b.Bytes()), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\nwhole run %s; wrote %s %s\n", took.Round(time.Millisecond), o.out, o.png)
	return nil
}

func environment(o options) string {
	cpu := "unknown CPU"
	if b, err := readFile("/proc/cpuinfo"); err == nil {
		for _, l := range splitLines(b) {
			if strings.HasPrefix(l, "model name") {
				if i := strings.Index(l, ":"); i >= 0 {
					cpu = strings.TrimSpace(l[i+1:])
				}
				break
			}
		}
	}
	return fmt.Sprintf("Machine: %s, %d CPUs (GOMAXPROCS %d), %s; %s per repeat, %d repeats per row. "+
		"Load average at the start: %s, at the end: %s (other work on a shared machine lowers every "+
		"busy-polling figure).\n", cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(),
		o.s.rowTime, o.s.repeats, o.loadStart, loadavg())
}

func progress(w io.Writer, format string, a ...any) {
	fmt.Fprintf(w, "vrdma-bench: "+format+"\n", a...)
}

// suite runs every section.
func suite(o options, w io.Writer) (secs []section, pts []bwPoint, scale []scalePoint, loss []lossPoint, err error) {
	s := o.s
	main, err := newRig(memmap.PinConfig{CacheBytes: 2 * s.regSize})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	defer main.close()
	bufBytes := int(depth * s.sizes[len(s.sizes)-1])
	var p *pair
	if o.want("bw") || o.want("rate") || o.want("lat") || o.want("control") {
		if p, err = openPair(main, bufBytes); err != nil {
			return nil, nil, nil, nil, fmt.Errorf("pair: %w", err)
		}
		defer p.close()
	}

	if o.want("bw") {
		progress(w, "bandwidth, %d sizes", len(s.sizes))
		if pts, err = bandwidth(s, p); err != nil {
			return nil, nil, nil, nil, err
		}
		secs = append(secs, bwSection(pts))
	}
	if o.want("rate") {
		progress(w, "message rate")
		base, _ := handoff(depth, s.rowTime, 0)
		var rows []row
		for _, op := range []struct {
			name string
			op   int
		}{{"64 B WRITE", abi.WROpRDMAWrite}, {"64 B SEND", abi.WROpSend}} {
			r, err := msgRate(s, p, op.op)
			if err != nil {
				return nil, nil, nil, nil, fmt.Errorf("%s rate: %w", op.name, err)
			}
			rows = append(rows, row{name: op.name, figure: r / 1e6, unit: "Mops/s", baseName: "goroutine queue hand-off",
				baseline: base / 1e6, baseUnit: "Mops/s", target: "≥ 2 Mops/s", met: boolp(r >= 2e6)})
		}
		secs = append(secs, rateSection(rows))
	}
	if o.want("lat") {
		progress(w, "latency")
		var rows []row
		var bl []float64
		for range s.repeats {
			_, lat := handoff(1, s.rowTime, 200000)
			slices.Sort(lat)
			bl = append(bl, us(percentile(lat, 50)))
		}
		base := median(bl)
		for _, op := range []struct {
			name string
			op   int
		}{{"64 B WRITE", abi.WROpRDMAWrite}, {"64 B SEND", abi.WROpSend}} {
			p50, p99, err := latencies(s, p, op.op)
			if err != nil {
				return nil, nil, nil, nil, fmt.Errorf("%s latency: %w", op.name, err)
			}
			rows = append(rows,
				row{name: op.name + " p50", figure: p50, unit: "µs", baseName: "hand-off round trip p50", baseline: base,
					baseUnit: "µs", invRatio: true, target: "< 5 µs", met: boolp(p50 < 5)},
				row{name: op.name + " p99", figure: p99, unit: "µs", baseName: "hand-off round trip p50", baseline: base,
					baseUnit: "µs", invRatio: true})
		}
		secs = append(secs, latSection(rows))
	}
	if o.want("control") {
		progress(w, "control path")
		cr, err := control(s, p)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs = append(secs, controlSection(cr))
	}
	if p != nil {
		p.close()
		p = nil
	}
	if o.want("perftest") {
		sec, err := perftestSection(o, w)
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("perftest: %w", err)
		}
		secs = append(secs, sec)
	}
	if o.want("reg") {
		progress(w, "registration of %s", sizeName(s.regSize))
		rr, err := registration(s, main)
		if err != nil {
			return nil, nil, nil, nil, fmt.Errorf("registration: %w", err)
		}
		secs = append(secs, regSection(s, rr))
	}
	if o.want("startup") {
		progress(w, "start-up")
		sec, err := startupSection(s, w)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs = append(secs, sec)
	}
	if o.want("scaling") {
		progress(w, "scaling")
		sec, sp, err := scalingSection(s)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs, scale = append(secs, sec), sp
	}
	if o.want("iso") {
		progress(w, "isolation")
		sec, err := isolationSection(s)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs = append(secs, sec)
	}
	if o.want("roce") {
		progress(w, "roce")
		sec, lp, err := roceSection(s, w)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs, loss = append(secs, sec), lp
	}
	if o.want("verbs") {
		progress(w, "verbs RNIC")
		sec, err := verbsSection(o, w)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs = append(secs, sec)
	}
	if o.want("density") {
		progress(w, "density")
		sec, err := densitySection(o, w)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs = append(secs, sec)
	}
	if o.want("upgrade") {
		progress(w, "live upgrade")
		sec, err := upgradeSection(o, w)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs = append(secs, sec)
	}
	if o.want("migrate") {
		progress(w, "live migration (TCG guests)")
		sec, err := migrateSection(o, w)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		secs = append(secs, sec)
	}
	secs = append(secs, spinupSection(o), microSection(o))
	return secs, pts, scale, loss, nil
}

// guestsMissing says what the sections that boot TCG guests through
// vrdma-vmtest lack ("" when nothing).
func guestsMissing(o options) string {
	switch {
	case !exists(o.vmtest):
		return o.vmtest + " is not built"
	case !exists("bin/qemu-system-x86_64"):
		return "bin/qemu-system-x86_64 is not built (make qemu)"
	case !exists("bin/guest/vmlinuz"):
		return "bin/guest/ has no guest image (make guest-image)"
	}
	return ""
}

// spinupSection runs `vrdma-vmtest spinup --json` when it exists, QEMU
// and the guest image are there and it supports the scenario.
func spinupSection(o options) section {
	sec := section{title: "Spin-up (hot-plug under TCG)"}
	reason := guestsMissing(o)
	if reason == "" {
		out, err := exec.Command(o.vmtest, "spinup", "--json").Output()
		if err != nil {
			reason = fmt.Sprintf("`%s spinup --json` is not available (%v)", o.vmtest, firstLine(err, out))
		} else {
			sec.notes = append(sec.notes, "Output of `vrdma-vmtest spinup --json` (hot-plug spin-up times under TCG):",
				"```\n"+strings.TrimSpace(string(out))+"\n```")
			return sec
		}
	}
	sec.notes = append(sec.notes, "Not measured in this run: "+reason+".")
	return sec
}

func firstLine(err error, out []byte) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return strings.TrimSpace(splitLines(string(ee.Stderr))[0])
	}
	return err.Error()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func microSection(o options) section {
	sec := section{title: "Go micro-benchmarks",
		intro: "Descriptor-chain pop/push (virtio), address translation (memmap) and WQE execution (engine) " +
			"have `testing.B` benchmarks with `b.SetBytes`. To compare commits with benchstat:\n\n" +
			"```\n" +
			"go install golang.org/x/perf/cmd/benchstat@latest\n" +
			"git stash -u; go test -run '^$' -bench . -benchmem -count 10 ./virtio ./memmap ./backend/rdma/engine > old.txt; git stash pop\n" +
			"go test -run '^$' -bench . -benchmem -count 10 ./virtio ./memmap ./backend/rdma/engine > new.txt\n" +
			"benchstat old.txt new.txt\n" +
			"```"}
	if o.micro == "" {
		sec.notes = append(sec.notes, "This run did not include them (`--micro` not given).")
		return sec
	}
	b, err := os.ReadFile(o.micro)
	if err != nil {
		sec.notes = append(sec.notes, "Not included: "+err.Error())
		return sec
	}
	var keep []string
	for _, l := range splitLines(string(b)) {
		if strings.HasPrefix(l, "Benchmark") || strings.HasPrefix(l, "pkg:") || strings.HasPrefix(l, "FAIL") {
			keep = append(keep, l)
		}
	}
	sec.notes = append(sec.notes, "This run (`go test -run '^$' -bench . -benchmem`, one count):",
		"```\n"+strings.Join(keep, "\n")+"\n```")
	return sec
}

// loadavg returns the 1, 5 and 15 minute load averages.
func loadavg() string {
	b, err := readFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(b)
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// readOld returns the current benchmarks page (nil if there is none), so
// the compare-rxe block that make compare-rxe wrote survives a regeneration.
func readOld(path string) []byte {
	b, _ := os.ReadFile(path)
	return b
}
