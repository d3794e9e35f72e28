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
	"os/user"
	"path/filepath"
	"strconv"
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
	maxQPs := fs.Uint("max-qps", 0, "per-device limit of QPs (0: the built-in default, 1024)")
	maxCQs := fs.Uint("max-cqs", 0, "per-device limit of CQs (0: the built-in default, 1024)")
	maxMRs := fs.Uint("max-mrs", 0, "per-device limit of MRs (0: the built-in default, 4096)")
	cmdRate := fs.Int("max-commands-per-sec", 0, "per-device bound on control commands per second; beyond it commands answer QUOTA (0: none)")
	sockOwner := fs.String("socket-owner", "", "owner of the device sockets, `USER[:GROUP]` (QEMU's user, e.g. libvirt-qemu:kvm)")
	sockMode := fs.String("socket-mode", "0600", "permission bits of the device sockets (octal)")
	allowUIDs := fs.String("allow-uid", "", "comma-separated uids allowed to connect to device sockets (SO_PEERCRED); empty: anyone who can open them")
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
	dcfg.Limits = rdma.Limits{MaxQP: uint32(*maxQPs), MaxCQ: uint32(*maxCQs), MaxMR: uint32(*maxMRs)}
	if *cmdRate < 0 {
		return fmt.Errorf("--max-commands-per-sec %d: want 0 or more", *cmdRate)
	}
	dcfg.MaxCommandsPerSec = *cmdRate
	if dcfg.Socket, err = socketConfig(*sockMode, *sockOwner, *allowUIDs); err != nil {
		return err
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

// socketConfig parses the socket flags.
func socketConfig(mode, owner, allow string) (daemon.SocketConfig, error) {
	var sc daemon.SocketConfig
	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || m > 0o777 || m&0o600 != 0o600 {
		return sc, fmt.Errorf("--socket-mode %q: want octal permission bits including 0600", mode)
	}
	sc.Mode = os.FileMode(m)
	if owner != "" {
		name, group, _ := strings.Cut(owner, ":")
		u, err := user.Lookup(name)
		if err != nil {
			return sc, fmt.Errorf("--socket-owner: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if group != "" {
			g, err := user.LookupGroup(group)
			if err != nil {
				return sc, fmt.Errorf("--socket-owner: %w", err)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
		sc.Owner = &backend.Owner{UID: uid, GID: gid}
	}
	for _, f := range strings.Split(allow, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		uid, err := strconv.ParseUint(f, 10, 32)
		if err != nil {
			return sc, fmt.Errorf("--allow-uid %q: want numeric uids", f)
		}
		sc.AllowUIDs = append(sc.AllowUIDs, uint32(uid))
	}
	return sc, nil
}

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
