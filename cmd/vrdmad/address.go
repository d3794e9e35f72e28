package main

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
)

// assignment is what --address gives the command-line devices: byID[""]
// holds the prefixes every one gets, byID[id] those of device id (every
// device's included).
type assignment struct {
	byID map[string][]netip.Prefix
}

// parseAssigned parses --address values: ADDR or PREFIX for every
// command-line device, ID=ADDR for one.
func parseAssigned(vals []string) (*assignment, error) {
	raw := map[string][]string{"": nil}
	for _, v := range vals {
		id, addr, ok := strings.Cut(v, "=")
		if !ok {
			id, addr = "", v
		} else if err := daemon.CheckID(id); err != nil {
			return nil, fmt.Errorf("--address %s: %w", v, err)
		}
		raw[id] = append(raw[id], addr)
	}
	a := &assignment{byID: make(map[string][]netip.Prefix, len(raw))}
	for id, ss := range raw {
		if id != "" {
			ss = append(append([]string(nil), raw[""]...), ss...)
		}
		ps, err := controlapi.ParseAddresses(ss)
		if err != nil {
			return nil, fmt.Errorf("--address: %w", err)
		}
		a.byID[id] = ps
	}
	return a, nil
}

// of returns device id's prefixes.
func (a *assignment) of(id string) []netip.Prefix {
	if ps, ok := a.byID[id]; ok {
		return ps
	}
	return a.byID[""]
}

// named returns the IDs that --address named alone.
func (a *assignment) named() []string {
	var ids []string
	for id := range a.byID {
		if id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}
