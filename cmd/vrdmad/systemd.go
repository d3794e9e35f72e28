package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	sddaemon "github.com/coreos/go-systemd/v22/daemon"
	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/daemon"
	"golang.org/x/sys/unix"
)

// Host integration: sockets inherited from systemd (socket activation),
// readiness and watchdog notifications, resource limits, socket modes.

// inherited holds the listening sockets vrdmad was started with (--fd,
// socket activation) until the daemon takes them; closeRest closes what
// it did not take.
type inherited struct {
	fd      *net.UnixListener
	control *net.UnixListener
	devices []daemon.NamedListener
}

// inheritSockets checks and takes the sockets of --fd and of socket
// activation. A socket-activated socket named "control" serves the
// control API; any other name must be a device ID (FileDescriptorName=
// in its .socket unit). Names systemd gives by default (the unit's name)
// are refused, so a forgotten FileDescriptorName= is an error, not a
// device called "vrdmad.socket".
func inheritSockets(f *flags) (*inherited, error) {
	inh := &inherited{}
	act, err := daemon.ActivationListeners()
	if err != nil {
		return nil, err
	}
	// Until the loop below is done, act holds every activated socket
	// (inh a subset of them); after it, inh holds them all.
	fail := func(err error) (*inherited, error) {
		if act != nil {
			for _, nl := range act {
				nl.Listener.Close()
			}
			*inh = inherited{}
		}
		inh.closeRest()
		return nil, err
	}
	ids := map[string]int{}
	for _, nl := range act {
		switch {
		case nl.Name == "control":
			if inh.control != nil {
				return fail(fmt.Errorf("socket activation: two sockets named control (fd %d and another)", nl.FD))
			}
			inh.control = nl.Listener
		case strings.HasSuffix(nl.Name, ".socket") || strings.HasPrefix(nl.Name, "LISTEN_FD_"):
			return fail(fmt.Errorf("socket activation: fd %d is named %q: set FileDescriptorName= in its .socket unit to control or to a device ID", nl.FD, nl.Name))
		default:
			if err := daemon.CheckID(nl.Name); err != nil {
				return fail(fmt.Errorf("socket activation: fd %d: FileDescriptorName %q is not a device ID: %w", nl.FD, nl.Name, err))
			}
			if prev, ok := ids[nl.Name]; ok {
				return fail(fmt.Errorf("socket activation: fd %d and fd %d are both named %q", prev, nl.FD, nl.Name))
			}
			ids[nl.Name] = nl.FD
			inh.devices = append(inh.devices, nl)
		}
	}
	act = nil // owned by inh from here
	if f.fd >= 0 {
		for _, nl := range inh.devices {
			if nl.FD == f.fd {
				return fail(fmt.Errorf("--fd %d is socket-activated device %s's descriptor", f.fd, nl.Name))
			}
		}
		ln, err := daemon.InheritFD(f.fd)
		if err != nil {
			return fail(fmt.Errorf("--fd: %w", err))
		}
		inh.fd = ln
	}
	return inh, nil
}

func (inh *inherited) takeFD() *net.UnixListener {
	ln := inh.fd
	inh.fd = nil
	return ln
}

func (inh *inherited) takeControl() *net.UnixListener {
	ln := inh.control
	inh.control = nil
	return ln
}

func (inh *inherited) takeDevices() []daemon.NamedListener {
	d := inh.devices
	inh.devices = nil
	return d
}

func (inh *inherited) closeRest() {
	if inh == nil {
		return
	}
	if inh.fd != nil {
		inh.fd.Close()
	}
	if inh.control != nil {
		inh.control.Close()
	}
	for _, nl := range inh.devices {
		nl.Listener.Close()
	}
	*inh = inherited{}
}

// notify sends state to the service manager (sd_notify); without
// NOTIFY_SOCKET (not under systemd's Type=notify) it does nothing. It
// never waits long (daemon.NotifyWithFDs): a manager that does not read
// its socket loses the message rather than stop the daemon.
func notify(log *logrus.Entry, state string) {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		return
	}
	if err := daemon.NotifyWithFDs(state); err != nil {
		log.WithError(err).Warn("sd_notify")
	}
}

// watchdog sends WATCHDOG=1 every half of the unit's WatchdogSec= until
// ctx ends, as long as the daemon answers: a ping waits for the device
// set's lock, so a daemon stuck on it stops pinging and systemd restarts
// it. Without a watchdog (no WATCHDOG_USEC for this process) it returns
// at once.
func watchdog(ctx context.Context, log *logrus.Entry, d *daemon.Daemon) {
	interval, err := sddaemon.SdWatchdogEnabled(false)
	if err != nil {
		log.WithError(err).Warn("watchdog settings")
		return
	}
	if interval <= 0 {
		return
	}
	period := interval / 2
	log.WithField("interval", interval).Info("systemd watchdog enabled")
	t := time.NewTicker(period)
	defer t.Stop()
	var inFlight atomic.Bool
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !inFlight.CompareAndSwap(false, true) {
			log.Error("daemon unresponsive: watchdog ping withheld")
			continue
		}
		answered := make(chan struct{})
		go func() {
			d.Devices() // takes the daemon's lock
			inFlight.Store(false)
			close(answered)
		}()
		select {
		case <-answered:
			notify(log, sddaemon.SdNotifyWatchdog)
		case <-time.After(period):
			log.Error("daemon unresponsive: watchdog ping withheld")
		case <-ctx.Done():
			return
		}
	}
}

// raiseNofile lifts the soft RLIMIT_NOFILE to the hard limit: a connected
// device holds 11 descriptors (its listening and connected sockets, the
// backend channel, a kick and an error eventfd per queue, a call eventfd
// per queue that interrupts; memory regions are closed once mapped:
// backend/doc.go, "Cost of a device"). (The Go runtime raises it too at start-up;
// this makes the limit vrdmad runs with explicit in its log.)
func raiseNofile(log *logrus.Entry) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		log.WithError(err).Warn("RLIMIT_NOFILE")
		return
	}
	if lim.Cur < lim.Max {
		old := lim.Cur
		lim.Cur = lim.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			log.WithError(err).Warnf("raise RLIMIT_NOFILE from %d to %d", old, lim.Max)
			return
		}
		log.Infof("RLIMIT_NOFILE soft limit raised from %d to the hard limit %d", old, lim.Max)
		return
	}
	log.WithField("limit", lim.Cur).Info("RLIMIT_NOFILE soft limit is the hard limit")
	if lim.Cur < 65536 {
		log.Warnf("RLIMIT_NOFILE is %d: each connected VM holds several descriptors per device; raise LimitNOFILE", lim.Cur)
	}
}

var _ backend.Device = (*rdma.Device)(nil)

// socketConfig parses the socket flags. A mode with any bit for others
// needs world (--allow-world-socket): a device socket is the device, and
// its first front-end gets the guest memory QEMU shares with it.
func socketConfig(mode, owner, allow string, world bool) (daemon.SocketConfig, error) {
	var sc daemon.SocketConfig
	m, err := strconv.ParseUint(mode, 8, 32)
	if err != nil || m > 0o777 || m&0o600 != 0o600 {
		return sc, fmt.Errorf("--socket-mode %q: want octal permission bits including 0600", mode)
	}
	if m&0o007 != 0 && !world {
		return sc, fmt.Errorf("--socket-mode %s lets every local user connect to the device sockets (a front-end that connects first gets the device); use 0660 with --socket-owner :GROUP, or add --allow-world-socket to mean it", mode)
	}
	sc.Mode = os.FileMode(m)
	if owner != "" {
		name, group, _ := strings.Cut(owner, ":")
		uid, gid := -1, -1 // ":GROUP" leaves the owner as it is
		if name == "" && group == "" {
			return sc, fmt.Errorf("--socket-owner %q: want USER[:GROUP] or :GROUP", owner)
		}
		if name != "" {
			u, err := user.Lookup(name)
			if err != nil {
				return sc, fmt.Errorf("--socket-owner: %w", err)
			}
			uid, _ = strconv.Atoi(u.Uid)
			gid, _ = strconv.Atoi(u.Gid)
		}
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
// is hard to trace back to a systemd unit's LimitMEMLOCK. A process with
// CAP_IPC_LOCK in its effective set is not bound by the limit (mlock(2)),
// so it gets no warning: vrdmad.service grants the capability.
func checkMemlock(log *logrus.Entry, cfg daemon.Config) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		return
	}
	capable, err := hasCapIPCLock()
	if err != nil {
		log.WithError(err).Debug("capget: assuming no CAP_IPC_LOCK")
	}
	if msg := memlockWarning(lim.Cur, cfg, capable); msg != "" {
		log.Warn(msg)
	}
}

// memlockWarning is checkMemlock's message for a soft RLIMIT_MEMLOCK of
// limit bytes, or "" when there is nothing to warn about: the limit is
// infinite, the process has CAP_IPC_LOCK (capable), or the configured pin
// bounds fit under it.
func memlockWarning(limit uint64, cfg daemon.Config, capable bool) string {
	if limit == unix.RLIM_INFINITY || capable {
		return ""
	}
	need := cfg.GlobalMaxPinned
	if need == 0 {
		need = cfg.Pin.MaxPinned
	}
	switch {
	case cfg.Pin.All:
		return fmt.Sprintf("--pin=all with RLIMIT_MEMLOCK of %d bytes and no CAP_IPC_LOCK: guests larger than that cannot start; raise LimitMEMLOCK (systemd) or ulimit -l, or grant CAP_IPC_LOCK", limit)
	case need == 0:
		return fmt.Sprintf("RLIMIT_MEMLOCK is %d bytes, pins are unbounded and vrdmad lacks CAP_IPC_LOCK: registrations beyond it will fail; raise LimitMEMLOCK, grant CAP_IPC_LOCK or set --max-pinned", limit)
	case need > limit:
		return fmt.Sprintf("RLIMIT_MEMLOCK (%d bytes) is below the configured pin bound (%d bytes) and vrdmad lacks CAP_IPC_LOCK", limit, need)
	}
	return ""
}

// hasCapIPCLock reports whether CAP_IPC_LOCK is in this process's
// effective capability set (capget(2); root without it is bound by
// RLIMIT_MEMLOCK like anyone else).
func hasCapIPCLock() (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, err
	}
	const c = unix.CAP_IPC_LOCK
	return data[c/32].Effective&(1<<(c%32)) != 0, nil
}
