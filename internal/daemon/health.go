package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/version"
)

// Health. A daemon is "ok" or "degraded": it serves either way, but while
// degraded its health (GET /v1/health, vrdma_health_degraded, the
// service manager's STATUS=) lists problems an operator has to look at.
// There are two, both about the state file, because both mean that what
// comes back at the next start is not what runs now:
//
//   - a write of the state file failed (ProblemStateSave): an add was
//     undone, a share change not made, or a removed device is still
//     listed. It clears itself at the next write that succeeds (any
//     saved change, or SaveState, which vrdmad runs on SIGHUP): the file
//     then lists exactly the persisted devices again.
//   - a state file that could not be used was moved aside
//     (ProblemStateSetAside), by this start or an earlier one: its
//     devices are not served. Nothing the daemon can observe says the
//     operator has dealt with it, so only an acknowledgement (Ack, POST
//     /v1/health/ack) clears it. Every start raises it again for each
//     copy still in the state directory.

// Errors of Ack.
var (
	// ErrNoProblem means no problem has the ID given.
	ErrNoProblem = errors.New("no such problem")
	// ErrNotAcknowledgeable means the problem clears by itself when its
	// cause is gone, and an acknowledgement would hide a cause that is
	// still there.
	ErrNotAcknowledgeable = errors.New("problem clears by itself")
)

// problemStateSave is the ID of the ProblemStateSave problem: there is
// one state file, so at most one such problem.
const problemStateSave = "state-save"

// maxProblemID bounds the ID an acknowledgement may name: the longest ID
// is a set-aside copy's file name.
const maxProblemID = 255

// Health is the daemon's health now.
func (d *Daemon) Health() controlapi.Health {
	now := time.Now()
	d.mu.Lock()
	n := len(d.devices)
	problems := append([]controlapi.Problem{}, d.problems...)
	d.mu.Unlock()
	h := controlapi.Health{
		Devices:       n,
		EngineThreads: d.EngineThreads(),
		PinnedBytes:   d.PinnedBytes(),
		Problems:      problems,
		Revision:      version.Revision(),
		Started:       d.started.UTC().Truncate(time.Second),
		Status:        controlapi.StatusOK,
		UptimeSeconds: int64(now.Sub(d.started) / time.Second),
		Version:       version.Version,
	}
	if len(problems) > 0 {
		h.Status = controlapi.StatusDegraded
	}
	return h
}

// Degraded reports whether the daemon lists a problem (Health's status
// is degraded).
func (d *Daemon) Degraded() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.problems) > 0
}

// StateSaveFailures counts the writes of the state file that failed since
// the daemon started.
func (d *Daemon) StateSaveFailures() uint64 { return d.saveFailures.Load() }

// Changed is signalled (without blocking: several changes may be one
// signal) after a device is added or removed and after the health
// changes, so that one reader can keep a summary current (vrdmad's
// sd_notify STATUS=). It is never closed.
func (d *Daemon) Changed() <-chan struct{} { return d.changed }

func (d *Daemon) notifyChanged() {
	select {
	case d.changed <- struct{}{}:
	default: // a signal is pending already: the reader sees this change too
	}
}

// raiseLocked adds p to the problems, or updates the problem of its ID:
// its message and file change, the time it was first seen stays. d.mu is
// held.
func (d *Daemon) raiseLocked(p controlapi.Problem) {
	for i := range d.problems {
		if d.problems[i].ID == p.ID {
			p.Since = d.problems[i].Since
			d.problems[i] = p
			d.notifyChanged()
			return
		}
	}
	if p.Since.IsZero() {
		p.Since = time.Now().UTC().Truncate(time.Second)
	}
	d.problems = append(d.problems, p)
	d.notifyChanged()
}

// clearLocked removes the problem id; it reports whether there was one.
// d.mu is held.
func (d *Daemon) clearLocked(id string) bool {
	for i := range d.problems {
		if d.problems[i].ID == id {
			d.problems = append(d.problems[:i], d.problems[i+1:]...)
			d.notifyChanged()
			return true
		}
	}
	return false
}

// Ack acknowledges the problem id, or every problem that needs an
// acknowledgement when id is "", and returns the IDs it cleared (none is
// not an error for ""). Errors: ErrNoProblem, ErrNotAcknowledgeable.
func (d *Daemon) Ack(id string) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []string
	for _, p := range d.problems {
		switch {
		case id != "" && p.ID != id:
		case p.NeedsAck:
			ids = append(ids, p.ID)
		case id != "":
			return nil, fmt.Errorf("%w: %s clears when a write of the state file succeeds: "+
				"make the state directory writable, then send vrdmad SIGHUP or make any saved change", ErrNotAcknowledgeable, id)
		}
	}
	if id != "" && len(ids) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrNoProblem, id)
	}
	for _, a := range ids {
		d.clearLocked(a)
	}
	if len(ids) > 0 {
		d.log.WithField("problems", strings.Join(ids, ",")).Info("health problems acknowledged")
	}
	return ids, nil
}

// persistLocked writes recs to the state file and keeps the health in
// step: a failure is logged at error level, counted and raises
// ProblemStateSave, saying what change it lost (change: "the removal of
// device vm1 (removed all the same)"); a success clears it. d.mu is held
// and d.state is not nil.
func (d *Daemon) persistLocked(recs []AddRequest, change string) error {
	err := d.state.save(recs)
	if err != nil {
		n := d.saveFailures.Add(1)
		d.log.WithError(err).WithFields(logrus.Fields{"file": d.state.path, "failures": n}).
			Errorf("device state not saved: %s", change)
		d.raiseLocked(controlapi.Problem{ID: problemStateSave, Kind: controlapi.ProblemStateSave, File: d.state.path,
			Message: fmt.Sprintf("the state file could not be written at %s: %v. Until a write succeeds the devices of "+
				"the next start may differ from those served now; make the state directory writable, then send vrdmad "+
				"SIGHUP or make any saved change", change, err)})
		return err
	}
	if d.clearLocked(problemStateSave) {
		d.log.WithField("file", d.state.path).Info("device state saved again: the state file lists the devices served")
	}
	return nil
}

// SaveState rewrites the state file from the devices served, as every
// saved change does; vrdmad runs it on SIGHUP, so that an operator who
// has fixed the state directory clears ProblemStateSave at once. Without
// a state directory it does nothing.
func (d *Daemon) SaveState() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if d.state == nil {
		return nil
	}
	if err := d.persistLocked(d.recordsLocked("", rdma.Share{}), "a rewrite on request"); err != nil {
		return fmt.Errorf("%w: save: %w", ErrState, err)
	}
	return nil
}

// StateFile is the path of the state file, or "" without a state
// directory.
func (d *Daemon) StateFile() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state == nil {
		return ""
	}
	return d.state.path
}

// setAsideProblem is the problem of the copy an unusable state file was
// moved to; why is what was wrong with it, or "" when an earlier start
// moved it.
func setAsideProblem(copyPath, why string) controlapi.Problem {
	msg := fmt.Sprintf("an earlier start moved an unusable state file to %s: its devices are not served", copyPath)
	if why != "" {
		msg = why
	}
	return controlapi.Problem{ID: filepath.Base(copyPath), Kind: controlapi.ProblemStateSetAside, File: copyPath, NeedsAck: true,
		Message: msg + ". Fix the copy and move it back while vrdmad is stopped, or add its devices again; then move " +
			"the copy out of the state directory (each start raises this again while it is there) and acknowledge " +
			"(vrdmactl daemon ack)"}
}

// postAck is POST /v1/health/ack: an empty body or {} acknowledges
// every problem that needs it, {"id": ID} that one.
func (d *Daemon) postAck(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req controlapi.AckRequest
	if !decodeOptionalBody(w, body, &req) {
		return
	}
	if len(req.ID) > maxProblemID {
		writeError(w, http.StatusBadRequest, reqErr("id", "longer than %d bytes", maxProblemID).Error())
		return
	}
	ids, err := d.Ack(req.ID)
	switch {
	case errors.Is(err, ErrNoProblem):
		writeError(w, http.StatusNotFound, err.Error())
		return
	case errors.Is(err, ErrNotAcknowledgeable):
		writeError(w, http.StatusConflict, err.Error())
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if ids == nil {
		ids = []string{}
	}
	writeJSON(w, http.StatusOK, controlapi.AckAnswer{Acknowledged: ids, Health: d.Health()})
}

// decodeOptionalBody decodes a request body that may be empty into v: one
// JSON object, no unknown key, nothing after it. When it cannot, it has
// answered 400 and returns false.
func decodeOptionalBody(w http.ResponseWriter, body []byte, v any) bool {
	if len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, reqErr("", "malformed JSON: %v", err).Error())
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, http.StatusBadRequest, reqErr("", "trailing data after the JSON object").Error())
		return false
	}
	return true
}
