// Package stacklab sets up guests of the standard-stack image
// (scripts/guest-stack-image.sh) the way a cloud host pairs them: one
// vrdmad, and per guest a vrdma device whose node GUID is the EUI-64 of the
// guest NIC's MAC (so the guest's kernel driver binds the RDMA port to
// eth0 and RoCE's GID table holds eth0's addresses), and, for two or more
// guests, a private virtio-net link between the first two (unix datagram
// sockets; nothing leaves the machine). vrdma-vmtest exec and exec-pair,
// the end-to-end tests and the benchmarks all start guests through it.
//
// Non-goals: booting the guests (vmm/guestvm.BootStack, StartStackPair
// take the Configs it returns) and building the image.
package stacklab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// Addresses of guest N (from 1): MAC 52:54:00:00:00:0N, IPv4 10.11.0.N/24.
const (
	macPrefix = "52:54:00:00:00:0"
	ipPrefix  = "10.11.0."
	ipBits    = 24
	maxGuests = 9
)

// Config says which guests to set up.
type Config struct {
	// Names are the guests, also their vrdmad device ids and host names
	// (e.g. "server", "client"); 1 to 9 of them.
	Names []string
	// VRDMAD, QEMU, Kernel and Initrd are the binaries and the image.
	VRDMAD, QEMU, Kernel, Initrd string
	// MemoryMiB and SMP are each guest's RAM and vCPUs (zero: guestvm's
	// defaults); SMP also sets the device's doorbell queues.
	MemoryMiB, SMP int
	// Append is added to each guest's kernel command line.
	Append string
	// VrdmadArgs are extra vrdmad flags.
	VrdmadArgs []string
}

// Guest is one guest's identity.
type Guest struct {
	Name string
	MAC  string
	IP   netip.Prefix
}

// Lab is a running vrdmad with one device per guest, and the guests'
// boot configurations (without a Command).
type Lab struct {
	Daemon  *vrdmadproc.Proc
	Guests  []Guest
	Configs []guestvm.StackConfig
	dir     string
}

// New starts vrdmad and adds the devices. On failure nothing stays behind.
// The caller must Close the Lab after the guests are closed.
func New(ctx context.Context, cfg Config) (*Lab, error) {
	if len(cfg.Names) == 0 || len(cfg.Names) > maxGuests {
		return nil, fmt.Errorf("stacklab: %d guests; want 1 to %d", len(cfg.Names), maxGuests)
	}
	l := &Lab{Guests: Guests(cfg.Names)}
	dir, err := os.MkdirTemp("", "vrdma-stack-")
	if err != nil {
		return nil, err
	}
	l.dir = dir
	l.Daemon, err = vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: cfg.VRDMAD, Args: cfg.VrdmadArgs})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := l.configure(ctx, cfg); err != nil {
		return nil, errors.Join(err, l.Close())
	}
	return l, nil
}

func (l *Lab) configure(ctx context.Context, cfg Config) error {
	hosts := make([]guestvm.Host, len(l.Guests))
	for i, g := range l.Guests {
		hosts[i] = guestvm.Host{Name: g.Name, IP: g.IP.Addr()}
	}
	for i, g := range l.Guests {
		// The daemon pairs the device with the NIC: node GUID = the MAC's
		// EUI-64 (docs/spec.md, "The device's MAC").
		// The guest's address is the device's (docs/security.md): its
		// kernel driver adds the GID of it, as RoCE does.
		info, err := l.Daemon.AddDevice(ctx, daemon.AddRequest{ID: g.Name,
			Socket: filepath.Join(l.Daemon.Dir(), g.Name+".sock"), MAC: g.MAC, DoorbellQueues: cfg.SMP,
			Addresses: []string{g.IP.Addr().String()}})
		if err != nil {
			return err
		}
		nic := &qemu.NIC{ID: "net0", MAC: g.MAC}
		if len(l.Guests) >= 2 && i < 2 {
			nic.LocalSocket = filepath.Join(l.dir, g.Name+".net")
			nic.RemoteSocket = filepath.Join(l.dir, l.Guests[1-i].Name+".net")
		}
		l.Configs = append(l.Configs, guestvm.StackConfig{
			Name: g.Name, QEMU: cfg.QEMU, Kernel: cfg.Kernel, Initrd: cfg.Initrd,
			MemoryMiB: cfg.MemoryMiB, SMP: cfg.SMP, NIC: nic, IP: g.IP, Hosts: hosts, Append: cfg.Append,
			Devices: []qemu.VhostUserDevice{{ID: "vrdma0", Socket: info.Socket, VirtioID: abi.DeviceID,
				NumVQs: info.NumQueues, VQSize: 256, ConfigSize: abi.ConfigSize}},
		})
	}
	return nil
}

// Guests are the identities of the guests named names, in order: guest N
// (from 1) has MAC 52:54:00:00:00:0N and IPv4 10.11.0.N/24.
func Guests(names []string) []Guest {
	gs := make([]Guest, len(names))
	for i, n := range names {
		gs[i] = Guest{Name: n, MAC: fmt.Sprintf("%s%d", macPrefix, i+1),
			IP: netip.PrefixFrom(netip.MustParseAddr(fmt.Sprintf("%s%d", ipPrefix, i+1)), ipBits)}
	}
	return gs
}

// Substitute replaces {NAME} in cmd by the address of the guest NAME of gs.
func Substitute(cmd string, gs []Guest) string {
	for _, g := range gs {
		cmd = strings.ReplaceAll(cmd, "{"+g.Name+"}", g.IP.Addr().String())
	}
	return cmd
}

// Substitute replaces {NAME} in cmd by the address of the lab's guest NAME.
func (l *Lab) Substitute(cmd string) string { return Substitute(cmd, l.Guests) }

// Close stops vrdmad (its error holds the daemon's log) and removes the
// lab's files.
func (l *Lab) Close() error {
	var err error
	if l.Daemon != nil {
		err = l.Daemon.Stop()
	}
	os.RemoveAll(l.dir)
	return err
}
