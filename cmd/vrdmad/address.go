package main

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
)

// assignment is what --address gives the command-line devices: prefixes
// for every one, and prefixes for one device by ID.
type assignment struct {
	all  []string
	byID map[string][]string
	ok   map[string][]netip.Prefix // parsed, by ID ("" for all)
}

// parseAssigned parses --address values: ADDR or PREFIX for every
// command-line device, ID=ADDR for one.
func parseAssigned(vals []string) (*assignment, error) {
	a := &assignment{byID: make(map[string][]string), ok: make(map[string][]netip.Prefix)}
	for _, v := range vals {
		if id, addr, ok := strings.Cut(v, "="); ok {
			if err := daemon.CheckID(id); err != nil {
				return nil, fmt.Errorf("--address %s: %w", v, err)
			}
			a.byID[id] = append(a.byID[id], addr)
		} else {
			a.all = append(a.all, v)
		}
	}
	check := func(id string, ss []string) error {
		ps, err := controlapi.ParseAddresses(ss)
		if err != nil {
			return fmt.Errorf("--address: %w", err)
		}
		a.ok[id] = ps
		return nil
	}
	if err := check("", a.all); err != nil {
		return nil, err
	}
	for id, ss := range a.byID {
		if err := check(id, append(append([]string(nil), a.all...), ss...)); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// of returns device id's prefixes.
func (a *assignment) of(id string) []netip.Prefix {
	if ps, ok := a.ok[id]; ok {
		return ps
	}
	return a.ok[""]
}
