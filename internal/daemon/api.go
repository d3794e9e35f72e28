package daemon

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/hostnic"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The control API's wire types are package controlapi's, which the
// clients share; these names are the daemon's for them.
type (
	// DeviceInfo is a device as the control API shows it.
	DeviceInfo = controlapi.DeviceInfo
	// Limits are the per-device limits the control API sets and shows.
	Limits = controlapi.Limits
	// AddRequest is the body of POST /v1/devices.
	AddRequest = controlapi.AddRequest
	// Share is a device's part of the engine as the control API shows it.
	Share = controlapi.Share
	// SharePatch is the share of a PATCH /v1/devices/{id} body.
	SharePatch = controlapi.SharePatch
)

// Info describes a device now.
func (dv *ServedDevice) Info() DeviceInfo {
	st := dv.Server.Stats()
	ds := dv.Dev.Stats()
	cs := dv.Dev.ConfigSpace()
	var wcErrors uint64
	for _, n := range ds.Engine.CompletionErrors {
		wcErrors += n
	}
	p, connected := dv.Server.Peer()
	var peer *controlapi.Peer
	if connected && p.Known {
		peer = &controlapi.Peer{PID: p.PID, UID: p.UID, GID: p.GID, ConnectedSince: p.Since.UTC().Truncate(time.Second)}
	}
	return DeviceInfo{
		ID:          dv.ID,
		Socket:      dv.Server.Socket(),
		UUID:        dv.Dev.UUID().String(),
		Connected:   connected,
		PinnedBytes: ds.Pin.PinnedBytes,
		PDs:         ds.PDs,
		MRs:         ds.MRs,
		CQs:         ds.CQs,
		QPs:         ds.QPs,
		AHs:         ds.AHs,
		BytesMoved:  ds.Engine.BytesMoved,
		Errors:      ds.Errors + st.ProtocolErrors + st.RingErrors + wcErrors,
		Commands:    ds.Commands,
		Sessions:    st.Sessions,
		RingErrors:  st.RingErrors,
		CachedBytes: ds.Pin.CachedBytes,
		CacheHits:   ds.Pin.CacheHits,
		CacheMisses: ds.Pin.CacheMisses,
		EventsLost:  ds.EventsLost,
		GUID:        abi.FormatGUID(cs.NodeGUID),
		GID:         netip.AddrFrom16(cs.PortGID).String(),
		MAC:         abi.MACOfGUID(cs.NodeGUID).String(),
		Limits:      Limits{MaxQPs: cs.MaxQP, MaxCQs: cs.MaxCQ, MaxMRs: cs.MaxMR, MaxPinnedBytes: dv.MaxPinned},
		NumQueues:   dv.Dev.NumQueues(),
		Persisted:   dv.listed(),
		Share:       shareInfo(dv.Dev.Share()),
		GIDs:        gidEntries(dv.Dev.GIDs()),
		RoCEBind:    addrStrings(dv.roceBind),
		Addresses:   controlapi.PrefixStrings(dv.Dev.AllowedGIDs()),
		RNIC:        dv.Dev.RNIC(),
		Peer:        peer,

		RefusedFrontEnds: st.Refused,
		Migration:        dv.Dev.Migration(),
	}
}

// addrStrings formats addresses; nil for none.
func addrStrings(as []netip.Addr) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.String())
	}
	return out
}

// gidEntries is a GID table as the control API shows it: never null.
func gidEntries(gs []rdma.GIDEntry) []controlapi.GIDEntry {
	out := make([]controlapi.GIDEntry, 0, len(gs))
	for _, g := range gs {
		out = append(out, controlapi.GIDEntry{Index: g.Index, GID: netip.AddrFrom16(g.GID).String()})
	}
	return out
}

// Bounds of what POST /v1/devices accepts.
const (
	maxRequestBody = 64 << 10
	maxIDLen       = 64
	// maxSocketPath is sun_path's size less its terminating NUL.
	maxSocketPath     = 107
	maxDoorbellQueues = 256
	maxQPs            = 1 << 16
	maxCQs            = 1 << 16
	maxMRs            = 1 << 20
	minPinnedBytes    = 1 << 21 // one hugepage: anything less cannot hold a ring
	maxPinnedBytes    = 1 << 48
)

// ErrInvalidRequest means a control API request is malformed or out of
// range. Returned as *RequestError.
var ErrInvalidRequest = errors.New("invalid request")

// RequestError is one bad field of a control API request.
type RequestError struct {
	// Field is the JSON key ("limits.max_qps"), or "" for the body as a
	// whole.
	Field string
	// Reason says what is wrong.
	Reason string
}

func (e *RequestError) Error() string {
	if e.Field == "" {
		return "invalid request: " + e.Reason
	}
	return fmt.Sprintf("invalid request: %s: %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalidRequest.
func (e *RequestError) Is(target error) bool { return target == ErrInvalidRequest }

func reqErr(field, format string, args ...any) error {
	return &RequestError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// DecodeAddRequest reads and checks a POST /v1/devices body. On error the
// spec is zero.
func DecodeAddRequest(body []byte) (DeviceSpec, error) {
	var req AddRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return DeviceSpec{}, reqErr("", "malformed JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return DeviceSpec{}, reqErr("", "trailing data after the JSON object")
	}
	spec, err := requestSpec(req)
	if err != nil {
		return DeviceSpec{}, err
	}
	return spec, nil
}

// requestSpec checks r and turns it into a DeviceSpec. On error the spec
// is zero.
func requestSpec(r AddRequest) (DeviceSpec, error) {
	if err := checkID(r.ID); err != nil {
		return DeviceSpec{}, err
	}
	if err := checkSocket(r.Socket); err != nil {
		return DeviceSpec{}, err
	}
	if err := CheckDoorbellQueues(r.DoorbellQueues); err != nil {
		return DeviceSpec{}, err
	}
	u, err := requestIdentity(r)
	if err != nil {
		return DeviceSpec{}, err
	}
	var lim rdma.Limits // zero fields: the daemon's defaults (AddDevice)
	var maxPinned uint64
	if l := r.Limits; l != nil {
		if lim, maxPinned, err = CheckLimits(uint64(l.MaxQPs), uint64(l.MaxCQs), uint64(l.MaxMRs), l.MaxPinnedBytes); err != nil {
			return DeviceSpec{}, err
		}
	}
	var share rdma.Share
	if r.Share != nil {
		w, b, o := r.Share.Weight, r.Share.MaxBytesPerSec, r.Share.MaxOpsPerSec
		if share, err = checkShare(SharePatch{Weight: &w, MaxBytesPerSec: &b, MaxOpsPerSec: &o}, rdma.Share{}); err != nil {
			return DeviceSpec{}, err
		}
	}
	bind, err := checkRoCEBind(r.RoCEBind)
	if err != nil {
		return DeviceSpec{}, err
	}
	assigned, err := controlapi.ParseAddresses(append(append([]string(nil), r.Addresses...), r.GIDs...))
	if err != nil {
		return DeviceSpec{}, reqErr("addresses", "%v", err)
	}
	if r.RNIC != "" {
		if _, err := hostnic.ParseSpec(r.RNIC); err != nil {
			return DeviceSpec{}, reqErr("rnic", "%v", err)
		}
	}
	if r.Incoming {
		if r.UUID == "" && r.GUID == "" && r.GID == "" && r.MAC == "" {
			return DeviceSpec{}, reqErr("incoming", "a migration's destination takes its source's uuid (or guid, gid, mac): none given")
		}
		if r.RNIC != "" && r.RNIC != "soft" {
			return DeviceSpec{}, reqErr("incoming", "a migration's destination runs on the soft RNIC, not %s", r.RNIC)
		}
	}
	return DeviceSpec{
		ID:     r.ID,
		Socket: r.Socket,
		Device: rdma.Config{ID: r.ID, UUID: u, DoorbellQueues: r.DoorbellQueues, Limits: lim, Share: share,
			AllowedGIDs: assigned, Incoming: r.Incoming},
		MaxPinned: maxPinned,
		RoCEBind:  bind,
		RNIC:      r.RNIC,
	}, nil
}

// checkRoCEBind parses roce_bind (udp.ParseHostAddrs).
func checkRoCEBind(ss []string) ([]netip.Addr, error) {
	as, err := udp.ParseHostAddrs(ss)
	if err != nil {
		return nil, reqErr("roce_bind", "%v", err)
	}
	return as, nil
}

// CheckID reports whether id is a valid device ID, as POST /v1/devices
// checks it: a letter, then letters, digits, '-', '.', '_'; at most 64.
func CheckID(id string) error { return checkID(id) }

func checkID(id string) error {
	if id == "" {
		return reqErr("id", "required")
	}
	if len(id) > maxIDLen {
		return reqErr("id", "longer than %d bytes", maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if i == 0 && !letter {
			return reqErr("id", "%q must start with a letter", id)
		}
		if !letter && !(c >= '0' && c <= '9') && c != '-' && c != '.' && c != '_' {
			return reqErr("id", "%q holds %q: want letters, digits, '-', '.', '_'", id, c)
		}
	}
	return nil
}

func checkSocket(p string) error {
	switch {
	case p == "":
		return reqErr("socket", "required")
	case len(p) > maxSocketPath:
		return reqErr("socket", "longer than %d bytes (a unix socket path's limit)", maxSocketPath)
	case !utf8.ValidString(p) || strings.ContainsAny(p, "\x00\n"):
		return reqErr("socket", "holds a NUL, newline or invalid UTF-8")
	case !filepath.IsAbs(p) || filepath.Clean(p) != p:
		return reqErr("socket", "%q is not a clean absolute path", p)
	}
	return nil
}

// requestIdentity derives the device UUID from the request's uuid, guid
// and gid.
func requestIdentity(r AddRequest) (uuid.UUID, error) {
	var (
		u       uuid.UUID
		guid    uint64
		hasGUID bool
	)
	if r.UUID != "" {
		v, err := uuid.Parse(r.UUID)
		if err != nil || v == uuid.Nil {
			return uuid.Nil, reqErr("uuid", "%q is not a non-nil UUID", r.UUID)
		}
		u = v
	}
	if r.GUID != "" {
		g, err := abi.ParseGUID(r.GUID)
		if err != nil {
			return uuid.Nil, reqErr("guid", "%v", err)
		}
		guid, hasGUID = g, true
	}
	if r.MAC != "" {
		hw, err := net.ParseMAC(r.MAC)
		if err != nil || len(hw) != 6 {
			return uuid.Nil, reqErr("mac", "%q is not an EUI-48 MAC address", r.MAC)
		}
		g, err := abi.GUIDOfMAC(hw)
		if err != nil {
			return uuid.Nil, reqErr("mac", "%v", err)
		}
		if hasGUID && g != guid {
			return uuid.Nil, reqErr("mac", "%s gives node GUID %s, not %s", r.MAC, abi.FormatGUID(g), abi.FormatGUID(guid))
		}
		guid, hasGUID = g, true
	}
	if r.GID != "" {
		a, err := netip.ParseAddr(r.GID)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return uuid.Nil, reqErr("gid", "%q is not an IPv6 address", r.GID)
		}
		b := a.As16()
		if binary.BigEndian.Uint64(b[:8]) != 0xfe80<<48 {
			return uuid.Nil, reqErr("gid", "%s is not in fe80::/64 (port GID 0 is the link-local prefix and the node GUID)", a)
		}
		g := binary.BigEndian.Uint64(b[8:])
		if err := abi.CheckGUID(g); err != nil {
			return uuid.Nil, reqErr("gid", "interface ID: %v", err)
		}
		if hasGUID && g != guid {
			return uuid.Nil, reqErr("gid", "%s does not match guid %s", a, abi.FormatGUID(guid))
		}
		guid, hasGUID = g, true
	}
	switch {
	case hasGUID && u != uuid.Nil:
		if abi.GUIDOfUUID(u) != guid {
			return uuid.Nil, reqErr("uuid", "%s gives node GUID %s, not %s", u, abi.FormatGUID(abi.GUIDOfUUID(u)), abi.FormatGUID(guid))
		}
	case hasGUID:
		// The node GUID is the UUID's first 8 bytes; the rest is random.
		u = uuid.New()
		binary.BigEndian.PutUint64(u[:8], guid)
	case u == uuid.Nil:
		u = uuid.New()
	}
	return u, nil
}

// Handler is the control API. Every error answer is JSON:
// {"error": "..."} with a 4xx status for a bad request.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/devices", func(w http.ResponseWriter, r *http.Request) {
		devs := d.Devices()
		out := make([]DeviceInfo, 0, len(devs))
		for _, dv := range devs {
			out = append(out, dv.Info())
		}
		writeJSON(w, http.StatusOK, out)
	})
	mux.HandleFunc("POST /v1/devices", d.postDevice)
	mux.HandleFunc("GET /v1/devices/{id}", func(w http.ResponseWriter, r *http.Request) {
		dv, ok := d.Device(r.PathValue("id"))
		if !ok {
			writeError(w, http.StatusNotFound, "no such device: "+r.PathValue("id"))
			return
		}
		writeJSON(w, http.StatusOK, dv.Info())
	})
	mux.HandleFunc("PATCH /v1/devices/{id}", d.patchDevice)
	mux.HandleFunc("DELETE /v1/devices/{id}", d.deleteDevice)
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.Health())
	})
	mux.HandleFunc("POST /v1/health/ack", d.postAck)
	mux.HandleFunc("POST "+controlapi.PathUpgrade, d.postUpgrade)
	for _, p := range []struct{ pattern, allow string }{
		{"/v1/devices", "GET, HEAD, POST"},
		{"/v1/devices/{id}", "GET, HEAD, PATCH, DELETE"},
		{"/v1/health", "GET, HEAD"},
		{"/v1/health/ack", "POST"},
		{controlapi.PathUpgrade, "POST"},
	} {
		mux.HandleFunc(p.pattern, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", p.allow)
			writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed on "+r.URL.Path+" (allowed: "+p.allow+")")
		})
	}
	d.resourceRoutes(mux) // resources.go
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no such endpoint: "+r.URL.Path)
	})
	return d.audit(mux)
}

// deleteDevice is DELETE /v1/devices/{id}. A device whose removal could
// not be saved is gone all the same: the answer is a success that says
// the state file still lists it (Removed.StillListed).
func (d *Daemon) deleteDevice(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	stopErr, saveErr := d.removeDevice(id, false)
	switch {
	case errors.Is(stopErr, ErrNotFound):
		writeError(w, http.StatusNotFound, "no such device: "+id)
		return
	case stopErr != nil:
		// The device is gone from the set either way; report how its
		// server stopped.
		writeError(w, http.StatusInternalServerError, errors.Join(stopErr, saveErr).Error())
		return
	}
	out := controlapi.Removed{ID: id, Removed: true}
	if saveErr != nil {
		out.StillListed, out.Warning = true, saveErr.Error()
		noteError(w, saveErr.Error())
	}
	writeJSON(w, http.StatusOK, out)
}

// readBody reads a request body of at most maxRequestBody bytes. When it
// cannot, it has answered (413 or 400) and returns false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxRequestBody))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return nil, false
	}
	return body, true
}

func (d *Daemon) postDevice(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	spec, err := DecodeAddRequest(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	noteDevice(w, spec.ID)
	spec.Persist = true // back after a restart (with a state directory)
	dv, err := d.AddDevice(spec)
	switch {
	case err == nil:
		w.Header().Set("Location", "/v1/devices/"+dv.ID)
		writeJSON(w, http.StatusCreated, dv.Info())
	case errors.Is(err, ErrExists), errors.Is(err, ErrSocketInUse), errors.Is(err, ErrTooMany):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, ErrClosed):
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case errors.Is(err, ErrState):
		// The device could not be saved and was not added.
		writeError(w, http.StatusInternalServerError, "add device: "+err.Error())
	default:
		// The socket's directory is missing or not writable, and the like:
		// the request named something the daemon cannot use.
		writeError(w, http.StatusUnprocessableEntity, "add device: "+err.Error())
	}
}
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	noteError(w, msg)
	writeJSON(w, code, controlapi.ErrorAnswer{Error: msg})
}
