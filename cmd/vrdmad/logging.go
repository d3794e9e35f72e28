package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
)

// The log as systemd and an operator read it, and what vrdmad does while
// it serves: journal priorities, the error vrdmad exits with, STATUS=,
// and SIGHUP.

// underJournal reports whether standard error is the journal stream
// systemd connected (JOURNAL_STREAM=DEVICE:INODE names it, systemd.exec(5)):
// a log line then starts with its priority. Redirected elsewhere (a pipe
// of the unit's own, a file), it does not, though the variable is
// inherited.
func underJournal() bool {
	dev, ino, ok := strings.Cut(os.Getenv("JOURNAL_STREAM"), ":")
	if !ok {
		return false
	}
	d, err1 := strconv.ParseUint(dev, 10, 64)
	i, err2 := strconv.ParseUint(ino, 10, 64)
	if err1 != nil || err2 != nil {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(os.Stderr.Fd()), &st); err != nil {
		return false
	}
	return uint64(st.Dev) == d && st.Ino == i
}

// priorityFormatter prefixes each line with its syslog priority, "<3>"
// for an error (sd-daemon(3)): journald strips the prefix and files the
// line at that priority, so journalctl -p warning shows warnings and
// errors, whatever --log-format says.
type priorityFormatter struct{ inner logrus.Formatter }

func (f priorityFormatter) Format(e *logrus.Entry) ([]byte, error) {
	b, err := f.inner.Format(e)
	if err != nil {
		return nil, err
	}
	return append([]byte(priority(e.Level)), b...), nil
}

// priority is the sd-daemon(3) prefix of a level.
func priority(l logrus.Level) string {
	switch l {
	case logrus.PanicLevel, logrus.FatalLevel:
		return "<2>" // SD_CRIT
	case logrus.ErrorLevel:
		return "<3>" // SD_ERR
	case logrus.WarnLevel:
		return "<4>" // SD_WARNING
	case logrus.InfoLevel:
		return "<6>" // SD_INFO
	}
	return "<7>" // SD_DEBUG
}

// logFormatArg is the --log-format args ask for ("" when none): the
// error vrdmad exits with is reported in it even when the command line
// failed to parse, or the failure came before the log was set up.
func logFormatArg(args []string) string {
	var format string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "log-format" {
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				break
			}
			i++
			val = args[i]
		}
		format = val
	}
	return format
}

// reportFatal writes the error vrdmad exits with (status code) to w,
// standard error: one JSON log entry at level fatal under --log-format
// json, "vrdmad: ERROR" otherwise, with the journal priority prefix when
// w is the journal.
func reportFatal(w io.Writer, args []string, err error, code int, journal bool) {
	if logFormatArg(args) != "json" {
		line := "vrdmad: " + err.Error() + "\n"
		if journal {
			line = priority(logrus.FatalLevel) + line
		}
		io.WriteString(w, line)
		return
	}
	l := logrus.New()
	l.SetOutput(w)
	var f logrus.Formatter = &logrus.JSONFormatter{}
	if journal {
		f = priorityFormatter{f}
	}
	l.SetFormatter(f)
	// Log, not Fatal: the caller exits, with its own status.
	l.WithField("exit_status", code).Log(logrus.FatalLevel, err.Error())
}

// statusLine is the service manager's STATUS= for h (systemctl status
// shows it): the devices served and, while degraded, the first problem.
func statusLine(h controlapi.Health) string {
	s := fmt.Sprintf("serving %d devices", h.Devices)
	if len(h.Problems) == 0 {
		return s
	}
	p := h.Problems[0]
	switch p.Kind {
	case controlapi.ProblemStateSave:
		s += "; degraded: cannot write " + p.File
	case controlapi.ProblemStateSetAside:
		s += "; degraded: an unusable state file was set aside as " + p.File + " (vrdmactl daemon ack)"
	default:
		s += "; degraded: " + p.Kind
	}
	if n := len(h.Problems) - 1; n > 0 {
		s += fmt.Sprintf(" and %d more problems (vrdmactl daemon status)", n)
	}
	// One line: a newline would start another sd_notify assignment.
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// serveUntilStopped waits until ctx ends (SIGTERM, SIGINT). Meanwhile it
// keeps the service manager's STATUS= current (status is the one sent
// with READY=1) and answers each SIGHUP from hup.
func serveUntilStopped(ctx context.Context, log *logrus.Entry, d *daemon.Daemon, hup <-chan os.Signal, status string) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.HandedOver():
			return
		case <-hup:
			reload(log, d)
		case <-d.Changed():
		}
		if s := statusLine(d.Health()); s != status {
			status = s
			notify(log, "STATUS="+s)
		}
	}
}

// reload is SIGHUP. vrdmad's configuration is its command line, read
// once, and the devices of the control API, which change through it:
// there is nothing to re-read. What a hang-up can usefully do is rewrite
// the state file from the devices served, so that an operator who has
// made the state directory writable again clears the save failure at
// once instead of waiting for the next change.
func reload(log *logrus.Entry, d *daemon.Daemon) {
	file := d.StateFile()
	if file == "" {
		log.Info("SIGHUP: nothing to reload (flags apply at start; there is no state directory)")
		return
	}
	if err := d.SaveState(); err != nil {
		log.WithError(err).Error("SIGHUP: the state file could not be rewritten")
		return
	}
	log.WithField("file", file).Info("SIGHUP: state file rewritten from the devices served (flags apply at start: nothing else is reloaded)")
}
