package main

import (
	"context"
	"os"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/metrics"
)

// takeOver runs the new process of a live upgrade (internal/daemon,
// handover.go): it takes every device up from the handover without
// serving, says it is ready, and serves once the old process commits.
// Until the commit a failure exits at once, closing nothing: every
// descriptor is the old process's too, and it serves on.
func takeOver(ctx context.Context, entry *logrus.Entry, f *flags, d *daemon.Daemon, in *daemon.Incoming, hup <-chan os.Signal) error {
	abandon := func(err error) error {
		in.Refuse(err)
		// From systemd's store, nobody serves on: empty the store, so
		// that the next start (Restart=) is a plain one.
		for _, n := range in.StoreNames() {
			notify(entry, "FDSTOREREMOVE=1\nFDNAME="+n)
		}
		entry.WithError(err).Error("cannot take over: the running vrdmad serves on")
		os.Exit(1)
		return err
	}
	stateDir := ""
	if f.stateDir != "" {
		dir, err := filepath.Abs(f.stateDir)
		if err != nil {
			return abandon(err)
		}
		stateDir = dir
	}
	if err := d.TakeOver(in, stateDir); err != nil {
		return abandon(err)
	}
	ctl, mln, err := in.Listeners()
	if err != nil {
		return abandon(err)
	}
	if err := in.Ready(); err != nil {
		entry.WithError(err).Error("not taking over: the running vrdmad serves on")
		os.Exit(1)
	}
	// Committed: the devices are this process's. The RoCE network adopted
	// its sockets frozen (nothing read or acknowledged before the commit):
	// it runs from now on, after the devices it delivers to.
	d.ServeAdopted()
	if n := d.RoCE(); n != nil && n.Frozen() {
		n.Thaw()
	}
	if ctl != nil {
		if err := d.ServeControlListener(ctl); err != nil {
			entry.WithError(err).Error("control API")
		}
	} else if f.control != "" {
		if err := d.ServeControl(f.control); err != nil {
			entry.WithError(err).Error("control API")
		}
	}
	src := metrics.DaemonSource{D: d, GlobalMaxPinned: d.GlobalMaxPinned()}
	var ms *metrics.Server
	switch {
	case mln != nil:
		ms, err = metrics.Serve(mln, src, entry)
	case f.metricsAddr != "":
		ms, err = metrics.Listen(f.metricsAddr, src, entry)
	}
	if err != nil {
		entry.WithError(err).Error("metrics")
	} else if ms != nil {
		d.SetMetricsListener(ms.Listener())
	}
	in.Serving()
	entry.WithFields(logrus.Fields{"from_pid": in.H.From.PID, "devices": len(in.H.Devices)}).Info("took over from the old vrdmad")
	if names := in.StoreNames(); len(names) > 0 {
		// Taken over from systemd's store: empty it, or the next start
		// would get these descriptors again.
		for _, n := range names {
			notify(entry, "FDSTOREREMOVE=1\nFDNAME="+n)
		}
	}
	return serve(ctx, entry, d, ms, hup, 0, f.fdstore)
}
