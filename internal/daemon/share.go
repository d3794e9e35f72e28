package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/controlapi"
)

// A device's share (rdma.Share) is the one thing the control API changes
// on a running device: PATCH /v1/devices/{id} with {"share": {...}}. The
// change applies to the live device at once and, for a persisted device,
// is saved in the state file first: a change that cannot be saved is not
// made.

// checkShare checks the fields p sets and applies them to cur. On error
// the share is zero and the error a *RequestError naming the field.
func checkShare(p SharePatch, cur rdma.Share) (rdma.Share, error) {
	s := cur
	if p.Weight != nil {
		if *p.Weight > rdma.MaxWeight {
			return rdma.Share{}, reqErr("share.weight", "%d out of range [0, %d] (0: 1)", *p.Weight, rdma.MaxWeight)
		}
		s.Weight = *p.Weight
	}
	if p.MaxBytesPerSec != nil {
		if b := *p.MaxBytesPerSec; b != 0 && b < rdma.MinBytesPerSec {
			return rdma.Share{}, reqErr("share.max_bytes_per_s", "%d below %d (0: no bound)", b, rdma.MinBytesPerSec)
		}
		s.MaxBytesPerSec = *p.MaxBytesPerSec
	}
	if p.MaxOpsPerSec != nil {
		s.MaxOpsPerSec = *p.MaxOpsPerSec
	}
	// The device's own rules, should they be stricter than the above.
	if err := s.Check(); err != nil {
		return rdma.Share{}, reqErr("share", "%v", err)
	}
	return s, nil
}

// shareInfo is s as the control API shows it: the weight in effect.
func shareInfo(s rdma.Share) Share {
	w := s.Weight
	if w == 0 {
		w = 1
	}
	return Share{Weight: w, MaxBytesPerSec: s.MaxBytesPerSec, MaxOpsPerSec: s.MaxOpsPerSec}
}

// shareRecord is s as a state-file record keeps it (as it was asked for:
// weight 0 stays 0); nil for the zero share, which is left out.
func shareRecord(s rdma.Share) *Share {
	if s == (rdma.Share{}) {
		return nil
	}
	return &Share{Weight: s.Weight, MaxBytesPerSec: s.MaxBytesPerSec, MaxOpsPerSec: s.MaxOpsPerSec}
}

// DecodePatchRequest reads and checks the syntax of a PATCH
// /v1/devices/{id} body: one JSON object with a "share" object, no other
// key. The values are checked against the device's share by SetShare. On
// error the patch is zero and the error a *RequestError.
func DecodePatchRequest(body []byte) (SharePatch, error) {
	var req controlapi.PatchRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return SharePatch{}, reqErr("", "malformed JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return SharePatch{}, reqErr("", "trailing data after the JSON object")
	}
	if req.Share == nil {
		return SharePatch{}, reqErr("share", `required: the body is {"share": {"weight": N, "max_bytes_per_s": N, "max_ops_per_s": N}} with any of the three keys`)
	}
	if _, err := checkShare(*req.Share, rdma.Share{}); err != nil {
		return SharePatch{}, err
	}
	return *req.Share, nil
}

// SetShare changes the share of device id: the fields p sets, the others
// kept (see SharePatch). For a persisted device the state file is
// rewritten first; if that fails the share is left as it was and the
// error matches ErrState. Errors: ErrNotFound, ErrInvalidRequest (a
// *RequestError), ErrClosed, ErrState.
func (d *Daemon) SetShare(id string, p SharePatch) (*ServedDevice, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	dv, ok := d.devices[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	// Under d.mu: two patches of one device apply one after the other,
	// neither losing the other's fields.
	s, err := checkShare(p, dv.Dev.Share())
	if err != nil {
		return nil, err
	}
	if dv.persist && d.state != nil {
		if err := d.persistLocked(d.recordsLocked(dv.ID, s), "the share change of device "+id+" (not made)"); err != nil {
			return nil, fmt.Errorf("%w: save: %w (the share is unchanged)", ErrState, err)
		}
	}
	if err := dv.Dev.SetShare(s); err != nil {
		// checkShare ran Check: not reached unless the two disagree.
		return nil, reqErr("share", "%v", err)
	}
	d.log.WithFields(logrus.Fields{"device": id, "weight": shareInfo(s).Weight,
		"max_bytes_per_s": s.MaxBytesPerSec, "max_ops_per_s": s.MaxOpsPerSec}).Info("share changed")
	return dv, nil
}

func (d *Daemon) patchDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if _, ok := d.Device(id); !ok {
		// Before the body: a patch of no device is 404 whatever it says.
		writeError(w, http.StatusNotFound, "no such device: "+id)
		return
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	p, err := DecodePatchRequest(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	dv, err := d.SetShare(id, p)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, dv.Info())
	case errors.Is(err, ErrNotFound): // removed meanwhile
		writeError(w, http.StatusNotFound, "no such device: "+id)
	case errors.Is(err, ErrInvalidRequest):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "set share: "+err.Error())
	}
}
