package controlapi

import (
	"fmt"
	"net/netip"
	"strings"
)

// MaxAddresses bounds the prefixes assigned to one device.
const MaxAddresses = 64

// ParseAddresses parses what an operator assigns a device (POST
// /v1/devices' addresses and gids, vrdmactl device add --address, vrdmad
// --address): each an IP address (a host prefix) or a prefix, in address
// or GID notation; an IPv4-mapped GID or prefix (::ffff:10.11.0.5,
// ::ffff:10.11.0.0/120) is the IPv4 one. Prefixes come back masked and
// each once. The whole address space (0.0.0.0/0, ::/0), multicast,
// unspecified and zoned addresses are refused: an assignment names the
// tenant's own addresses.
func ParseAddresses(ss []string) ([]netip.Prefix, error) {
	if len(ss) > MaxAddresses {
		return nil, fmt.Errorf("%d addresses, at most %d", len(ss), MaxAddresses)
	}
	var out []netip.Prefix
	for _, s := range ss {
		p, err := parseAddress(s)
		if err != nil {
			return nil, err
		}
		dup := false
		for _, o := range out {
			dup = dup || o == p
		}
		if !dup {
			out = append(out, p)
		}
	}
	return out, nil
}

func parseAddress(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		q, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("%q is not an IP address or prefix", s)
		}
		p = q
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return p, fmt.Errorf("%q is not an IP address or prefix", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	a, bits := p.Addr(), p.Bits()
	if a.Is4In6() {
		if bits < 96 {
			return p, fmt.Errorf("%s: an IPv4-mapped prefix is at least /96", s)
		}
		a, bits = a.Unmap(), bits-96
	}
	p = netip.PrefixFrom(a, bits).Masked()
	switch {
	case bits == 0:
		return p, fmt.Errorf("%s assigns every address: name the tenant's own", s)
	case p.Addr().IsMulticast() || (p.Addr().IsUnspecified() && p.IsSingleIP()):
		return p, fmt.Errorf("%s is not a unicast address", s)
	}
	return p, nil
}

// PrefixStrings formats prefixes; never nil.
func PrefixStrings(ps []netip.Prefix) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}
