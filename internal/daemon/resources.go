package daemon

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// The resource views (controlapi/resources.go has the routes and wire
// types): each device's QPs, CQs, MRs, PDs, SRQs and memory windows,
// copied object by object by the engine (rdma.Device.QPViews and
// friends), a page at a time.

// resourceRoutes adds the resource views to mux.
func (d *Daemon) resourceRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/devices/{id}/{kind}", d.getDeviceResources)
	mux.HandleFunc("GET "+controlapi.PathResources, d.getResourceCounts)
	mux.HandleFunc("GET "+controlapi.PathResources+"/{kind}", d.getResources)
	for _, p := range []string{"/v1/devices/{id}/{kind}", controlapi.PathResources, controlapi.PathResources + "/{kind}"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed on "+r.URL.Path+" (allowed: GET, HEAD)")
		})
	}
}

// lister lists up to limit objects of one kind of dv whose handle is
// above after, in handle order: the wire objects and their handles.
type lister func(dv *ServedDevice, after uint32, limit int) (items []any, handles []uint32)

// listOf converts views to wire objects.
func listOf[V any](views []V, wire func(V) any, handle func(V) uint32) ([]any, []uint32) {
	items, handles := make([]any, len(views)), make([]uint32, len(views))
	for i, v := range views {
		items[i], handles[i] = wire(v), handle(v)
	}
	return items, handles
}

// listers are the kinds of controlapi.Kinds.
var listers = map[string]lister{
	"qps": func(dv *ServedDevice, after uint32, limit int) ([]any, []uint32) {
		return listOf(dv.Dev.QPViews(after, limit), func(v engine.QPView) any { return qpInfo(dv.ID, v) },
			func(v engine.QPView) uint32 { return v.QPN })
	},
	"cqs": func(dv *ServedDevice, after uint32, limit int) ([]any, []uint32) {
		return listOf(dv.Dev.CQViews(after, limit), func(v engine.CQView) any { return cqInfo(dv.ID, v) },
			func(v engine.CQView) uint32 { return v.CQN })
	},
	"mrs": func(dv *ServedDevice, after uint32, limit int) ([]any, []uint32) {
		return listOf(dv.Dev.MRViews(after, limit), func(v engine.MRView) any { return mrInfo(dv.ID, v) },
			func(v engine.MRView) uint32 { return v.LKey })
	},
	"pds": func(dv *ServedDevice, after uint32, limit int) ([]any, []uint32) {
		return listOf(dv.Dev.PDViews(after, limit), func(v engine.PDView) any {
			return controlapi.PDInfo{Device: dv.ID, PDN: v.PDN, MRs: v.MRs, MWs: v.MWs, QPs: v.QPs, SRQs: v.SRQs, AHs: v.AHs}
		}, func(v engine.PDView) uint32 { return v.PDN })
	},
	"srqs": func(dv *ServedDevice, after uint32, limit int) ([]any, []uint32) {
		return listOf(dv.Dev.SRQViews(after, limit), func(v engine.SRQView) any { return srqInfo(dv.ID, v) },
			func(v engine.SRQView) uint32 { return v.SRQN })
	},
	"mws": func(dv *ServedDevice, after uint32, limit int) ([]any, []uint32) {
		return listOf(dv.Dev.MWViews(after, limit), func(v engine.MWView) any { return mwInfo(dv.ID, v) },
			func(v engine.MWView) uint32 { return v.RKey })
	},
}

// kindLister returns the lister of the request's kind, or answers 404.
func kindLister(w http.ResponseWriter, r *http.Request) (lister, bool) {
	kind := r.PathValue("kind")
	l, ok := listers[kind]
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such resource kind: %q (want one of %s)", kind, strings.Join(controlapi.Kinds, ", ")))
	}
	return l, ok
}

// pageQuery reads a listing's query: limit, and after as a handle (one
// device) or DEVICE:HANDLE (across devices: cross). Anything else is a
// bad request: a client that misspells limit learns it rather than
// getting a default.
func pageQuery(r *http.Request, cross bool) (afterID string, after uint32, limit int, err error) {
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return "", 0, 0, reqErr("", "query: %v", err)
	}
	limit = controlapi.DefaultPageLimit
	for k, vs := range q {
		if len(vs) != 1 {
			return "", 0, 0, reqErr(k, "given %d times", len(vs))
		}
		v := vs[0]
		switch k {
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > controlapi.MaxPageLimit {
				return "", 0, 0, reqErr("limit", "%q is not a number in [1, %d]", v, controlapi.MaxPageLimit)
			}
			limit = n
		case "after":
			h := v
			if cross {
				var ok bool
				if afterID, h, ok = strings.Cut(v, ":"); !ok || checkID(afterID) != nil {
					return "", 0, 0, reqErr("after", "%q is not DEVICE:HANDLE", v)
				}
			}
			n, err := strconv.ParseUint(h, 0, 32)
			if err != nil {
				return "", 0, 0, reqErr("after", "%q is not a 32-bit handle", h)
			}
			after = uint32(n)
		default:
			return "", 0, 0, reqErr(k, "unknown query parameter (want limit, after)")
		}
	}
	return afterID, after, limit, nil
}

// setNext sets the Link header naming the page of path after cursor.
func setNext(w http.ResponseWriter, path, cursor string, limit int) {
	q := url.Values{"after": {cursor}, "limit": {strconv.Itoa(limit)}}
	w.Header().Set("Link", "<"+path+"?"+q.Encode()+`>; rel="next"`)
}

// getDeviceResources is GET /v1/devices/{id}/{kind}.
func (d *Daemon) getDeviceResources(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	dv, ok := d.Device(id)
	if !ok {
		writeError(w, http.StatusNotFound, "no such device: "+id)
		return
	}
	l, ok := kindLister(w, r)
	if !ok {
		return
	}
	_, after, limit, err := pageQuery(r, false)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// One more than the page: whether there is a next one.
	items, handles := l(dv, after, limit+1)
	if len(items) > limit {
		items = items[:limit]
		setNext(w, controlapi.DeviceResourcePath(id, r.PathValue("kind")), strconv.FormatUint(uint64(handles[limit-1]), 10), limit)
	}
	writeJSON(w, http.StatusOK, items)
}

// getResources is GET /v1/resources/{kind}: the devices in ID order, each
// device's objects in handle order.
func (d *Daemon) getResources(w http.ResponseWriter, r *http.Request) {
	l, ok := kindLister(w, r)
	if !ok {
		return
	}
	afterID, after, limit, err := pageQuery(r, true)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	items := []any{}
	var cursors []string
	for _, dv := range d.Devices() {
		if afterID != "" && dv.ID < afterID {
			continue
		}
		a := uint32(0)
		if dv.ID == afterID {
			a = after
		}
		its, hs := l(dv, a, limit+1-len(items))
		items = append(items, its...)
		for _, h := range hs {
			cursors = append(cursors, dv.ID+":"+strconv.FormatUint(uint64(h), 10))
		}
		if len(items) > limit {
			break
		}
	}
	if len(items) > limit {
		items = items[:limit]
		setNext(w, controlapi.ResourcesPath(r.PathValue("kind")), cursors[limit-1], limit)
	}
	writeJSON(w, http.StatusOK, items)
}

// getResourceCounts is GET /v1/resources.
func (d *Daemon) getResourceCounts(w http.ResponseWriter, r *http.Request) {
	if r.URL.RawQuery != "" {
		writeError(w, http.StatusBadRequest, "invalid request: "+controlapi.PathResources+" takes no query")
		return
	}
	devs := d.Devices()
	out := make([]controlapi.ResourceCount, 0, len(devs))
	for _, dv := range devs {
		c := dv.Dev.Census()
		out = append(out, controlapi.ResourceCount{Device: dv.ID, Connected: dv.Server.Connected(),
			PDs: c.PDs, MRs: c.MRs, MWs: c.MWs, CQs: c.CQs, QPs: c.QPs, SRQs: c.SRQs, AHs: c.AHs})
	}
	writeJSON(w, http.StatusOK, out)
}

// qpStates are the QP states by value (ibv_qp_state).
var qpStates = [...]string{abi.QPSReset: "RESET", abi.QPSInit: "INIT", abi.QPSRTR: "RTR", abi.QPSRTS: "RTS",
	abi.QPSSQD: "SQD", abi.QPSSQE: "SQE", abi.QPSErr: "ERR"}

func qpState(s uint32) string {
	if int(s) < len(qpStates) {
		return qpStates[s]
	}
	return fmt.Sprintf("state_%d", s)
}

func qpType(t uint32) string {
	switch t {
	case abi.QPTypeRC:
		return "RC"
	case abi.QPTypeUD:
		return "UD"
	case abi.QPTypeGSI:
		return "GSI"
	}
	return fmt.Sprintf("type_%d", t)
}

// accessNames are the access flag bits by name, in bit order.
var accessNames = []struct {
	bit  uint32
	name string
}{{abi.AccessLocalWrite, "local_write"}, {abi.AccessRemoteWrite, "remote_write"}, {abi.AccessRemoteRead, "remote_read"},
	{abi.AccessRemoteAtomic, "remote_atomic"}, {abi.AccessMWBind, "mw_bind"}}

// accessList names the bits of access; bits without a name as one hex
// value. Never nil.
func accessList(access uint32) []string {
	out := []string{}
	for _, a := range accessNames {
		if access&a.bit != 0 {
			out = append(out, a.name)
			access &^= a.bit
		}
	}
	if access != 0 {
		out = append(out, fmt.Sprintf("0x%x", access))
	}
	return out
}

// wcStatusName is a completion status as the metrics label it:
// "rem_access_err", or "status_N" without a name.
func wcStatusName(s abi.WCStatus) string {
	n := s.String()
	if strings.HasPrefix(n, "WCStatus(") {
		return fmt.Sprintf("status_%d", s)
	}
	return strings.ToLower(n)
}

func statusMap(m map[abi.WCStatus]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for s, n := range m {
		out[wcStatusName(s)] = n
	}
	return out
}

func gidString(g [16]byte) string { return netip.AddrFrom16(g).String() }

func qpInfo(dev string, v engine.QPView) controlapi.QPInfo {
	q := controlapi.QPInfo{
		Device: dev, QPN: v.QPN, Type: qpType(v.Type), State: qpState(v.State), PD: v.PD,
		SendCQ: v.SendCQ, RecvCQ: v.RecvCQ, SRQ: v.SRQ, DoorbellQueue: v.DoorbellQueue,
		SQDepth: v.SQDepth, RQDepth: v.RQDepth, MaxSendSGE: v.MaxSendSGE, MaxRecvSGE: v.MaxRecvSGE,
		MaxInlineData: v.MaxInline, SQSigAll: v.SigAll, Access: accessList(v.Access), Transport: string(v.Transport),
	}
	if v.Type == abi.QPTypeUD || v.Type == abi.QPTypeGSI {
		qkey := v.QKey
		q.QKey = &qkey
	} else {
		if v.DestGID != ([16]byte{}) {
			sgid := v.SGIDIndex
			q.DestGID, q.DestQPN, q.SGIDIndex = gidString(v.DestGID), v.DestQPN, &sgid
		}
		if v.PathMTU >= abi.MTU256 && v.PathMTU <= abi.MTU4096 {
			q.PathMTU = 128 << v.PathMTU
		}
		q.Paths = v.Paths
		if v.HasPSN {
			sq, rq := v.SQPSN, v.RQPSN
			q.SQPSN, q.RQPSN = &sq, &rq
		}
	}
	e := v.Errors
	q.Errors = controlapi.QPErrors{
		Completions: statusMap(e.Completions), Responder: statusMap(e.Responder),
		RNRNAKsSent: e.RNRNAKsSent, RNRNAKsReceived: e.RNRNAKsReceived, WrongPeer: e.WrongPeer,
		MalformedWQEs: e.MalformedWQEs, UDDropped: e.UDDropped, Retransmits: e.Retransmits, Timeouts: e.Timeouts,
		SeqNAKsSent: e.SeqNAKsSent, SeqNAKsReceived: e.SeqNAKsRecv, NAKsSent: e.NAKsSent, NAKsReceived: e.NAKsRecv,
		Duplicates: e.Duplicates, DroppedPackets: e.DroppedPackets,
	}
	return q
}

func cqInfo(dev string, v engine.CQView) controlapi.CQInfo {
	return controlapi.CQInfo{
		Device: dev, CQN: v.CQN, CQE: v.Depth, Armed: v.Armed, SolicitedOnly: v.SolicitedOnly, ArmRecord: v.ArmRecord,
		Overrun: v.Overrun, Completions: v.Written, Pending: v.Pending, PI: v.PI,
		ErrorCompletions: v.ErrorCQEs, LostCompletions: v.LostCQEs, QPs: v.QPs,
	}
}

func mrInfo(dev string, v engine.MRView) controlapi.MRInfo {
	m := controlapi.MRInfo{
		Device: dev, LKey: v.LKey, RKey: v.RKey, PD: v.PD, Type: string(v.Kind), State: "valid",
		IOVA: v.IOVA, Length: v.Length, Access: accessList(v.Access), PinnedBytes: v.PinnedBytes,
		Extents: v.Extents, Windows: v.Windows, MaxPages: v.MaxPages,
	}
	if !v.Valid {
		m.State = "free"
	}
	if v.PageShift != 0 && v.PageShift < 64 {
		m.PageSize = 1 << v.PageShift
	}
	return m
}

func srqInfo(dev string, v engine.SRQView) controlapi.SRQInfo {
	s := controlapi.SRQInfo{Device: dev, SRQN: v.SRQN, PD: v.PD, MaxWR: v.Depth, MaxSGE: v.MaxSGE, Limit: v.Limit,
		State: "ready", QPs: v.QPs, DoorbellQueue: v.DoorbellQueue}
	if v.Stopped {
		s.State = "error"
	}
	return s
}

func mwInfo(dev string, v engine.MWView) controlapi.MWInfo {
	m := controlapi.MWInfo{Device: dev, RKey: v.RKey, PD: v.PD, Type: int(v.Type), State: "free", Access: accessList(v.Access)}
	if v.Bound {
		m.State, m.MR, m.Addr, m.Length, m.QPN = "bound", v.MRKey, v.Addr, v.Length, v.QPN
	}
	return m
}
