package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/vmm/qemu"
)

const interopUsage = `usage: vrdma-vmtest interop --op write|read|send|atomic|write_lat [--reverse] [flags]

interop runs one perftest operation over RoCEv2 between vrdma and Linux
soft-RoCE: it builds two network namespaces (g: the rxe guest's tap on a
bridge; h: the other end of a veth, 10.200.77.1), starts vrdmad in h with
--roce-bind 10.200.77.1 and one device, opens that device as a virtio-user
front-end with the Go verbs library, and boots the rxe guest (bin/rxe, make
rxe-image: Debian's generic kernel, rdma_rxe, perftest) in g, 10.200.77.2.
The two sides speak perftest's own TCP exchange.

By default vrdma is the requester: the guest runs perftest's server and
vrdma its client. --reverse: rxe is the requester (the guest runs ib_OP as
the client, vrdma serves). write_lat is a ping-pong, both sides write.

The data is verified: vrdma's memory and completions (WRITE and SEND
payloads land, READs bring the server's bytes, FETCH_ADDs run once and
return consecutive values) and the guest link's capture (QEMU filter-dump:
every RoCE frame's ICRC, every payload against vrdma's memory; tshark must
find nothing malformed).

Output: one JSON line on standard output: op, direction ("vrdma->rxe":
vrdma is the requester, "rxe->vrdma"), size, iterations, bytes,
gbits_per_s (measured by the requester: vrdma's clock, or perftest's
--report_gbits row), lat_us_p50 (write_lat --reverse: perftest's median),
lat_us_avg (write_lat: vrdma's mean half round trip), frames, verified,
capture_ok, tshark, peer_version, checks, pcap, guest_s, error. Progress goes to standard error.
Exit status: 0 when the run completed, was verified and its capture is
clean; 1 otherwise; 2 for bad usage. Needs root (namespaces, a tap).

flags:
`

// interopFlags are the flags of the interop scenario.
type interopFlags struct {
	op                   string
	size, iters          int
	reverse              bool
	pcap                 string
	rxeKernel, rxeInitrd string
	tshark               string
}

// interopDefaults are the sizes and iterations of each op when not given:
// a few MiB, so that a TCG guest finishes in seconds.
var interopDefaults = map[string][2]int{
	"write": {65536, 64}, "read": {65536, 64}, "send": {65536, 64}, "atomic": {8, 200}, "write_lat": {64, 200},
}

func parseInterop(args []string, stderr io.Writer) (interopFlags, error) {
	var f interopFlags
	fs := flag.NewFlagSet("vrdma-vmtest interop", flag.ContinueOnError)
	fs.StringVar(&f.op, "op", "write", "write, read, send, atomic or write_lat")
	fs.IntVar(&f.size, "size", 0, "message size in bytes (default: 65536; atomic 8; write_lat 64)")
	fs.IntVar(&f.iters, "iters", 0, "iterations (default: 64; atomic and write_lat 200)")
	fs.BoolVar(&f.reverse, "reverse", false, "rxe is the requester (the guest runs perftest's client)")
	fs.StringVar(&f.pcap, "pcap", "", "keep the guest link's capture in `file`")
	fs.StringVar(&f.rxeKernel, "rxe-kernel", "", "the rxe guest's kernel (default: bin/rxe/vmlinux beside this program)")
	fs.StringVar(&f.rxeInitrd, "rxe-initrd", "", "the rxe guest's initramfs (default: bin/rxe/initramfs.img beside this program)")
	fs.StringVar(&f.tshark, "tshark", "", "tshark `binary` (default: from $PATH; without one the capture is checked by the codec only)")
	if err := parseScenario(fs, args, interopUsage, stderr); err != nil {
		return f, err
	}
	def, ok := interopDefaults[f.op]
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "vrdma-vmtest interop: unexpected arguments %q\n", fs.Args())
		return f, errUsage
	case !ok:
		fmt.Fprintf(stderr, "vrdma-vmtest interop: --op %q: want write, read, send, atomic or write_lat\n", f.op)
		return f, errUsage
	}
	if f.size == 0 {
		f.size = def[0]
	}
	if f.iters == 0 {
		f.iters = def[1]
	}
	if _, err := f.job(); err != nil {
		fmt.Fprintf(stderr, "vrdma-vmtest interop: %v\n", err)
		return f, errUsage
	}
	return f, nil
}

// job is the perftest job of the flags.
func (f interopFlags) job() (roceinterop.Job, error) {
	op := f.op
	if op != "write_lat" {
		op += "_bw"
	}
	return roceinterop.ParseJob(fmt.Sprintf("%s:%d:%d", op, f.size, f.iters))
}

// interopResult is the JSON line interop prints.
type interopResult struct {
	Op         string   `json:"op"`
	Direction  string   `json:"direction"`
	Size       int      `json:"size"`
	Iterations int      `json:"iterations"`
	Bytes      int64    `json:"bytes"`
	GbitsPerS  float64  `json:"gbits_per_s"`
	LatUsP50   float64  `json:"lat_us_p50,omitempty"`
	LatUsAvg   float64  `json:"lat_us_avg,omitempty"`
	Frames     int      `json:"frames"`
	Verified   bool     `json:"verified"`
	CaptureOK  bool     `json:"capture_ok"`
	Tshark     bool     `json:"tshark"`
	PeerVer    string   `json:"peer_version,omitempty"`
	Checks     []string `json:"checks,omitempty"`
	Pcap       string   `json:"pcap,omitempty"`
	GuestS     float64  `json:"guest_s"`
	Error      string   `json:"error,omitempty"`
}

// runInterop is the interop scenario: it returns the exit status.
func runInterop(args []string, o options, binDir string, stdout, stderr io.Writer) int {
	f, err := parseInterop(args, stderr)
	if printedHelp(err, stdout) {
		return 0
	}
	if err != nil {
		return 2
	}
	job, _ := f.job()
	if f.rxeKernel == "" {
		f.rxeKernel = filepath.Join(binDir, "rxe", "vmlinux")
	}
	if f.rxeInitrd == "" {
		f.rxeInitrd = filepath.Join(binDir, "rxe", "initramfs.img")
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
			fmt.Fprintf(stderr, "vrdma-vmtest interop: %s: %v (%s)\n", c.what, err, c.hint)
			return 1
		}
	}
	if err := netlab.Available(); err != nil {
		fmt.Fprintf(stderr, "vrdma-vmtest interop: %v (run as root)\n", err)
		return 1
	}
	if f.tshark == "" {
		f.tshark, _ = exec.LookPath("tshark")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	res := interopResult{Op: f.op, Direction: "vrdma->rxe", Size: job.Size, Iterations: job.Iters, Bytes: job.Bytes(), Tshark: f.tshark != ""}
	if f.reverse {
		res.Direction = "rxe->vrdma"
	}
	err = interop(ctx, o, f, job, &res, stderr)
	if err != nil {
		res.Error = err.Error()
		fmt.Fprintf(stderr, "vrdma-vmtest: interop: FAILED: %v\n", err)
	}
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false) // "vrdma->rxe", not "vrdma-\u003erxe"
	enc.Encode(res)
	if err != nil || !res.Verified || !res.CaptureOK {
		return 1
	}
	return 0
}

// interop runs the scenario and fills res.
func interop(ctx context.Context, o options, f interopFlags, job roceinterop.Job, res *interopResult, stderr io.Writer) error {
	// What a crashed run left (namespaces of dead processes).
	if removed, err := netlab.Sweep(netlab.DefaultPrefix); err == nil && len(removed) > 0 {
		fmt.Fprintf(stderr, "vrdma-vmtest: removed stale namespaces %v\n", removed)
	}
	lab, err := roceinterop.NewLab()
	if err != nil {
		return err
	}
	defer lab.Close()
	d, err := lab.StartVrdmad(ctx, vrdmadproc.Config{Binary: o.vrdmad, Devices: []string{"interop"}})
	if err != nil {
		return err
	}
	defer func() {
		if err := d.Stop(); err != nil {
			fmt.Fprintf(stderr, "vrdma-vmtest: %v\n", err)
		} else if o.verbose {
			fmt.Fprintf(stderr, "=== vrdmad log ===\n%s", d.Log())
		}
	}()
	dev, err := roceinterop.OpenDevice(ctx, d.Socket("interop"), roceinterop.HostIP, 0)
	if err != nil {
		return err
	}
	defer dev.Close()
	dump := f.pcap
	if dump == "" {
		dir, err := os.MkdirTemp("", "vrdma-interop-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		dump = filepath.Join(dir, "interop.pcap")
	} else if dump, err = filepath.Abs(dump); err != nil {
		return err
	} else {
		res.Pcap = dump
	}
	role := "server"
	if f.reverse {
		role = "client"
	}
	fmt.Fprintf(stderr, "vrdma-vmtest: interop %s %s (rxe guest: perftest %s; vrdma GID index %d), booting the rxe guest (TCG)\n",
		job, res.Direction, role, dev.GIDIndex)
	out, err := lab.RunVrdma(ctx, dev, roceinterop.Guest{QEMU: o.qemuBin, Kernel: f.rxeKernel, Initrd: f.rxeInitrd,
		Role: role, Jobs: []roceinterop.Job{job}, Dump: dump})
	defer out.Close()
	res.GuestS = out.GuestTime.Seconds()
	res.Frames = len(out.Frames)
	res.Checks = out.Checks
	for _, r := range out.Runs {
		res.PeerVer = r.Version
		if !f.reverse {
			res.GbitsPerS = r.Gbits()
		}
	}
	for _, r := range out.Results {
		fmt.Fprintln(stderr, r.Line())
		if f.reverse {
			res.GbitsPerS = r.GBytesPerS * 8
		}
		res.LatUsP50 = r.LatP50
	}
	if err != nil || o.verbose {
		fmt.Fprint(stderr, out.GuestLog)
		if err != nil {
			fmt.Fprintf(stderr, "=== vrdmad log ===\n%s", d.Log())
		}
	}
	if err != nil {
		return err
	}
	res.Verified = len(out.Runs) == 1 && len(out.Checks) == 1
	res.CaptureOK = true // ReadCapture checked every ICRC
	if f.tshark != "" {
		if err := roceinterop.CheckTshark(f.tshark, dump, len(out.Frames)); err != nil {
			res.CaptureOK = false
			return err
		}
	}
	if job.Op == pftexchange.WriteLat && !f.reverse {
		// A ping-pong's rate says nothing; its half round trip is
		// perftest's latency.
		res.GbitsPerS = 0
		for _, r := range out.Runs {
			res.LatUsAvg = r.Elapsed.Seconds() * 1e6 / float64(2*job.Iters)
		}
	}
	return nil
}
