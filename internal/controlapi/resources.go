package controlapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Resource views: a device's objects as iproute2's `rdma resource show`
// lists an RNIC's, one JSON object each, with its handle, state, what it
// is tied to and its error counters.
//
//	GET /v1/devices/{id}/{kind}  one device's objects of a kind
//	GET /v1/resources            []ResourceCount, one per device
//	GET /v1/resources/{kind}     every device's objects of a kind
//
// kind is one of Kinds: qps ([]QPInfo), cqs ([]CQInfo), mrs ([]MRInfo),
// pds ([]PDInfo), srqs ([]SRQInfo), mws ([]MWInfo). A listing is in
// handle order (and device ID order across devices) and is paged: at
// most limit objects (query parameter limit, 1 … MaxPageLimit, default
// DefaultPageLimit) after the cursor after (the last object of the
// previous page: its handle, or DEVICE:HANDLE across devices). A page
// that is not the last carries a Link header with rel="next" naming the
// next page's path; the Client methods follow it.

// PathResources lists every device's object counts (GET).
const PathResources = "/v1/resources"

// Paging bounds of the resource listings.
const (
	DefaultPageLimit = 1000
	MaxPageLimit     = 5000
)

// Kinds are the kinds of objects the resource views list, as the paths
// spell them.
var Kinds = []string{"qps", "cqs", "mrs", "pds", "srqs", "mws"}

// DeviceResourcePath is the path of one device's objects of kind.
func DeviceResourcePath(id, kind string) string { return DevicePath(id) + "/" + kind }

// ResourcesPath is the path of every device's objects of kind.
func ResourcesPath(kind string) string { return PathResources + "/" + kind }

// ResourceCount is one device's objects by kind (GET /v1/resources).
type ResourceCount struct {
	Device    string `json:"device"`
	Connected bool   `json:"connected"`
	PDs       int    `json:"pds"`
	MRs       int    `json:"mrs"` // ALLOC_MR MRs included, windows not
	MWs       int    `json:"mws"`
	CQs       int    `json:"cqs"`
	QPs       int    `json:"qps"`
	SRQs      int    `json:"srqs"`
	AHs       int    `json:"ahs"`
}

// QPInfo is a queue pair.
type QPInfo struct {
	Device string `json:"device"`
	QPN    uint32 `json:"qpn"`
	// Type is RC, UD or GSI; State RESET, INIT, RTR, RTS, SQD, SQE or
	// ERR.
	Type          string `json:"type"`
	State         string `json:"state"`
	PD            uint32 `json:"pd"`
	SendCQ        uint32 `json:"send_cq"`
	RecvCQ        uint32 `json:"recv_cq"`
	SRQ           uint32 `json:"srq,omitempty"` // absent: the QP's own receive queue
	DoorbellQueue int    `json:"doorbell_queue"`
	SQDepth       uint32 `json:"sq_depth"`
	RQDepth       uint32 `json:"rq_depth"`
	MaxSendSGE    uint32 `json:"max_send_sge"`
	MaxRecvSGE    uint32 `json:"max_recv_sge"`
	MaxInlineData uint32 `json:"max_inline_data"`
	SQSigAll      bool   `json:"sq_sig_all"`
	// Access are the qp_access_flags by name (remote_write, …).
	Access []string `json:"access"`
	// Transport is how the QP reaches its peer: local (a device of this
	// host), roce (RoCEv2 to another host; a UD QP attached to the
	// host's addresses), verbs (the host's RDMA NIC); absent before an
	// RC QP is connected.
	Transport string `json:"transport,omitempty"`
	// The peer of an RC QP from INIT→RTR on: its GID and QP number, the
	// GID index the QP sends from, the path MTU in bytes, the path count
	// it asked for (0: the network's default) or, connected to another
	// host, the paths its packets take.
	DestGID   string  `json:"dest_gid,omitempty"`
	DestQPN   uint32  `json:"dest_qpn,omitempty"`
	SGIDIndex *uint32 `json:"sgid_index,omitempty"`
	PathMTU   int     `json:"path_mtu,omitempty"`
	Paths     int     `json:"paths,omitempty"`
	// SQPSN and RQPSN (RC): the next PSNs the transport sends and
	// expects for a QP connected to another host, else the ones
	// MODIFY_QP gave; absent for a sprayed QP, whose packets carry a
	// sequence space of their own.
	SQPSN *uint32 `json:"sq_psn,omitempty"`
	RQPSN *uint32 `json:"rq_psn,omitempty"`
	// QKey is a UD QP's Q_Key.
	QKey   *uint32  `json:"qkey,omitempty"`
	Errors QPErrors `json:"errors"`
}

// QPErrors are a QP's error counters since it was created.
type QPErrors struct {
	// Completions are its error completions (send and receive, written
	// or lost) by ibv_wc_status name, lower-case without IBV_WC_
	// ("rem_access_err"), as vrdma_completion_errors_total labels them.
	Completions map[string]uint64 `json:"completions"`
	// Responder are the requests it refused as responder (it moved to
	// ERR), by the status its requester completed with.
	Responder map[string]uint64 `json:"responder"`
	// RNRNAKsSent: messages that found its receive queue empty;
	// RNRNAKsReceived: its messages that found the peer's empty.
	RNRNAKsSent     uint64 `json:"rnr_naks_sent"`
	RNRNAKsReceived uint64 `json:"rnr_naks_received"`
	// WrongPeer: requests from a QP it is not connected to (another
	// tenant's probe, or a stale peer).
	WrongPeer uint64 `json:"wrong_peer"`
	// MalformedWQEs: send and receive WQEs that did not decode.
	MalformedWQEs uint64 `json:"malformed_wqes"`
	// UDDropped: datagrams that reached it and were dropped (another
	// Q_Key, not in RTR or RTS, no receive posted).
	UDDropped uint64 `json:"ud_dropped"`
	// The RoCEv2 transport's (a QP connected to another host): packets
	// sent again, retransmit timer expiries, PSN sequence NAKs and other
	// NAKs, duplicate requests answered, packets dropped.
	Retransmits     uint64 `json:"retransmits"`
	Timeouts        uint64 `json:"timeouts"`
	SeqNAKsSent     uint64 `json:"seq_naks_sent"`
	SeqNAKsReceived uint64 `json:"seq_naks_received"`
	NAKsSent        uint64 `json:"naks_sent"`
	NAKsReceived    uint64 `json:"naks_received"`
	Duplicates      uint64 `json:"duplicates"`
	DroppedPackets  uint64 `json:"dropped_packets"`
}

// CQInfo is a completion queue.
type CQInfo struct {
	Device string `json:"device"`
	CQN    uint32 `json:"cqn"`
	CQE    uint32 `json:"cqe"` // depth
	// Armed: a completion event is requested (REQ_NOTIFY_CQ, or the
	// record's arm word when ArmRecord); SolicitedOnly: for a solicited
	// or error completion only.
	Armed         bool `json:"armed"`
	SolicitedOnly bool `json:"solicited_only"`
	ArmRecord     bool `json:"arm_record"`
	// Overrun: the CQ overflowed and takes no completion any more (its
	// QPs moved to ERR); LostCompletions counts those it could not take.
	Overrun bool `json:"overrun"`
	// Completions counts the CQEs written since creation, Pending those
	// the driver has not consumed yet, PI is the producer index.
	Completions      uint64 `json:"completions"`
	Pending          uint32 `json:"pending"`
	PI               uint32 `json:"pi"`
	ErrorCompletions uint64 `json:"error_completions"`
	LostCompletions  uint64 `json:"lost_completions"`
	// QPs counts the QPs using it.
	QPs int `json:"qps"`
}

// MRInfo is a memory region.
type MRInfo struct {
	Device string `json:"device"`
	LKey   uint32 `json:"lkey"`
	RKey   uint32 `json:"rkey"`
	PD     uint32 `json:"pd"`
	// Type is user (REG_MR over guest pages), dma (the guest-physical
	// space, local only) or fast (ALLOC_MR, registered by REG_MR work
	// requests); State is valid, or free for a fast MR without a
	// registration.
	Type   string `json:"type"`
	State  string `json:"state"`
	IOVA   uint64 `json:"iova"`
	Length uint64 `json:"length"`
	// Access are the access flags by name (local_write, remote_write,
	// remote_read, remote_atomic, mw_bind).
	Access      []string `json:"access"`
	PinnedBytes uint64   `json:"pinned_bytes"`
	PageSize    uint64   `json:"page_size,omitempty"`
	// Extents are the guest-physically contiguous runs the MR is kept
	// as; Windows the memory windows bound in it.
	Extents  int    `json:"extents"`
	Windows  int    `json:"windows"`
	MaxPages uint32 `json:"max_pages,omitempty"` // a fast MR's
}

// PDInfo is a protection domain and the objects naming it.
type PDInfo struct {
	Device string `json:"device"`
	PDN    uint32 `json:"pdn"`
	MRs    int    `json:"mrs"`
	MWs    int    `json:"mws"`
	QPs    int    `json:"qps"`
	SRQs   int    `json:"srqs"`
	AHs    int    `json:"ahs"`
}

// SRQInfo is a shared receive queue.
type SRQInfo struct {
	Device string `json:"device"`
	SRQN   uint32 `json:"srqn"`
	PD     uint32 `json:"pd"`
	MaxWR  uint32 `json:"max_wr"`
	MaxSGE uint32 `json:"max_sge"`
	Limit  uint32 `json:"limit"` // armed limit, 0: none
	// State is ready, or error once its producer index ran away or its
	// ring left guest memory (it takes no receive any more).
	State         string `json:"state"`
	QPs           int    `json:"qps"`
	DoorbellQueue int    `json:"doorbell_queue"`
}

// MWInfo is a memory window.
type MWInfo struct {
	Device string `json:"device"`
	RKey   uint32 `json:"rkey"`
	PD     uint32 `json:"pd"`
	Type   int    `json:"type"`  // 1 or 2
	State  string `json:"state"` // bound or free
	// Bound: the MR (its lkey) and the range of its IOVA space, the
	// access it grants, and a type 2 window's QP.
	MR     uint32   `json:"mr,omitempty"`
	Addr   uint64   `json:"addr"`
	Length uint64   `json:"length"`
	Access []string `json:"access"`
	QPN    uint32   `json:"qpn,omitempty"`
}

// Resources is every device's object counts (GET /v1/resources).
func (c *Client) Resources(ctx context.Context) ([]ResourceCount, error) {
	var out []ResourceCount
	if err := c.do(ctx, http.MethodGet, PathResources, nil, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// QPs lists device id's QPs, or every device's when id is "".
func (c *Client) QPs(ctx context.Context, id string) ([]QPInfo, error) {
	return listAll[QPInfo](ctx, c, listPath(id, "qps"))
}

// CQs lists device id's CQs, or every device's when id is "".
func (c *Client) CQs(ctx context.Context, id string) ([]CQInfo, error) {
	return listAll[CQInfo](ctx, c, listPath(id, "cqs"))
}

// MRs lists device id's MRs, or every device's when id is "".
func (c *Client) MRs(ctx context.Context, id string) ([]MRInfo, error) {
	return listAll[MRInfo](ctx, c, listPath(id, "mrs"))
}

// PDs lists device id's PDs, or every device's when id is "".
func (c *Client) PDs(ctx context.Context, id string) ([]PDInfo, error) {
	return listAll[PDInfo](ctx, c, listPath(id, "pds"))
}

// SRQs lists device id's SRQs, or every device's when id is "".
func (c *Client) SRQs(ctx context.Context, id string) ([]SRQInfo, error) {
	return listAll[SRQInfo](ctx, c, listPath(id, "srqs"))
}

// MWs lists device id's memory windows, or every device's when id is "".
func (c *Client) MWs(ctx context.Context, id string) ([]MWInfo, error) {
	return listAll[MWInfo](ctx, c, listPath(id, "mws"))
}

func listPath(id, kind string) string {
	if id == "" {
		return ResourcesPath(kind)
	}
	return DeviceResourcePath(id, kind)
}

// maxPages bounds the pages one listing follows: more than every object
// a daemon may hold, at the smallest page a daemon sends unasked.
const maxPages = 1 << 16

// listAll gets path and every page its answers' Link headers name. The
// daemon's next page is a path of the control API; anything else (another
// host, a page seen before) ends the listing with an error rather than
// a request the daemon did not mean.
func listAll[T any](ctx context.Context, c *Client, path string) ([]T, error) {
	out := []T{}
	seen := map[string]bool{}
	for range maxPages {
		var page []T
		h, err := c.exchange(ctx, http.MethodGet, path, nil, &page)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		next, err := NextPage(h)
		if err != nil {
			return nil, fmt.Errorf("GET %s: %w", path, err)
		}
		if next == "" {
			return out, nil
		}
		if seen[next] {
			return nil, fmt.Errorf("GET %s: the next page %s was listed before", path, next)
		}
		seen[next] = true
		path = next
	}
	return nil, fmt.Errorf("GET %s: more than %d pages", path, maxPages)
}

// NextPage returns the path of the next page a listing's answer names
// (its Link header's rel="next" target, RFC 8288), or "" on the last
// page. The target must be a path of the control API (/v1/…).
func NextPage(h http.Header) (string, error) {
	for _, v := range h.Values("Link") {
		for _, link := range strings.Split(v, ",") {
			target, params, ok := strings.Cut(strings.TrimSpace(link), ";")
			if !ok || !strings.HasPrefix(target, "<") || !strings.HasSuffix(target, ">") {
				continue
			}
			isNext := false
			for _, p := range strings.Split(params, ";") {
				if k, v, _ := strings.Cut(strings.TrimSpace(p), "="); strings.EqualFold(k, "rel") && strings.Trim(v, `"`) == "next" {
					isNext = true
				}
			}
			if !isNext {
				continue
			}
			u, err := url.Parse(target[1 : len(target)-1])
			if err != nil || u.Scheme != "" || u.Host != "" || !strings.HasPrefix(u.Path, "/v1/") {
				return "", fmt.Errorf("next page %q is not a path of the control API", target)
			}
			return u.RequestURI(), nil
		}
	}
	return "", nil
}
