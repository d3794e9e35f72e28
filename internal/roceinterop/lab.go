package roceinterop

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/netlab"
	"github.com/vrdma/vrdma/internal/pftexchange"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// The topology's addresses: ours in h, the rxe guest's eth0 in g's bridge.
var (
	HostIP  = netip.MustParseAddr("10.200.77.1")
	GuestIP = netip.MustParseAddr("10.200.77.2")
)

// GuestTimeout bounds one guest's life in RunGuest.
const GuestTimeout = 10 * time.Minute

// Lab is the interop topology: namespaces g and h.
type Lab struct {
	lab  *netlab.Lab // owns g and h
	G, H *netlab.NS  // immutable
}

// NewLab builds the namespaces: in g a bridge joining tap0 (the guest's)
// and a veth to h, whose end carries HostIP/24.
func NewLab() (*Lab, error) {
	nl, err := netlab.New(netlab.Config{})
	if err != nil {
		return nil, err
	}
	l, err := build(nl)
	if err != nil {
		nl.Close()
		return nil, err
	}
	return l, nil
}

// NewLabOn builds the topology in nl (a test's netlab.NewT, which closes
// it).
func NewLabOn(nl *netlab.Lab) (*Lab, error) { return build(nl) }

func build(nl *netlab.Lab) (*Lab, error) {
	g, err := nl.AddNS("g")
	if err != nil {
		return nil, err
	}
	h, err := nl.AddNS("h")
	if err != nil {
		return nil, err
	}
	steps := []func() error{
		func() error { return nl.Veth(g, "vg", h, "vh") },
		func() error { return g.AddBridge("br0") },
		func() error { return g.AddTap("tap0") },
		func() error { return g.SetMaster("tap0", "br0") },
		func() error { return g.SetMaster("vg", "br0") },
		func() error { return g.SetUp("br0", true) },
		func() error { return g.SetUp("vg", true) },
		func() error { return h.AddAddr("vh", netip.PrefixFrom(HostIP, 24)) },
		func() error { return h.SetUp("vh", true) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, fmt.Errorf("interop lab: %w", err)
		}
	}
	return &Lab{lab: nl, G: g, H: h}, nil
}

// Close removes the namespaces (NewLab's; a NewLabOn lab belongs to its
// caller).
func (l *Lab) Close() error { return l.lab.Close() }

// Guest says how to boot the rxe guest.
type Guest struct {
	// QEMU, Kernel and Initrd: the binary and bin/rxe's vmlinux and
	// initramfs.img. Required.
	QEMU, Kernel, Initrd string
	// Role is perftest's role in the guest: "client" (it connects to
	// HostIP) or "server".
	Role string
	// Jobs are guest/perftest-jobs' OP:SIZE:ITERS.
	Jobs []Job
	// Dump is the pcap QEMU's filter-dump writes (the guest's link).
	Dump string
}

// RxeImage returns bin/rxe's kernel and initramfs under root, or an error
// naming what is missing (make rxe-image).
func RxeImage(root string) (kernel, initrd string, err error) {
	kernel, initrd = filepath.Join(root, "bin", "rxe", "vmlinux"), filepath.Join(root, "bin", "rxe", "initramfs.img")
	for _, f := range []string{kernel, initrd} {
		if _, err := os.Stat(f); err != nil {
			return "", "", fmt.Errorf("rxe image: %w (make rxe-image)", err)
		}
	}
	return kernel, initrd, nil
}

// RunGuest boots the rxe guest in g, waits until it powered off and
// returns its results and console log. QEMU is started on g's thread, so
// it lives in g; its Pdeathsig is tied to that thread, so the guest's
// whole life runs inside Do.
func (l *Lab) RunGuest(ctx context.Context, cfg Guest) ([]guestvm.Result, string, error) {
	if cfg.Role != "client" && cfg.Role != "server" {
		return nil, "", fmt.Errorf("rxe guest: role %q: want client or server", cfg.Role)
	}
	app := "rxe.role=" + cfg.Role + " rxe.ip=" + GuestIP.String() + " rxe.runs=1 rxe.gid=1"
	if cfg.Role == "client" {
		app += " rxe.peer=" + HostIP.String()
	}
	jobs := make([]string, len(cfg.Jobs))
	for i, j := range cfg.Jobs {
		jobs[i] = j.String()
	}
	gcfg := guestvm.Config{
		Name: "rxe-interop-" + cfg.Role, QEMU: cfg.QEMU, Kernel: cfg.Kernel, Initrd: cfg.Initrd,
		SMP: 1, HugePages: 1, Run: "perftest", Args: jobs, Append: app,
		ExtraQEMUArgs: []string{
			"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=n0,romfile=,mac=52:54:00:77:00:02",
			"-object", "filter-dump,id=dump0,netdev=n0,file=" + cfg.Dump + ",maxlen=65536",
		},
	}
	var results []guestvm.Result
	var glog string
	err := l.G.Do(func() error {
		ctx, cancel := context.WithTimeout(ctx, GuestTimeout)
		defer cancel()
		guest, err := guestvm.Boot(ctx, gcfg)
		if err != nil {
			return err
		}
		defer guest.Close()
		results, err = guest.WaitResult(ctx)
		glog = guest.Log()
		return err
	})
	if err != nil {
		return results, glog, fmt.Errorf("rxe guest (%s): %w", cfg.Role, err)
	}
	return results, glog, nil
}

// Listen opens perftest's TCP port on HostIP in h (for a guest client).
func (l *Lab) Listen() (net.Listener, error) {
	var ln net.Listener
	err := l.H.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(HostIP, Port).String())
		return err
	})
	return ln, err
}

// Port is perftest's TCP port.
const Port = pftexchange.Port

// Dial connects from h to the guest's perftest server, retrying while it
// is not listening yet (it boots, and starts one server per job).
func (l *Lab) Dial(ctx context.Context) (net.Conn, error) {
	var conn net.Conn
	err := l.H.Do(func() error {
		d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(HostIP, 0))}
		for {
			c, err := d.DialContext(ctx, "tcp4", netip.AddrPortFrom(GuestIP, Port).String())
			if err == nil {
				conn = c
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("dial perftest server %s: %w", GuestIP, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	return conn, err
}

// ErrNoRoCEBind means the vrdmad binary has no --roce-bind flag.
var ErrNoRoCEBind = errors.New("vrdmad has no --roce-bind flag")

// Vrdmad is a vrdmad started by StartVrdmad.
type Vrdmad struct {
	*vrdmadproc.Proc
}

// StartVrdmad starts cfg's vrdmad in h (vrdmadproc's NetNS) with
// --roce-bind HostIP added to cfg.Args; its sockets are paths, which every
// namespace reaches. (vrdmadproc forks it from a thread that lives as long
// as vrdmad, so netlab's NS.Do, which ends its threads, cannot fire its
// Pdeathsig.)
func (l *Lab) StartVrdmad(ctx context.Context, cfg vrdmadproc.Config) (*Vrdmad, error) {
	if b, err := os.ReadFile(cfg.Binary); err == nil && !strings.Contains(string(b), "roce-bind") {
		return nil, fmt.Errorf("%s: %w", cfg.Binary, ErrNoRoCEBind)
	}
	cfg.NetNS = l.H.Name
	cfg.Args = append(append([]string(nil), cfg.Args...), "--roce-bind", HostIP.String())
	p, err := vrdmadproc.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Vrdmad{Proc: p}, nil
}
