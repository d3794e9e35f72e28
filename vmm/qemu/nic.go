package qemu

import (
	"net"
	"strconv"
	"strings"
)

// Names QEMU objects of a NIC get.
const (
	// netSuffix names a NIC's netdev: ID+"-net".
	netSuffix = "-net"
	// nicDevice is the NIC model: virtio-net, which the guest kernels have.
	nicDevice = "virtio-net-pci"
)

// NIC is a virtio-net-pci network card. Its back-end (a QEMU netdev) is one
// of:
//
//   - a pair of unix datagram sockets ("-netdev dgram"), when LocalSocket
//     and RemoteSocket are set: QEMU binds LocalSocket and sends every frame
//     to RemoteSocket. Two VMs whose NICs name the same two sockets the other
//     way round share a private Ethernet link: no host privileges, no host
//     interface, nothing leaves the machine. Frames sent before the peer
//     has bound its socket are dropped, as on a cable not yet plugged in.
//   - a hub port of its own ("-netdev hubport"), when both are empty: the
//     guest sees a NIC whose link is up and on which nothing answers.
type NIC struct {
	// ID is the QEMU device id, with the same rules as VhostUserDevice.ID;
	// the netdev is named ID+"-net".
	ID string
	// MAC is the card's Ethernet address ("52:54:00:00:00:01"): a unicast
	// address of six bytes. Empty lets QEMU pick one.
	MAC string
	// LocalSocket is the unix datagram socket this QEMU binds (an existing
	// file there is replaced); RemoteSocket is the peer's LocalSocket. Set
	// both or neither.
	LocalSocket, RemoteSocket string
}

// validate checks n; field prefixes the field names in errors.
func (n NIC) validate(field string) error {
	if err := validateID(field+".ID", n.ID); err != nil {
		return err
	}
	if n.MAC != "" {
		hw, err := net.ParseMAC(n.MAC)
		switch {
		case err != nil || len(hw) != 6:
			return configErr(field+".MAC", "%q is not a 6-byte Ethernet address (52:54:00:12:34:56)", n.MAC)
		case hw[0]&1 != 0:
			return configErr(field+".MAC", "%s is a multicast address", n.MAC)
		}
	}
	if (n.LocalSocket == "") != (n.RemoteSocket == "") {
		return configErr(field+".LocalSocket", "set LocalSocket and RemoteSocket together, or neither (a hub port)")
	}
	for _, s := range []struct{ name, path string }{{"LocalSocket", n.LocalSocket}, {"RemoteSocket", n.RemoteSocket}} {
		if s.path == "" {
			continue
		}
		if err := validatePath(field+"."+s.name, s.path); err != nil {
			return err
		}
		if len(s.path) > maxUnixPath {
			return configErr(field+"."+s.name, "%d bytes, a unix socket path holds at most %d", len(s.path), maxUnixPath)
		}
	}
	if n.LocalSocket != "" && n.LocalSocket == n.RemoteSocket {
		return configErr(field+".RemoteSocket", "the same socket as LocalSocket (the NIC would hear itself)")
	}
	return nil
}

// netdevValue returns the "-netdev" value for n; hub is the hub id of a
// NIC without sockets (each gets its own).
func (n NIC) netdevValue(hub int) string {
	if n.LocalSocket == "" {
		return "hubport,id=" + n.ID + netSuffix + ",hubid=" + strconv.Itoa(hub)
	}
	return "dgram,id=" + n.ID + netSuffix +
		",local.type=unix,local.path=" + optEscape(n.LocalSocket) +
		",remote.type=unix,remote.path=" + optEscape(n.RemoteSocket)
}

// deviceValue returns the "-device" value for n. romfile= is empty: the
// build installs no NIC option ROMs, and direct kernel boot needs none.
func (n NIC) deviceValue() string {
	var b strings.Builder
	b.WriteString(nicDevice + ",id=" + n.ID + ",netdev=" + n.ID + netSuffix + ",romfile=")
	if n.MAC != "" {
		b.WriteString(",mac=" + n.MAC)
	}
	return b.String()
}
