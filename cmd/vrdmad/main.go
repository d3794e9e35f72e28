// Command vrdmad is the vrdma host daemon: it serves para-virtual RDMA
// devices (virtio device ID 42) to QEMU over vhost-user, one unix socket per
// device.
//
// Usage:
//
//	vrdmad --socket [ID=]PATH [--socket …] [--control PATH] [--state-dir DIR]
//	       [--engine-threads N] [--engine-cpus LIST] [--roce-bind ADDR …]
//	       [--rnic soft|verbs:DEVICE[:PORT]]
//	       [--metrics ADDR] [--log-level info] [--log-format text|json]
//	vrdmad --socket-path=PATH | --fd=FDNUM [flags]
//	vrdmad --print-capabilities
//
// It follows the vhost-user backend program conventions (QEMU
// docs/interop/vhost-user.rst): --socket-path=PATH serves one device on
// PATH, --fd=FDNUM one device on a listening unix socket inherited as
// that descriptor, --print-capabilities prints {"type": "rdma",
// "features": [...]} (the optional flags) and exits. It does not
// daemonize and ends on SIGTERM.
//
// Under systemd it takes sockets by socket activation (LISTEN_FDS,
// LISTEN_FDNAMES: the one named "control" serves the control API, any
// other name is a device ID whose socket it is), reports READY=1 once
// every socket accepts connections, STOPPING=1 when it stops, and
// WATCHDOG=1 every half WATCHDOG_USEC when the unit sets WatchdogSec=
// (packaging/vrdmad.service, vrdmad.socket).
//
// Devices added through the control API are saved in --state-dir
// (devices.json) and come back with the same id, socket, uuid and GUID at
// the next start; devices given on the command line are not saved. An
// unusable state file is moved aside and vrdmad serves without its
// devices, degraded (GET /v1/health, vrdma_health_degraded, STATUS=)
// until an operator acknowledges it (vrdmactl daemon ack); a failed write
// of the state file makes it degraded until a write succeeds.
//
// Every control API request that changes something, and every refusal,
// is logged with the caller's uid and pid; each front-end connection with
// its peer's. Under systemd (JOURNAL_STREAM) each log line carries its
// journal priority. SIGHUP rewrites the state file from the devices
// served (nothing else is reloaded); SIGTERM and SIGINT stop vrdmad.
//
// Every device's doorbell queues are served by one pool of engine workers
// (package backend/rdma/sched): --engine-threads of them (default: one
// per CPU vrdmad may use), pinned to the CPUs of --engine-cpus when it is
// given. How the devices share the pool (weights, rate bounds) is set per
// device through the control API (PATCH /v1/devices/{id}).
//
// --roce-bind ADDR (repeatable) takes the devices off this host: vrdmad
// listens on UDP port 4791 of each host address given and carries RC QPs
// to peers on other hosts as RoCEv2 (docs/wire.md), which Linux rxe
// speaks too. Every device then has the GID of each address (IPv4-mapped
// for IPv4) at entries 1, 2, … of its GID table; a QP connected from one
// of them to a GID no device of this daemon owns goes out on the network.
// A device added through the control API may name its own addresses
// (roce_bind). --roce-paths N sprays each such QP over N paths (the
// multipath extension between vrdma hosts, docs/wire.md § 9) unless the QP
// asks for its own number (MODIFY_QP's PATHS); a peer that does not speak
// it gets plain RoCEv2.
//
// --rnic chooses what executes the devices' work: soft, the software RNIC
// embedded in vrdmad (it copies between guest memories, and over
// --roce-bind to other hosts), or verbs:DEVICE[:PORT], the host's RDMA NIC
// through rdma-core's libibverbs (loaded at run time, so hosts without it
// still run soft devices): guest QPs, CQs and MRs become the NIC's, guest
// memory is registered with it at the guest's own addresses, and the NIC
// moves the data (backend/rdma/hostnic, docs/operations.md). A device
// added through the control API may choose its own (rnic).
//
// --metrics serves Prometheus metrics on /metrics (see internal/metrics and
// docs/packaging.md). --help prints the usage on standard output; the
// manual page (packaging/man/vrdmad.8) must have an entry for each flag it
// lists (packaging/man_test.go).
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
	"strconv"
	"strings"
	"syscall"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/hostnic"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/backend/rdma/sched"
	"github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/metrics"
	"github.com/vrdma/vrdma/internal/units"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		code := exitCode(err)
		reportFatal(os.Stderr, os.Args[1:], err, code, underJournal())
		os.Exit(code)
	}
}

// exitCode is vrdmad's exit status for err: 2 for a command line it
// cannot run (a bad flag or value), 1 for a failure to serve.
func exitCode(err error) int {
	if errors.Is(err, cli.ErrUsage) {
		return cli.ExitUsage
	}
	return 1
}

// capabilitiesType is the vhost-user backend type --print-capabilities
// reports: the device's virtio name in lower case, as the convention
// names backends ("vhost-user-$device"). QEMU's vhost-user.json schema
// has no such type, which is why vrdma installs no
// /usr/share/qemu/vhost-user descriptor (docs/operations.md).
const capabilitiesType = "rdma"

// conventionFlags are the flags every vhost-user backend has by the
// convention; --print-capabilities lists the others as features.
var conventionFlags = map[string]bool{"socket-path": true, "fd": true, "print-capabilities": true, "version": true}

// capabilities is what --print-capabilities prints.
type capabilities struct {
	Type     string   `json:"type"`
	Features []string `json:"features"`
}

// wantsCapabilities reports whether args ask for --print-capabilities.
// The convention says other options and arguments are then ignored, so
// this looks before the flags are parsed (and checked).
func wantsCapabilities(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--print-capabilities", "-print-capabilities", "--print-capabilities=true", "-print-capabilities=true":
			return true
		}
	}
	return false
}

// flags are vrdmad's parsed command line.
type flags struct {
	fs           *flag.FlagSet
	sockets      stringList
	socketPath   string
	fd           int
	control      string
	stateDir     string
	level        string
	format       string
	doorbells    int
	pin          string
	mapCache     string
	maxPinned    string
	globalPinned string
	metricsAddr  string
	showVersion  bool
	printCaps    bool
	worldSocket  bool
	maxQPs       uint
	maxCQs       uint
	maxMRs       uint
	cmdRate      int
	sockOwner    string
	sockMode     string
	allowUIDs    string
	engineThr    int
	engineCPUs   string
	roceBind     stringList
	addresses    stringList
	rocePaths    int
	rnic         string
	fdstore      bool

	// cmdSockets are the devices of --socket and --socket-path, checked
	// (check).
	cmdSockets []cmdSocket
}

// defaultStateDir is --state-dir's default.
const defaultStateDir = "/var/lib/vrdma"

func newFlags() *flags {
	f := &flags{fs: cli.New("vrdmad")}
	fs := f.fs
	fs.Var(&f.sockets, "socket", "serve a device on this unix socket `PATH` (repeatable: one device per socket; \"ID=PATH\" names the device)")
	fs.StringVar(&f.socketPath, "socket-path", "", "serve one device on the unix socket `PATH`, as --socket PATH does (vhost-user backend convention; not with --fd)")
	fs.IntVar(&f.fd, "fd", -1, "serve one device on the listening unix socket inherited as file descriptor `FDNUM` (vhost-user backend convention; not with --socket-path)")
	fs.BoolVar(&f.printCaps, "print-capabilities", false, "print the vhost-user backend capabilities as JSON and exit")
	fs.StringVar(&f.control, "control", "", "serve the HTTP/JSON control API on this unix socket `PATH` (with socket activation: the socket named \"control\")")
	fs.StringVar(&f.stateDir, "state-dir", defaultStateDir, "keep the devices added through the control API in `DIR`/devices.json so that they come back after a restart (\"\": keep none)")
	fs.StringVar(&f.level, "log-level", "info", "the `LEVEL` of the log: debug, info, warn, error")
	fs.StringVar(&f.format, "log-format", "text", "the `FORMAT` of the log: text or json")
	fs.IntVar(&f.doorbells, "doorbell-queues", 1, "doorbell queues per device, one per guest vCPU (0 … 256; 0: 1)")
	fs.StringVar(&f.pin, "pin", "on-demand", "guest memory pinning `MODE`: on-demand (PVDMA: pin what the guest registers) or all (pin all guest memory at start, the VFIO/SR-IOV baseline)")
	fs.StringVar(&f.mapCache, "map-cache", "256M", "`SIZE` of the released pins kept per device (map cache) so that re-registration is cheap")
	fs.StringVar(&f.maxPinned, "max-pinned", "0", "per-device quota of pinned bytes, `SIZE` such as 8G (0: none; else 2M … 256T)")
	fs.StringVar(&f.globalPinned, "global-max-pinned", "0", "bound on the pinned bytes of all devices together, `SIZE` (0: none; else 2M … 256T)")
	fs.StringVar(&f.metricsAddr, "metrics", "", "serve Prometheus metrics on /metrics at `ADDR`: host:port (TCP; bind to loopback or a management network) or unix:PATH")
	fs.BoolVar(&f.showVersion, "version", false, "print the version and exit")
	fs.BoolVar(&f.fdstore, "fdstore", false, "under systemd, on SIGTERM keep every device for the next start in the service's file-descriptor store (FileDescriptorStoreMax=): systemctl restart vrdmad then keeps the guests' QPs (docs/state.md)")
	fs.UintVar(&f.maxQPs, "max-qps", 0, "per-device limit of QPs, 1 … 65536 (0: the built-in default, 1024)")
	fs.UintVar(&f.maxCQs, "max-cqs", 0, "per-device limit of CQs, 1 … 65536 (0: the built-in default, 1024)")
	fs.UintVar(&f.maxMRs, "max-mrs", 0, "per-device limit of MRs, 1 … 1048576 (0: the built-in default, 4096)")
	fs.IntVar(&f.cmdRate, "max-commands-per-sec", 0, "per-device bound on control commands per second; beyond it commands answer QUOTA (0: none)")
	fs.StringVar(&f.sockOwner, "socket-owner", "", "owner of the device sockets, `USER[:GROUP]` or :GROUP (QEMU's user or group, e.g. libvirt-qemu:kvm or :kvm)")
	fs.StringVar(&f.sockMode, "socket-mode", "0600", "permission bits of the device sockets, an octal `MODE` (at least 0600; 0660 gives them to --socket-owner's group; any bit for others needs --allow-world-socket)")
	fs.BoolVar(&f.worldSocket, "allow-world-socket", false, "let --socket-mode give others (every local user) access to the device sockets: whoever connects first gets the device and the guest memory QEMU shares with it")
	fs.StringVar(&f.allowUIDs, "allow-uid", "", "comma-separated `UIDS` allowed to connect to device sockets (SO_PEERCRED); empty: anyone who can open them")
	fs.Var(&f.addresses, "address", "assign the command-line devices (--socket, --socket-path, --fd, socket activation) this IP `ADDR`ess or PREFIX, whose GIDs their guests' drivers may then add (repeatable; \"ID=ADDR\" assigns it to device ID alone; without any a device holds only its port GID)")
	fs.Var(&f.roceBind, "roce-bind", "carry RDMA traffic to other hosts as RoCEv2 on UDP port 4791 of this host `ADDR`ess (repeatable, IPv4 or IPv6; each address's GID joins every device's GID table)")
	fs.IntVar(&f.rocePaths, "roce-paths", 1, "spray each QP to another host over `N` paths (1 … 64; the multipath extension, negotiated with the peer: rxe peers get plain RoCEv2) unless the QP says otherwise; paths go between the device's --roce-bind addresses and the peer's")
	fs.StringVar(&f.rnic, "rnic", "soft", "the `RNIC` that executes the devices' work unless one says otherwise (the control API's rnic): soft (the embedded software RNIC) or verbs:DEVICE[:PORT] (the host's RDMA NIC through rdma-core's libibverbs, e.g. verbs:mlx5_0 or verbs:rxe0:1: guest memory is registered with the NIC at the guest's addresses and the NIC moves the data)")
	fs.IntVar(&f.engineThr, "engine-threads", 0, "engine workers serving the doorbell queues of all devices (0: one per CPU of --engine-cpus, else one per CPU vrdmad may use)")
	fs.StringVar(&f.engineCPUs, "engine-cpus", "", "pin the engine workers to these CPUs, a `LIST` such as 2,3 or 2-5 (worker i on the i-th CPU, round robin); each must be in vrdmad's affinity mask (default: not pinned)")
	return f
}

// printCapabilities writes the --print-capabilities JSON: the backend
// type and, as features, every optional flag (the convention's own flags
// are implied), in the shape of QEMU's VHostUserBackendCapabilities.
func (f *flags) printCapabilities(w io.Writer) error {
	c := capabilities{Type: capabilitiesType, Features: []string{}}
	f.fs.VisitAll(func(fl *flag.Flag) {
		if !conventionFlags[fl.Name] {
			c.Features = append(c.Features, fl.Name)
		}
	})
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func (f *flags) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: vrdmad --socket [ID=]PATH [--socket ...] [flags]\n"+
		"       vrdmad --socket-path=PATH | --fd=FDNUM [flags]\n"+
		"       vrdmad --print-capabilities\n\n"+
		"vrdmad serves para-virtual RDMA devices (virtio device ID 42) to QEMU over vhost-user.\n"+
		"Attach one to a VM with:\n"+
		"  -chardev socket,id=vrdma0,path=PATH -device vhost-user-rdma-pci,chardev=vrdma0\n"+
		"(the QEMU of the package vrdma-qemu; with --doorbell-queues N, add num_vqs=N+2)\n\nOptions:\n")
	cli.PrintDefaults(w, f.fs)
	fmt.Fprintf(w, "\nExit status: 0 after a clean stop (SIGTERM, SIGINT), 1 when it cannot serve,\n"+
		"2 for a command line it cannot run.\n")
	fmt.Fprintf(w, "\nSignals: SIGTERM and SIGINT stop vrdmad cleanly. SIGHUP (systemctl reload vrdmad)\n"+
		"rewrites the state file from the devices served; nothing else is reloaded.\n")
	fmt.Fprintf(w, "\nExamples:\n"+
		"  vrdmad --control /run/vrdma/control.sock --socket vm1=/run/vrdma/vm1.sock\n"+
		"  vrdmad --control /run/vrdma/control.sock --metrics 127.0.0.1:9464\n"+
		"  vrdmad --control /run/vrdma/control.sock --engine-threads 2 --engine-cpus 2-3\n"+
		"  vrdmad --socket-path=/run/vrdma/vm1.sock --state-dir ''\n\n"+
		"Devices added through the control API are kept in --state-dir and come back\n"+
		"after a restart; devices given with --socket, --socket-path or --fd are not.\n\n"+
		"Under systemd, vrdmad.socket hands vrdmad the control socket (socket activation:\n"+
		"the socket named \"control\"; any other FileDescriptorName= is a device ID) and\n"+
		"vrdmad.service (Type=notify) runs it with the flags of VRDMAD_ARGS in\n"+
		"/etc/default/vrdmad; see /usr/share/doc/vrdma/docs/packaging.md.\n")
}

func run(args []string, stdout io.Writer) error {
	f := newFlags()
	if wantsCapabilities(args) {
		return f.printCapabilities(stdout)
	}
	// Parse errors are returned (and printed once by main); --help goes to
	// standard output.
	if err := cli.Parse(f.fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage(stdout)
			return nil
		}
		return cli.Usagef("%v (see vrdmad --help)", err)
	}
	if f.showVersion {
		fmt.Fprintln(stdout, cli.VersionLine("vrdmad"))
		return nil
	}
	if err := f.check(); err != nil {
		return err
	}
	dcfg, err := f.daemonConfig()
	if err != nil {
		return cli.Usagef("%w", err)
	}
	log := logrus.New()
	lv, err := logrus.ParseLevel(f.level)

	if err != nil {
		return cli.Usagef("--log-level: %w", err)
	}
	log.SetLevel(lv)
	switch f.format {
	case "text":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return cli.Usagef("--log-format %q: want text or json", f.format)
	}
	if underJournal() {
		log.SetFormatter(priorityFormatter{log.Formatter})
	}
	entry := logrus.NewEntry(log)
	// SIGTERM and SIGINT are ours before any socket serves: a supervisor
	// that stops vrdmad as soon as the control API answers must get a
	// clean shutdown, not the default action.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP too: its default action would end vrdmad without a clean
	// stop (serveUntilStopped answers it).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	raiseNofile(entry)

	allowed, err := affinity()
	if err != nil {
		return err
	}
	ecfg, err := engineConfig(f.engineThr, f.engineCPUs, allowed)
	if err != nil {
		return cli.Usagef("%w", err)
	}

	// A live upgrade's new process (vrdmactl daemon upgrade): its
	// descriptors are the old process's, from 3 on, and its devices come
	// with them, not from the command line or the state file.
	in, err := daemon.ReceiveHandover()
	if err != nil {
		return fmt.Errorf("taking over from the running vrdmad: %w", err)
	}
	if in != nil {
		entry.WithFields(logrus.Fields{"from_pid": in.H.From.PID, "from_version": in.H.From.Version,
			"devices": len(in.H.Devices), "state_bytes": in.Bytes}).Info("taking over from the running vrdmad")
	}
	// Inherited sockets first: nothing else may take their descriptor
	// numbers. Until a daemon owns them, they are closed on every error.
	inh := &inherited{}
	if in == nil {
		if inh, err = inheritSockets(f); err != nil {
			return err
		}
	}
	defer inh.closeRest()
	if in == nil && len(f.sockets) == 0 && f.socketPath == "" && f.control == "" && len(inh.devices) == 0 && inh.control == nil && inh.fd == nil {
		return cli.Usagef("nothing to serve: give --socket, --socket-path, --fd or --control (or start vrdmad by socket activation)")
	}
	if inh.control != nil && f.control != "" && f.control != inh.control.Addr().String() {
		return fmt.Errorf("--control %s: the socket-activated control socket is %s; give neither or the same path", f.control, inh.control.Addr())
	}

	roceAddrs, err := udp.ParseHostAddrs(f.roceBind)
	if err != nil {
		return cli.Usagef("--roce-bind: %w", err)
	}
	checkMemlock(entry, dcfg)
	// The RoCE network: its endpoints close after the devices.
	roceNet, err := hostnet.New(udp.Config{RecoverIPv4ID: true, Logger: entry.WithField("component", "roce")}, f.rocePaths)
	if err != nil {
		return fmt.Errorf("--roce-paths: %w", err)
	}
	defer roceNet.Close()
	if in != nil {
		if st, fds := in.RoCE(); st != nil {
			if err := roceNet.Adopt(st, fds); err != nil {
				return in.Refuse(fmt.Errorf("RoCE network: %w", err))
			}
		}
	}
	for _, a := range roceAddrs {
		e, err := roceNet.Listen(a)
		if err != nil {
			return fmt.Errorf("--roce-bind %s: %w", a, err)
		}
		entry.WithField("roce", e.LocalAddr().String()).Info("RoCEv2 endpoint listening")
	}
	dcfg.RoCE, dcfg.RoCEAddrs = roceNet, roceAddrs
	// A host NIC is opened now: one that cannot be is an error at start,
	// naming what is missing, not at the first device.
	rs, err := hostnic.ParseSpec(f.rnic)
	if err != nil {
		return cli.Usagef("--rnic: %w", err)
	}
	if rs.Verbs {
		if _, err := hostnic.Open(rs, entry); err != nil {
			return fmt.Errorf("--rnic: %w", err)
		}
	}
	dcfg.RNIC = rs.String()
	// One engine pool for every device; closed after the devices.
	pool, err := sched.New(ecfg)
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	defer pool.Close()
	dcfg.Pool = pool
	engineLog := entry.WithField("engine_threads", pool.Workers())
	if len(ecfg.CPUs) > 0 {
		engineLog = engineLog.WithField("engine_cpus", formatCPUList(ecfg.CPUs))
	}
	engineLog.Info("engine pool started")
	// fail closes the daemon; the deferred pool.Close runs after it.
	dcfg.OnHandover = func(pid int) { notify(entry, "MAINPID="+strconv.Itoa(pid)) }
	d := daemon.New(entry, dcfg)
	fail := func(err error) error {
		d.Close()
		return err
	}
	if in != nil {
		return takeOver(ctx, entry, f, d, in, hup)
	}
	var saved []daemon.DeviceSpec
	if f.stateDir != "" {
		dir, err := filepath.Abs(f.stateDir)
		if err != nil {
			return fail(fmt.Errorf("--state-dir: %w", err))
		}
		if saved, err = d.OpenState(dir); err != nil {
			return fail(err)
		}
	} else {
		log.Warn("--state-dir is empty: devices added through the control API are forgotten when vrdmad exits")
	}

	// Command-line and inherited devices, then the saved ones: a saved
	// device that collides with one of them is an error that names it.
	assigned, err := parseAssigned(f.addresses)
	if err != nil {
		return fail(err)
	}
	used := make(map[string]bool)
	devCfg := func(id string) rdma.Config {
		used[id] = true
		return rdma.Config{ID: id, DoorbellQueues: f.doorbells, AllowedGIDs: assigned.of(id)}
	}
	for _, cs := range f.cmdSockets {
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: cs.id, Socket: cs.path, Device: devCfg(cs.id)}); err != nil {
			return fail(fmt.Errorf("%s: %w", cs.flag, err))
		}
	}
	if ln := inh.takeFD(); ln != nil {
		id := socketID(ln.Addr().String(), len(f.cmdSockets))
		if used[id] {
			ln.Close()
			return fail(cli.Usagef("--fd %d: device ID %q, taken from the socket's name %s, is a --socket device's too", f.fd, id, ln.Addr()))
		}
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: id, Listener: ln, Device: devCfg(id)}); err != nil {
			return fail(fmt.Errorf("--fd %d: %w", f.fd, err))
		}
	}
	for _, nl := range inh.takeDevices() {
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: nl.Name, Listener: nl.Listener, Device: devCfg(nl.Name)}); err != nil {
			return fail(fmt.Errorf("socket-activated device %s (fd %d): %w", nl.Name, nl.FD, err))
		}
	}
	for _, id := range assigned.named() {
		if !used[id] {
			return fail(fmt.Errorf("--address %s=…: no device %q on the command line (devices of the control API get theirs with it)", id, id))
		}
	}
	if err := d.Restore(saved); err != nil {
		return fail(err)
	}

	if ln := inh.takeControl(); ln != nil {
		if err := d.ServeControlListener(ln); err != nil {
			return fail(err)
		}
		log.WithField("socket", ln.Addr().String()).Info("control API on the socket-activated control socket")
	} else if f.control != "" {
		if err := d.ServeControl(f.control); err != nil {
			return fail(err)
		}
	}
	var ms *metrics.Server
	if f.metricsAddr != "" {
		ms, err = metrics.Listen(f.metricsAddr, metrics.DaemonSource{D: d, GlobalMaxPinned: dcfg.GlobalMaxPinned}, entry)
		if err != nil {
			return fail(fmt.Errorf("--metrics: %w", err))
		}
		d.SetMetricsListener(ms.Listener())
	}
	return serve(ctx, entry, d, ms, hup, len(saved), f.fdstore)
}

// serve runs a daemon whose sockets all serve until it is stopped or has
// handed over to a new process.
func serve(ctx context.Context, entry *logrus.Entry, d *daemon.Daemon, ms *metrics.Server, hup <-chan os.Signal, restored int, fdstore bool) error {
	log := entry.Logger
	// Every socket now exists and listens, and its server runs: tell the
	// service manager (Type=notify) that vrdmad is ready.
	n := len(d.Devices())
	log.WithFields(logrus.Fields{"devices": n, "restored": restored}).Info("vrdmad serving")
	status := statusLine(d.Health())
	notify(entry, sddaemon.SdNotifyReady+"\nSTATUS="+status)
	wdDone := make(chan struct{})
	go func() {
		defer close(wdDone)
		watchdog(ctx, entry, d)
	}()

	serveUntilStopped(ctx, entry, d, hup, status)
	if fdstore && ctx.Err() != nil && handOverToStore(entry, d) {
		os.Exit(0)
	}
	select {
	case <-d.HandedOver():
		// Everything this process held is the new one's now: exit
		// without closing, unlinking, unpinning or resetting anything.
		log.Info("handed over: exiting")
		os.Exit(0)
	default:
	}
	log.Info("shutting down")
	notify(entry, sddaemon.SdNotifyStopping+"\nSTATUS=stopping")
	<-wdDone
	var errs []error
	if ms != nil {
		errs = append(errs, ms.Close())
	}
	// The devices go first (d.Close), then the deferred pool.Close stops
	// the engine workers none of them uses any more.
	return errors.Join(append(errs, d.Close())...)
}

// daemonConfig turns the flags into the daemon's configuration.
func (f *flags) daemonConfig() (daemon.Config, error) {
	var dcfg daemon.Config
	switch f.pin {
	case "on-demand":
	case "all":
		dcfg.Pin.All = true
	default:
		return dcfg, fmt.Errorf("--pin %q: want on-demand or all", f.pin)
	}
	for _, b := range []struct {
		name string
		v    string
		dst  *uint64
	}{{"map-cache", f.mapCache, &dcfg.Pin.CacheBytes}, {"max-pinned", f.maxPinned, &dcfg.Pin.MaxPinned}, {"global-max-pinned", f.globalPinned, &dcfg.GlobalMaxPinned}} {
		n, err := units.ParseBytes(b.v)
		if err != nil {
			return dcfg, fmt.Errorf("--%s: %w", b.name, err)
		}
		*b.dst = n
	}
	// The API's limits rule, one function for both (daemon.CheckLimits).
	var err error
	if dcfg.Limits, dcfg.Pin.MaxPinned, err = daemon.CheckLimits(uint64(f.maxQPs), uint64(f.maxCQs), uint64(f.maxMRs), dcfg.Pin.MaxPinned); err != nil {
		return dcfg, flagError(err)
	}
	if err := daemon.CheckPinnedBytes("global_max_pinned", dcfg.GlobalMaxPinned); err != nil {
		return dcfg, cli.Usagef("--global-max-pinned: %s", reason(err))
	}
	dcfg.MaxCommandsPerSec = f.cmdRate
	dcfg.Socket, err = socketConfig(f.sockMode, f.sockOwner, f.allowUIDs, f.worldSocket)
	return dcfg, err
}
