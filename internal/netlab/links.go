package netlab

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The only addresses a Lab hands to the kernel.
var (
	// Range4 holds every IPv4 address of a Lab.
	Range4 = netip.MustParsePrefix("10.200.0.0/16")
	// Range6 holds every IPv6 address of a Lab.
	Range6 = netip.MustParsePrefix("fd00:7672::/32")
)

// AddressError is an address or prefix outside Range4 and Range6.
type AddressError struct {
	Prefix netip.Prefix
}

func (e *AddressError) Error() string {
	return fmt.Sprintf("netlab: %s is outside %s and %s", e.Prefix, Range4, Range6)
}
func (e *AddressError) Is(target error) bool { return target == ErrAddress }

// InRange reports whether all of p lies inside Range4 or Range6.
func InRange(p netip.Prefix) bool {
	if !p.IsValid() {
		return false
	}
	p = p.Masked()
	r := Range4
	if p.Addr().Is6() {
		r = Range6
		if p.Addr().Is4In6() {
			return false
		}
	}
	return p.Bits() >= r.Bits() && r.Contains(p.Addr())
}

func checkPrefix(p netip.Prefix) error {
	if !InRange(p) {
		return &AddressError{Prefix: p}
	}
	return nil
}

func checkAddr(a netip.Addr) error {
	if !a.IsValid() {
		return &AddressError{}
	}
	return checkPrefix(netip.PrefixFrom(a, a.BitLen()))
}

// Veth creates a veth pair with one end, aName, in a and the other, bName,
// in b (both down). The ends are created in their namespaces directly, so
// a crash never leaves one in the caller's namespace.
func (l *Lab) Veth(a *NS, aName string, b *NS, bName string) error {
	return l.veth(a, aName, "", b, bName, "")
}

// VethHosts makes two namespaces, labelled labelA and labelB ("hosts" A
// and B), joined by a veth — va in A, vb in B — with the prefixes onA and
// onB on those ends, both up.
func (l *Lab) VethHosts(labelA, labelB string, onA, onB []netip.Prefix) (a, b *NS, err error) {
	if a, err = l.AddNS(labelA); err != nil {
		return nil, nil, err
	}
	if b, err = l.AddNS(labelB); err != nil {
		return nil, nil, err
	}
	if err := l.Veth(a, "va", b, "vb"); err != nil {
		return nil, nil, err
	}
	for _, end := range []struct {
		ns   *NS
		link string
		ps   []netip.Prefix
	}{{a, "va", onA}, {b, "vb", onB}} {
		for _, p := range end.ps {
			if err := end.ns.AddAddr(end.link, p); err != nil {
				return nil, nil, err
			}
		}
		if err := end.ns.SetUp(end.link, true); err != nil {
			return nil, nil, err
		}
	}
	return a, b, nil
}

// veth is Veth with MAC addresses (empty: random).
func (l *Lab) veth(a *NS, aName, aMAC string, b *NS, bName, bMAC string) error {
	if err := checkIfName(aName); err != nil {
		return err
	}
	if err := checkIfName(bName); err != nil {
		return err
	}
	args := []string{"link", "add", "name", aName, "netns", a.Name}
	if aMAC != "" {
		args = append(args, "address", aMAC)
	}
	args = append(args, "type", "veth", "peer", "name", bName, "netns", b.Name)
	if bMAC != "" {
		args = append(args, "address", bMAC)
	}
	if _, err := l.run(args...); err != nil {
		return fmt.Errorf("veth %s/%s - %s/%s: %w", a.Label, aName, b.Label, bName, err)
	}
	return nil
}

// AddBridge creates a bridge (up, no STP, forward delay 0).
func (n *NS) AddBridge(name string) error {
	if err := checkIfName(name); err != nil {
		return err
	}
	if _, err := n.IP("link", "add", "name", name, "type", "bridge",
		"stp_state", "0", "forward_delay", "0"); err != nil {
		return fmt.Errorf("bridge %s/%s: %w", n.Label, name, err)
	}
	return n.SetUp(name, true)
}

// SetMaster enslaves link to bridge.
func (n *NS) SetMaster(link, bridge string) error {
	if err := checkIfName(link); err != nil {
		return err
	}
	if err := checkIfName(bridge); err != nil {
		return err
	}
	if _, err := n.IP("link", "set", "dev", link, "master", bridge); err != nil {
		return fmt.Errorf("master %s/%s: %w", n.Label, link, err)
	}
	return nil
}

// AddTap creates a persistent tap device (up) for a QEMU started in this
// namespace (NS.Command: -netdev tap,ifname=NAME,script=no,downscript=no)
// or for OpenTap, whose descriptor a QEMU elsewhere takes as
// -netdev tap,fd=N. It goes when the namespace does.
func (n *NS) AddTap(name string) error {
	if err := checkIfName(name); err != nil {
		return err
	}
	if _, err := n.IP("tuntap", "add", "dev", name, "mode", "tap"); err != nil {
		return fmt.Errorf("tap %s/%s: %w", n.Label, name, err)
	}
	return n.SetUp(name, true)
}

// SetUp sets link administratively up or down.
func (n *NS) SetUp(link string, up bool) error {
	if err := checkIfName(link); err != nil {
		return err
	}
	state := "down"
	if up {
		state = "up"
	}
	if _, err := n.IP("link", "set", "dev", link, state); err != nil {
		return fmt.Errorf("link %s/%s %s: %w", n.Label, link, state, err)
	}
	return nil
}

// SetMTU sets link's MTU.
func (n *NS) SetMTU(link string, mtu int) error {
	if err := checkIfName(link); err != nil {
		return err
	}
	if _, err := n.IP("link", "set", "dev", link, "mtu", strconv.Itoa(mtu)); err != nil {
		return fmt.Errorf("mtu %s/%s: %w", n.Label, link, err)
	}
	return nil
}

// AddAddr assigns p (address and prefix length) to link; it must lie in
// Range4 or Range6. IPv6 addresses skip duplicate address detection, so
// they are usable at once.
func (n *NS) AddAddr(link string, p netip.Prefix) error {
	if err := checkIfName(link); err != nil {
		return err
	}
	if err := checkAddr(p.Addr()); err != nil {
		return err
	}
	args := []string{"addr", "add", p.String(), "dev", link}
	if p.Addr().Is6() {
		args = append(args, "nodad")
	}
	if _, err := n.IP(args...); err != nil {
		return fmt.Errorf("address %s/%s: %w", n.Label, link, err)
	}
	return nil
}

// Route is a route for NS.AddRoute. Dst and, when set, Via and Src must lie
// in Range4 or Range6 (so no default route).
type Route struct {
	Dst netip.Prefix
	// Via is the gateway; the zero Addr means on-link through Dev.
	Via netip.Addr
	// Dev is the outgoing link; empty lets the kernel pick it from Via.
	Dev string
	// Src is the preferred source address; the zero Addr lets the kernel
	// choose.
	Src netip.Addr
	// Table is the routing table; 0 means main.
	Table int
}

// AddRoute adds r.
func (n *NS) AddRoute(r Route) error {
	if err := checkPrefix(r.Dst); err != nil {
		return err
	}
	args := []string{"route", "add", r.Dst.Masked().String()}
	if r.Via.IsValid() {
		if err := checkAddr(r.Via); err != nil {
			return err
		}
		args = append(args, "via", r.Via.String())
	}
	if r.Dev != "" {
		if err := checkIfName(r.Dev); err != nil {
			return err
		}
		args = append(args, "dev", r.Dev)
	}
	if r.Src.IsValid() {
		if err := checkAddr(r.Src); err != nil {
			return err
		}
		args = append(args, "src", r.Src.String())
	}
	if r.Table != 0 {
		args = append(args, "table", strconv.Itoa(r.Table))
	}
	if !r.Via.IsValid() && r.Dev == "" {
		return fmt.Errorf("%w: route to %s needs Via or Dev", ErrName, r.Dst)
	}
	if _, err := n.IP(args...); err != nil {
		return fmt.Errorf("route %s: %w", n.Label, err)
	}
	return nil
}

// AddRuleIIF adds a policy rule, for IPv4 and IPv6: packets that arrive on
// link are routed with table (falling through to main when it has no
// route), at priority pref.
func (n *NS) AddRuleIIF(link string, table, pref int) error {
	if err := checkIfName(link); err != nil {
		return err
	}
	for _, fam := range []string{"-4", "-6"} {
		if _, err := n.IP(fam, "rule", "add", "iif", link, "lookup", strconv.Itoa(table),
			"pref", strconv.Itoa(pref)); err != nil {
			return fmt.Errorf("rule %s/%s: %w", n.Label, link, err)
		}
	}
	return nil
}

// Sysctl writes value to the namespace's sysctl key ("net.ipv4.ip_forward";
// only net.* keys are per namespace, so only they are accepted).
func (n *NS) Sysctl(key, value string) error {
	if !strings.HasPrefix(key, "net.") || strings.Contains(key, "/") || strings.Contains(key, "..") {
		return fmt.Errorf("%w: sysctl key %q", ErrName, key)
	}
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	return n.Do(func() error {
		// /proc/sys/net resolves to the namespace of the thread that
		// opens it: this one, inside n.
		if err := os.WriteFile(path, []byte(value), 0); err != nil {
			return fmt.Errorf("sysctl %s/%s: %w", n.Label, key, err)
		}
		return nil
	})
}
