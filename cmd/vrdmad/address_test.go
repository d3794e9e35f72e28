package main

import (
	"net/netip"
	"slices"
	"testing"
)

// TestParseAssigned: --address without an ID goes to every command-line
// device, ID=ADDR to that device on top.
func TestParseAssigned(t *testing.T) {
	a, err := parseAssigned([]string{"10.0.0.0/24", "vm1=10.1.0.5", "vm1=2001:db8::/64"})
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix
	if got, want := a.of("vm1"), []netip.Prefix{p("10.0.0.0/24"), p("10.1.0.5/32"), p("2001:db8::/64")}; !slices.Equal(got, want) {
		t.Errorf("vm1: got %v, want %v", got, want)
	}
	if got, want := a.of("vm2"), []netip.Prefix{p("10.0.0.0/24")}; !slices.Equal(got, want) {
		t.Errorf("vm2: got %v, want %v", got, want)
	}
	if got := a.named(); !slices.Equal(got, []string{"vm1"}) {
		t.Errorf("named: got %v, want [vm1]", got)
	}
	if a, _ := parseAssigned(nil); len(a.of("vm1")) != 0 {
		t.Errorf("no --address: got %v, want none", a.of("vm1"))
	}
}
