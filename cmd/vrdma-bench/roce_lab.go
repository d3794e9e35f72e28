package main

// The roce section's lab: two network namespaces joined by one veth, each
// holding the RoCE endpoint of an in-process daemon with one device.

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/backend/rdma/roce/udp"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/memmap"
)

// netlab.Range6: the rows with UDP segmentation offload run over IPv6 (an
// IPv4 endpoint never sends GSO: the segments' IDs would not be 0,
// backend/rdma/roce/udp).
var (
	roceAddrs  = [2]netip.Addr{netip.MustParseAddr("10.200.250.1"), netip.MustParseAddr("10.200.250.2")}
	roceAddrs6 = [2]netip.Addr{netip.MustParseAddr("fd00:7672:fa::1"), netip.MustParseAddr("fd00:7672:fa::2")}
)

// roceLab is two namespaces joined by one veth (MTU 1500), each holding
// the RoCE endpoint of an in-process daemon with one device: A's device
// reaches B's only over the network, as two hosts' would.
type roceLab struct {
	lab   *netlab.Lab
	ns    [2]*netlab.NS
	nets  [2]*hostnet.Network
	rigs  [2]*rig
	socks [2]string
	pmtu  roce.MTU // the path MTU the endpoints derived from the link
}

func newRoceLab() (l *roceLab, err error) {
	if err := netlab.Available(); err != nil {
		return nil, err
	}
	if _, err := netlab.Sweep(roceLabPrefix); err != nil {
		return nil, err
	}
	lab, err := netlab.New(netlab.Config{Prefix: roceLabPrefix})
	if err != nil {
		return nil, err
	}
	l = &roceLab{lab: lab}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	for i, label := range []string{"ra", "rb"} {
		if l.ns[i], err = lab.AddNS(label); err != nil {
			return nil, err
		}
		// Before the links exist: their IPv6 addresses are usable at
		// once, without duplicate address detection.
		if err := l.ns[i].Sysctl("net.ipv6.conf.default.accept_dad", "0"); err != nil {
			return nil, err
		}
	}
	links := [2]string{"va", "vb"}
	if err := lab.Veth(l.ns[0], links[0], l.ns[1], links[1]); err != nil {
		return nil, err
	}
	for i, ns := range l.ns {
		if err := ns.SetMTU(links[i], roceLinkMTU); err != nil {
			return nil, err
		}
		if err := ns.AddAddr(links[i], netip.PrefixFrom(roceAddrs[i], 24)); err != nil {
			return nil, err
		}
		if err := ns.AddAddr(links[i], netip.PrefixFrom(roceAddrs6[i], 64)); err != nil {
			return nil, err
		}
		if err := ns.SetUp(links[i], true); err != nil {
			return nil, err
		}
	}
	quiet := logrus.New()
	quiet.SetLevel(logrus.PanicLevel)
	for i, ns := range l.ns {
		n, err := hostnet.New(udp.Config{RecoverIPv4ID: true}, 1)
		if err != nil {
			return nil, err
		}
		l.nets[i] = n
		// The endpoint's socket, and the link MTU it reads, are those
		// of the namespace; its goroutines run anywhere.
		if err := ns.Do(func() error {
			for _, a := range []netip.Addr{roceAddrs[i], roceAddrs6[i]} {
				if _, err := n.Listen(a); err != nil {
					return err
				}
			}
			l.pmtu = udp.LinkPMTU(roceAddrs[i])
			return nil
		}); err != nil {
			return nil, fmt.Errorf("roce endpoint in %s: %w", ns.Label, err)
		}
		dir, err := os.MkdirTemp("", "vrdma-bench-roce-")
		if err != nil {
			return nil, err
		}
		l.rigs[i] = &rig{d: daemon.New(logrus.NewEntry(quiet), daemon.Config{Pool: enginePool, Pin: memmap.PinConfig{},
			RoCE: n, RoCEAddrs: []netip.Addr{roceAddrs[i], roceAddrs6[i]}}), dir: dir}
		if l.socks[i], err = l.rigs[i].device(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// close removes everything: the daemons, their endpoints (whose sockets
// would keep the namespaces alive), the namespaces. The front-ends must
// be closed first.
func (l *roceLab) close() {
	for _, r := range l.rigs {
		if r != nil {
			r.close()
		}
	}
	for _, n := range l.nets {
		if n != nil {
			n.Close()
		}
	}
	l.lab.Close()
}

// counters sums the counters of daemon i's endpoints of one family.
func (l *roceLab) counters(i int, v6 bool) udp.Counters {
	var c udp.Counters
	for _, e := range l.nets[i].Endpoints() {
		if e.LocalAddr().Addr().Is6() != v6 {
			continue
		}
		x := e.Counters()
		c.TxDatagrams += x.TxDatagrams
		c.RxDatagrams += x.RxDatagrams
		c.TxErrors += x.TxErrors
		c.TxCalls += x.TxCalls
		c.RxCalls += x.RxCalls
		c.TxGSO += x.TxGSO
		c.RxGRO += x.RxGRO
	}
	return c
}

// setOffload turns GSO and GRO on or off on both daemons' IPv6 endpoints.
func (l *roceLab) setOffload(on bool) error {
	for _, n := range l.nets {
		for _, e := range n.Endpoints() {
			if e.LocalAddr().Addr().Is6() {
				if err := e.SetOffload(on, on); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
