package main

import (
	"os"
	"strconv"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/daemon"
)

// handOverToStore keeps every device for the next start in systemd's
// file-descriptor store (vrdmad --fdstore, on SIGTERM; internal/daemon,
// fdstore.go): the document as a sealed memfd named
// daemon.StoreStateName, each descriptor of the list as
// daemon.StoreFDPrefix+index. It returns true once everything is stored:
// the caller exits at once, closing nothing. Otherwise the daemon serves
// on, for a clean shutdown.
func handOverToStore(log *logrus.Entry, d *daemon.Daemon) bool {
	if os.Getenv("NOTIFY_SOCKET") == "" {
		log.Warn("--fdstore: not started by systemd (no NOTIFY_SOCKET): stopping the devices")
		return false
	}
	s, err := d.HandOverToStore()
	if err != nil {
		log.WithError(err).Error("--fdstore: the devices cannot be kept for the next start: stopping them")
		return false
	}
	var stored []string
	fail := func(err error) bool {
		for _, n := range stored {
			notify(log, "FDSTOREREMOVE=1\nFDNAME="+n)
		}
		s.Abort()
		log.WithError(err).Error("--fdstore: systemd did not take the devices: stopping them")
		return false
	}
	f, err := daemon.SealedState(s.Doc)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	if err := daemon.NotifyWithFDs("FDSTORE=1\nFDNAME="+daemon.StoreStateName, int(f.Fd())); err != nil {
		return fail(err)
	}
	stored = append(stored, daemon.StoreStateName)
	for i, fd := range s.FDs {
		if fd < 0 {
			continue // an alias of an earlier one
		}
		name := daemon.StoreFDPrefix + strconv.Itoa(i)
		if err := daemon.NotifyWithFDs("FDSTORE=1\nFDNAME="+name, fd); err != nil {
			return fail(err)
		}
		stored = append(stored, name)
	}
	log.WithField("fds", len(stored)).Info("--fdstore: every device is kept for the next start")
	notify(log, "STOPPING=1\nSTATUS=devices kept in the file-descriptor store for the next start")
	return true
}
