package hostnic

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/backend/rdma/hostnic/ibv"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// ErrSpec reports an --rnic value that is neither soft nor verbs:DEVICE[:PORT].
var ErrSpec = errors.New("rnic: want soft or verbs:DEVICE[:PORT]")

// Spec is a parsed --rnic value.
type Spec struct {
	Verbs  bool   // false: the software RNIC ("soft")
	Device string // the host RDMA device (verbs)
	Port   int    // its port, 1 when not given (verbs)
}

// ParseSpec parses "soft" or "verbs:DEVICE[:PORT]".
func ParseSpec(s string) (Spec, error) {
	if s == "soft" {
		return Spec{}, nil
	}
	rest, ok := strings.CutPrefix(s, "verbs:")
	if !ok || rest == "" {
		return Spec{}, fmt.Errorf("%w: %q", ErrSpec, s)
	}
	dev, port, hasPort := strings.Cut(rest, ":")
	sp := Spec{Verbs: true, Device: dev, Port: 1}
	if dev == "" || len(dev) > 64 || strings.ContainsAny(dev, "/ \t\n") {
		return Spec{}, fmt.Errorf("%w: device name %q", ErrSpec, dev)
	}
	if hasPort {
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 255 {
			return Spec{}, fmt.Errorf("%w: port %q (1 … 255)", ErrSpec, port)
		}
		sp.Port = p
	}
	return sp, nil
}

// String is the canonical form: "soft" or "verbs:DEVICE:PORT".
func (s Spec) String() string {
	if !s.Verbs {
		return "soft"
	}
	return fmt.Sprintf("verbs:%s:%d", s.Device, s.Port)
}

var (
	openMu sync.Mutex
	opened = map[Spec]*NIC{}
)

// Open returns the NIC for a verbs spec, opening the device the first
// time: every device of a daemon on the same host port shares one
// rdma-core context (their objects are apart by PD, as two processes' are).
// The NIC lives as long as the process. Errors say what is missing: the
// library (and the Debian packages that bring it), the device (and the
// ones there are), the port, or a usable GID.
func Open(s Spec, log *logrus.Entry) (*NIC, error) {
	if !s.Verbs {
		return nil, fmt.Errorf("rnic %s is not a host NIC", s)
	}
	openMu.Lock()
	defer openMu.Unlock()
	if n := opened[s]; n != nil {
		return n, nil
	}
	n, err := open(s, log)
	if err != nil {
		return nil, fmt.Errorf("rnic %s: %w", s, err)
	}
	opened[s] = n
	return n, nil
}

// Opened returns the NICs Open has opened in this process, sorted by
// name: what a metrics scrape reports (Stats).
func Opened() []*NIC {
	openMu.Lock()
	defer openMu.Unlock()
	out := make([]*NIC, 0, len(opened))
	for _, n := range opened {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// NIC is one port of a host RDMA device, through rdma-core. It implements
// rdma.HostNIC.
type NIC struct {
	spec  Spec
	log   *logrus.Entry
	ctx   *ibv.Context
	attr  ibv.DeviceAttr
	port  ibv.PortAttr
	gids  [][16]byte // the port's RoCE v2 GIDs
	gidIx []int      // their indexes in the host table
	ch    *ibv.CompChannel

	mu      sync.Mutex
	notify  map[uint64]func()       // a CQ's notify, by its user context (protected by mu)
	watch   map[uint64]func(uint32) // devices watching port events (protected by mu)
	nextSub uint64                  // protected by mu
	nextCQ  atomic.Uint64

	// Counters (Stats).
	posted  atomic.Uint64 // work requests posted
	postNs  atomic.Uint64 // host CPU time spent in ibv_post_send/recv
	polled  atomic.Uint64 // completions polled
	events  atomic.Uint64 // CQ events
	asyncEv atomic.Uint64 // async events
}

func open(s Spec, log *logrus.Entry) (*NIC, error) {
	if log == nil {
		l := logrus.New()
		l.SetLevel(logrus.PanicLevel)
		log = logrus.NewEntry(l)
	}
	if err := ibv.Load(); err != nil {
		return nil, err
	}
	ctx, err := ibv.Open(s.Device)
	if err != nil {
		return nil, err
	}
	n := &NIC{spec: s, log: log.WithField("rnic", s.String()), ctx: ctx, notify: map[uint64]func(){},
		watch: map[uint64]func(uint32){}}
	fail := func(err error) (*NIC, error) {
		ctx.Close()
		return nil, err
	}
	if n.attr, err = ctx.QueryDevice(); err != nil {
		return fail(err)
	}
	if s.Port > n.attr.PhysPortCnt {
		return fail(fmt.Errorf("%s has %d port(s), not %d", s.Device, n.attr.PhysPortCnt, s.Port))
	}
	if n.port, err = ctx.QueryPort(s.Port); err != nil {
		return fail(err)
	}
	if n.port.LinkLayer != ibv.LinkLayerEthernet {
		return fail(fmt.Errorf("%s port %d is not Ethernet (RoCE): vrdma devices reach their peers by RoCE v2 GIDs", s.Device, s.Port))
	}
	for i := range n.port.GIDTblLen {
		g, err := ctx.QueryGID(s.Port, i)
		if err != nil || g == (ibv.GID{}) {
			continue
		}
		if t, err := ctx.GIDType(s.Port, i); err != nil || t != ibv.GIDTypeRoCEv2 {
			continue
		}
		n.gids = append(n.gids, g)
		n.gidIx = append(n.gidIx, i)
	}
	if len(n.gids) == 0 {
		return fail(fmt.Errorf("%s port %d has no RoCE v2 GID (give its netdev an address)", s.Device, s.Port))
	}
	if n.ch, err = ctx.NewCompChannel(); err != nil {
		return fail(err)
	}
	go n.cqEvents()
	go n.asyncEvents()
	n.log.WithFields(logrus.Fields{"fw": n.attr.FWVer, "gids": len(n.gids), "mtu": n.port.ActiveMTU}).Info("host RDMA NIC opened")
	return n, nil
}

// cqEvents re-arms each CQ that had a completion and calls its notify.
func (n *NIC) cqEvents() {
	for {
		cq, err := n.ch.GetCQEvent()
		if err != nil {
			n.log.WithError(err).Error("CQ events stopped")
			return
		}
		n.events.Add(1)
		cq.AckEvents(1)
		n.mu.Lock()
		f := n.notify[cq.UserContext()]
		n.mu.Unlock()
		if f == nil {
			continue // destroyed meanwhile
		}
		if err := cq.ReqNotify(false); err != nil {
			n.log.WithError(err).Warn("re-arm host CQ")
		}
		f()
	}
}

// asyncEvents logs the device's asynchronous events and passes those of
// the port and the device to the devices watching (they become the guest's
// PORT_ACTIVE, PORT_ERROR and DEVICE_FATAL events). QP and CQ errors reach
// the guest through the completions they come with (an error completion
// moves the device's QP to ERR).
func (n *NIC) asyncEvents() {
	for {
		ev, err := n.ctx.GetAsyncEvent()
		if err != nil {
			n.log.WithError(err).Error("async events stopped")
			return
		}
		n.asyncEv.Add(1)
		f := logrus.Fields{"event": ev.Type.String()}
		if ev.HasQP {
			f["qp"] = ev.QPNum
		}
		if ev.Port != 0 {
			f["port"] = ev.Port
		}
		n.log.WithFields(f).Warn("host NIC async event")
		var out uint32
		switch {
		case ev.Type == ibv.EventPortActive && ev.Port == n.spec.Port:
			out = abi.EventPortActive
		case ev.Type == ibv.EventPortErr && ev.Port == n.spec.Port:
			out = abi.EventPortError
		case ev.Type == ibv.EventDeviceFatal:
			out = abi.EventDeviceFatal
		default:
			continue
		}
		n.mu.Lock()
		ws := make([]func(uint32), 0, len(n.watch))
		for _, w := range n.watch {
			ws = append(ws, w)
		}
		n.mu.Unlock()
		for _, w := range ws {
			w(out)
		}
	}
}

// Watch calls fn with the device's events for the port (PORT_ACTIVE,
// PORT_ERROR) and the device (DEVICE_FATAL) until stop is called.
func (n *NIC) Watch(fn func(event uint32)) (stop func()) {
	n.mu.Lock()
	n.nextSub++
	id := n.nextSub
	n.watch[id] = fn
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		delete(n.watch, id)
		n.mu.Unlock()
	}
}

// Name is the NIC as --rnic names it.
func (n *NIC) Name() string { return n.spec.String() }

// Limits are the NIC's own (they cap a device's).
func (n *NIC) Limits() rdma.Limits {
	u := func(v int) uint32 {
		if v <= 0 {
			return 1
		}
		return uint32(min(v, 1<<30))
	}
	a := &n.attr
	return rdma.Limits{
		MaxQP: u(a.MaxQP), MaxQPWR: u(a.MaxQPWR), MaxSGE: u(min(a.MaxSGE, a.MaxSGERd)), MaxCQ: u(a.MaxCQ),
		MaxCQE: u(a.MaxCQE), MaxMR: u(a.MaxMR), MaxPD: u(a.MaxPD), MaxAH: u(max(a.MaxAH, 1)),
		MaxMRSize: a.MaxMRSize, MaxQPRdAtom: u(min(a.MaxQPRdAtom, a.MaxQPInitRdAtom)),
	}
}

// ActiveMTU is the port's active MTU.
func (n *NIC) ActiveMTU() uint32 {
	m := uint32(n.port.ActiveMTU)
	if m < abi.MTU256 || m > abi.MTU4096 {
		return abi.MTU1024
	}
	return m
}

// GIDs are the port's RoCE v2 GIDs.
func (n *NIC) GIDs() [][16]byte { return append([][16]byte(nil), n.gids...) }

// HostGIDIndex returns gid's index in the host port's table.
func (n *NIC) HostGIDIndex(gid [16]byte) (int, bool) {
	for i, g := range n.gids {
		if g == gid {
			return n.gidIx[i], true
		}
	}
	return 0, false
}

// Stats are the NIC's counters, over every device using it.
type Stats struct {
	Posted      uint64 // work requests posted
	PostNanos   uint64 // host CPU time in ibv_post_send/ibv_post_recv
	Completions uint64 // completions polled
	CQEvents    uint64
	AsyncEvents uint64
}

// Stats returns the counters.
func (n *NIC) Stats() Stats {
	return Stats{Posted: n.posted.Load(), PostNanos: n.postNs.Load(), Completions: n.polled.Load(),
		CQEvents: n.events.Load(), AsyncEvents: n.asyncEv.Load()}
}

// AllocPD allocates a host PD.
func (n *NIC) AllocPD() (engine.NICPD, error) {
	pd, err := n.ctx.AllocPD()
	if err != nil {
		return nil, err
	}
	return &nicPD{n: n, pd: pd}, nil
}

// CreateCQ creates a host CQ on the NIC's completion channel, armed.
func (n *NIC) CreateCQ(depth uint32, notify func()) (engine.NICCQ, error) {
	id := n.nextCQ.Add(1)
	n.mu.Lock()
	n.notify[id] = notify
	n.mu.Unlock()
	cq, err := n.ctx.CreateCQ(int(depth), n.ch, id)
	if err == nil {
		err = cq.ReqNotify(false)
		if err != nil {
			cq.Destroy()
		}
	}
	if err != nil {
		n.mu.Lock()
		delete(n.notify, id)
		n.mu.Unlock()
		return nil, err
	}
	return &nicCQ{n: n, cq: cq, id: id, wc: make([]ibv.WC, 64)}, nil
}

var _ rdma.HostNIC = (*NIC)(nil)
