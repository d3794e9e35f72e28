package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/units"
)

// The resource views, as iproute2's `rdma resource show` prints an RNIC's:
// one line per object of `key value` pairs, the keys those of the API's
// JSON (--json prints the JSON itself). Fields that do not apply (the
// peer of a QP not connected yet) and error counters at zero are left
// out of the line.

// resourceKinds are the kinds `resource show` takes, singular as
// iproute2 spells them, with the API's path word.
var resourceKinds = []struct{ name, kind string }{
	{"qp", "qps"}, {"cq", "cqs"}, {"mr", "mrs"}, {"pd", "pds"}, {"srq", "srqs"}, {"mw", "mws"},
}

// kindOf is the API kind of a resource show argument (qp or qps).
func kindOf(arg string) (string, bool) {
	for _, k := range resourceKinds {
		if arg == k.name || arg == k.kind {
			return k.kind, true
		}
	}
	return "", false
}

func resourceKindNames() []string {
	var out []string
	for _, k := range resourceKinds {
		out = append(out, k.name)
	}
	return out
}

// defineDeviceObjects is `device qps|cqs|mrs|pds|srqs|mws ID`.
func defineDeviceObjects(kind string) func(*flag.FlagSet, *cli) func([]string) error {
	return func(_ *flag.FlagSet, c *cli) func([]string) error {
		return func(pos []string) error {
			if err := wantArgs("device "+kind, pos, "ID"); err != nil {
				return err
			}
			return c.printObjects(kind, pos[0])
		}
	}
}

// defineResourceShow is `resource show [qp|cq|mr|pd|srq|mw]`.
func defineResourceShow(_ *flag.FlagSet, c *cli) func([]string) error {
	return func(pos []string) error {
		switch len(pos) {
		case 0:
			return c.printCounts()
		case 1:
			kind, ok := kindOf(pos[0])
			if !ok {
				return usageErr("resource show %q: want one of %s", pos[0], strings.Join(resourceKindNames(), ", "))
			}
			return c.printObjects(kind, "")
		}
		return usageErr("resource show takes at most one of %s (got %d arguments)", strings.Join(resourceKindNames(), ", "), len(pos))
	}
}

// printCounts prints each device's objects by kind.
func (c *cli) printCounts() error {
	counts, err := c.api().Resources(context.Background())
	if err != nil {
		return apiErr(err)
	}
	if counts == nil {
		counts = []controlapi.ResourceCount{}
	}
	if c.json {
		return printJSON(c.out, counts)
	}
	for _, r := range counts {
		var l kvLine
		l.add("device", r.Device)
		l.add("connected", strconv.FormatBool(r.Connected))
		for _, kv := range []struct {
			k string
			n int
		}{{"pds", r.PDs}, {"mrs", r.MRs}, {"mws", r.MWs}, {"cqs", r.CQs}, {"qps", r.QPs}, {"srqs", r.SRQs}, {"ahs", r.AHs}} {
			l.add(kv.k, strconv.Itoa(kv.n))
		}
		if err := l.print(c.out); err != nil {
			return err
		}
	}
	return nil
}

// printObjects prints device id's objects of kind, or every device's
// when id is "".
func (c *cli) printObjects(kind, id string) error {
	ctx := context.Background()
	api := c.api()
	var (
		list  any
		lines []kvLine
		err   error
	)
	switch kind {
	case "qps":
		list, lines, err = fetchLines(ctx, id, api.QPs, qpLine)
	case "cqs":
		list, lines, err = fetchLines(ctx, id, api.CQs, cqLine)
	case "mrs":
		list, lines, err = fetchLines(ctx, id, api.MRs, mrLine)
	case "pds":
		list, lines, err = fetchLines(ctx, id, api.PDs, pdLine)
	case "srqs":
		list, lines, err = fetchLines(ctx, id, api.SRQs, srqLine)
	case "mws":
		list, lines, err = fetchLines(ctx, id, api.MWs, mwLine)
	default:
		return usageErr("no resource kind %q", kind)
	}
	if err != nil {
		return apiErr(err)
	}
	if c.json {
		return printJSON(c.out, list)
	}
	for _, l := range lines {
		if err := l.print(c.out); err != nil {
			return err
		}
	}
	return nil
}

// fetchLines lists one kind of object with get and renders each with
// line; the list itself is what --json prints.
func fetchLines[T any](ctx context.Context, id string, get func(context.Context, string) ([]T, error),
	line func(T) kvLine) (any, []kvLine, error) {
	list, err := get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	out := make([]kvLine, 0, len(list))
	for _, v := range list {
		out = append(out, line(v))
	}
	return list, out, nil
}

// kvLine is one object's line of `key value` pairs.
type kvLine struct{ kv []string }

func (l *kvLine) add(k, v string) {
	if v == "" {
		v = "-"
	}
	l.kv = append(l.kv, k, v)
}

// addNZ adds a counter unless it is zero.
func (l *kvLine) addNZ(k string, n uint64) {
	if n != 0 {
		l.add(k, strconv.FormatUint(n, 10))
	}
}

func (l *kvLine) print(w io.Writer) error {
	_, err := fmt.Fprintln(w, strings.Join(l.kv, " "))
	return err
}

func hex(n uint32) string { return fmt.Sprintf("0x%x", n) }

func u32(n uint32) string { return strconv.FormatUint(uint64(n), 10) }

func qpLine(q controlapi.QPInfo) kvLine {
	var l kvLine
	l.add("device", q.Device)
	l.add("qpn", u32(q.QPN))
	l.add("type", q.Type)
	l.add("state", q.State)
	l.add("pd", u32(q.PD))
	l.add("send_cq", u32(q.SendCQ))
	l.add("recv_cq", u32(q.RecvCQ))
	if q.SRQ != 0 {
		l.add("srq", u32(q.SRQ))
	}
	if q.Transport != "" {
		l.add("transport", q.Transport)
	}
	if q.DestGID != "" {
		l.add("dest_gid", q.DestGID)
		l.add("dest_qpn", u32(q.DestQPN))
	}
	if q.SGIDIndex != nil {
		l.add("sgid_index", u32(*q.SGIDIndex))
	}
	if q.PathMTU != 0 {
		l.add("path_mtu", strconv.Itoa(q.PathMTU))
	}
	if q.Paths != 0 {
		l.add("paths", strconv.Itoa(q.Paths))
	}
	if q.SQPSN != nil && q.RQPSN != nil {
		l.add("sq_psn", u32(*q.SQPSN))
		l.add("rq_psn", u32(*q.RQPSN))
	}
	if q.QKey != nil {
		l.add("qkey", hex(*q.QKey))
	}
	l.add("sq_depth", u32(q.SQDepth))
	l.add("rq_depth", u32(q.RQDepth))
	if len(q.Access) > 0 {
		l.add("access", strings.Join(q.Access, ","))
	}
	e := q.Errors
	for _, s := range slices.Sorted(maps.Keys(e.Completions)) {
		l.addNZ("completions."+s, e.Completions[s])
	}
	for _, s := range slices.Sorted(maps.Keys(e.Responder)) {
		l.addNZ("responder."+s, e.Responder[s])
	}
	for _, c := range []struct {
		k string
		n uint64
	}{
		{"rnr_naks_sent", e.RNRNAKsSent}, {"rnr_naks_received", e.RNRNAKsReceived}, {"wrong_peer", e.WrongPeer},
		{"malformed_wqes", e.MalformedWQEs}, {"ud_dropped", e.UDDropped}, {"retransmits", e.Retransmits},
		{"timeouts", e.Timeouts}, {"seq_naks_sent", e.SeqNAKsSent}, {"seq_naks_received", e.SeqNAKsReceived},
		{"naks_sent", e.NAKsSent}, {"naks_received", e.NAKsReceived}, {"duplicates", e.Duplicates},
		{"dropped_packets", e.DroppedPackets},
	} {
		l.addNZ(c.k, c.n)
	}
	return l
}

func cqLine(c controlapi.CQInfo) kvLine {
	var l kvLine
	l.add("device", c.Device)
	l.add("cqn", u32(c.CQN))
	l.add("cqe", u32(c.CQE))
	armed := "no"
	switch {
	case c.Armed && c.SolicitedOnly:
		armed = "solicited"
	case c.Armed:
		armed = "yes"
	}
	l.add("armed", armed)
	l.add("overrun", strconv.FormatBool(c.Overrun))
	l.add("completions", strconv.FormatUint(c.Completions, 10))
	l.add("pending", u32(c.Pending))
	l.add("qps", strconv.Itoa(c.QPs))
	l.addNZ("error_completions", c.ErrorCompletions)
	l.addNZ("lost_completions", c.LostCompletions)
	return l
}

func mrLine(m controlapi.MRInfo) kvLine {
	var l kvLine
	l.add("device", m.Device)
	l.add("lkey", hex(m.LKey))
	l.add("rkey", hex(m.RKey))
	l.add("pd", u32(m.PD))
	l.add("type", m.Type)
	l.add("state", m.State)
	if m.Type != "dma" && m.State == "valid" {
		l.add("iova", fmt.Sprintf("0x%x", m.IOVA))
		l.add("length", units.FormatBytes(m.Length))
	}
	if len(m.Access) > 0 {
		l.add("access", strings.Join(m.Access, ","))
	}
	l.add("pinned_bytes", units.FormatBytes(m.PinnedBytes))
	if m.MaxPages != 0 {
		l.add("max_pages", u32(m.MaxPages))
	}
	if m.Windows != 0 {
		l.add("windows", strconv.Itoa(m.Windows))
	}
	return l
}

func pdLine(p controlapi.PDInfo) kvLine {
	var l kvLine
	l.add("device", p.Device)
	l.add("pdn", u32(p.PDN))
	for _, kv := range []struct {
		k string
		n int
	}{{"mrs", p.MRs}, {"mws", p.MWs}, {"qps", p.QPs}, {"srqs", p.SRQs}, {"ahs", p.AHs}} {
		l.add(kv.k, strconv.Itoa(kv.n))
	}
	return l
}

func srqLine(s controlapi.SRQInfo) kvLine {
	var l kvLine
	l.add("device", s.Device)
	l.add("srqn", u32(s.SRQN))
	l.add("pd", u32(s.PD))
	l.add("state", s.State)
	l.add("max_wr", u32(s.MaxWR))
	l.add("max_sge", u32(s.MaxSGE))
	l.add("limit", u32(s.Limit))
	l.add("qps", strconv.Itoa(s.QPs))
	return l
}

func mwLine(w controlapi.MWInfo) kvLine {
	var l kvLine
	l.add("device", w.Device)
	l.add("rkey", hex(w.RKey))
	l.add("pd", u32(w.PD))
	l.add("type", strconv.Itoa(w.Type))
	l.add("state", w.State)
	if w.State == "bound" {
		l.add("mr", hex(w.MR))
		l.add("addr", fmt.Sprintf("0x%x", w.Addr))
		l.add("length", units.FormatBytes(w.Length))
		l.add("access", strings.Join(w.Access, ","))
		if w.QPN != 0 {
			l.add("qpn", u32(w.QPN))
		}
	}
	return l
}
