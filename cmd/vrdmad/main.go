// Command vrdmad is the vrdma host daemon: it serves para-virtual RDMA
// devices (virtio device ID 42) to QEMU over vhost-user, one unix socket per
// device.
//
// Usage:
//
//	vrdmad --socket /run/vrdma/vm1.sock [--socket …] [--control PATH]
//	       [--metrics ADDR] [--log-level info] [--log-format text|json]
//
// --metrics serves Prometheus metrics on /metrics (see internal/metrics and
// docs/packaging.md). --help prints the usage on standard output, in a form
// help2man turns into the manual page.
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

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/metrics"
	"github.com/vrdma/vrdma/internal/units"
	"golang.org/x/sys/unix"
)

// version is set at link time (-ldflags "-X main.version=…") by
// scripts/deb.sh.
var version = "devel"

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vrdmad:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("vrdmad", flag.ContinueOnError)
	var sockets stringList
	fs.Var(&sockets, "socket", "serve a device on this unix socket `PATH` (repeatable: one device per socket; \"ID=PATH\" names the device)")
	control := fs.String("control", "", "serve the HTTP/JSON control API on this unix socket `PATH`")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	format := fs.String("log-format", "text", "log format: text or json")
	doorbells := fs.Int("doorbell-queues", 1, "doorbell queues per device (one per guest vCPU)")
	pin := fs.String("pin", "on-demand", "guest memory pinning: on-demand (PVDMA: pin what the guest registers) or all (pin all guest memory at start, the VFIO/SR-IOV baseline)")
	mapCache := fs.String("map-cache", "256M", "bytes of released pins kept per device (map cache) so re-registration is cheap")
	maxPinned := fs.String("max-pinned", "0", "per-device quota of pinned bytes (0: none)")
	globalPinned := fs.String("global-max-pinned", "0", "bound on the pinned bytes of all devices together (0: none)")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics on /metrics at `ADDR`: host:port (TCP; bind to loopback or a management network) or unix:PATH")
	showVersion := fs.Bool("version", false, "print the version and exit")
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: vrdmad --socket PATH [--socket PATH ...] [flags]\n\n"+
			"vrdmad serves para-virtual RDMA devices (virtio device ID 42) to QEMU over vhost-user.\n"+
			"Attach one to a VM with:\n"+
			"  -chardev socket,id=vrdma0,path=PATH -device vhost-user-device-pci,chardev=vrdma0,\n"+
			"     virtio-id=42,num_vqs=3,vq_size=256,config_size=96\n\nOptions:\n")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		fmt.Fprintf(w, "\nExamples:\n"+
			"  vrdmad --control /run/vrdma/control.sock --socket vm1=/run/vrdma/vm1.sock\n"+
			"  vrdmad --control /run/vrdma/control.sock --metrics 127.0.0.1:9464\n\n"+
			"Under systemd, vrdmad.service runs vrdmad with the flags of VRDMAD_ARGS in\n"+
			"/etc/default/vrdmad; see /usr/share/doc/vrdma/packaging.md.\n")
	}
	// Parse errors are returned (and printed once by main); --help goes to
	// standard output.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(os.Stdout)
			return nil
		}
		return fmt.Errorf("%w (see vrdmad --help)", err)
	}
	if *showVersion {
		fmt.Println("vrdmad", version)
		return nil
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	log := logrus.New()
	lv, err := logrus.ParseLevel(*level)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log.SetLevel(lv)
	switch *format {
	case "text":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return fmt.Errorf("--log-format %q: want text or json", *format)
	}
	if len(sockets) == 0 && *control == "" {
		return errors.New("nothing to serve: give at least one --socket (or --control)")
	}

	var dcfg daemon.Config
	switch *pin {
	case "on-demand":
	case "all":
		dcfg.Pin.All = true
	default:
		return fmt.Errorf("--pin %q: want on-demand or all", *pin)
	}
	for _, f := range []struct {
		name string
		v    string
		dst  *uint64
	}{{"map-cache", *mapCache, &dcfg.Pin.CacheBytes}, {"max-pinned", *maxPinned, &dcfg.Pin.MaxPinned}, {"global-max-pinned", *globalPinned, &dcfg.GlobalMaxPinned}} {
		n, err := units.ParseBytes(f.v)
		if err != nil {
			return fmt.Errorf("--%s: %w", f.name, err)
		}
		*f.dst = n
	}
	checkMemlock(logrus.NewEntry(log), dcfg)
	d := daemon.New(logrus.NewEntry(log), dcfg)
	for i, s := range sockets {
		id, path, ok := strings.Cut(s, "=")
		if !ok {
			path = s
			id = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
			if id == "" {
				id = fmt.Sprintf("vrdma%d", i)
			}
		}
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: id, Socket: path, Device: rdma.Config{ID: id, DoorbellQueues: *doorbells}}); err != nil {
			d.Close()
			return err
		}
	}
	if *control != "" {
		if err := d.ServeControl(*control); err != nil {
			d.Close()
			return err
		}
	}
	var ms *metrics.Server
	if *metricsAddr != "" {
		ms, err = metrics.Listen(*metricsAddr, metrics.DaemonSource{D: d}, logrus.NewEntry(log))
		if err != nil {
			d.Close()
			return fmt.Errorf("--metrics: %w", err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.WithField("devices", len(sockets)).Info("vrdmad serving")
	<-ctx.Done()
	log.Info("shutting down")
	var errs []error
	if ms != nil {
		errs = append(errs, ms.Close())
	}
	return errors.Join(append(errs, d.Close())...)
}

var _ backend.Device = (*rdma.Device)(nil)

// checkMemlock warns when RLIMIT_MEMLOCK is below what the configured pins
// may need: pinning then fails with a QUOTA status at REG_MR time, which
// is hard to trace back to a systemd unit's LimitMEMLOCK.
func checkMemlock(log *logrus.Entry, cfg daemon.Config) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil || lim.Cur == unix.RLIM_INFINITY {
		return
	}
	need := cfg.GlobalMaxPinned
	if need == 0 {
		need = cfg.Pin.MaxPinned
	}
	switch {
	case cfg.Pin.All && os.Geteuid() != 0:
		log.Warnf("--pin=all with RLIMIT_MEMLOCK of %d bytes: guests larger than that cannot start; raise LimitMEMLOCK (systemd) or ulimit -l", lim.Cur)
	case need == 0 && os.Geteuid() != 0:
		log.Warnf("RLIMIT_MEMLOCK is %d bytes and pins are unbounded: registrations beyond it will fail; raise LimitMEMLOCK or set --max-pinned", lim.Cur)
	case need > lim.Cur && os.Geteuid() != 0:
		log.Warnf("RLIMIT_MEMLOCK (%d bytes) is below the configured pin bound (%d bytes)", lim.Cur, need)
	}
}
