package main

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/daemon"
)

// TestDeviceAddresses: device add --address assigns the device addresses
// (shown by device show and in the JSON, applied to its GID table); a bad
// one is a usage error; without any the device holds only its port GID.
func TestDeviceAddresses(t *testing.T) {
	control, d := startControl(t)
	out, errs, code := ctl(control, "device", "add", "vm1", "--address", "10.11.0.5", "--address", "2001:db8::/64", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var info daemon.DeviceInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.11.0.5/32", "2001:db8::/64"}; !slices.Equal(info.Addresses, want) {
		t.Fatalf("addresses: got %q, want %q", info.Addresses, want)
	}
	dv, _ := d.Device("vm1")
	if got := dv.Dev.AllowedGIDs(); len(got) != 2 || got[0] != netip.MustParsePrefix("10.11.0.5/32") {
		t.Fatalf("the device's assignment: got %v", got)
	}
	out, _, code = ctl(control, "device", "show", "vm1")
	if code != 0 || !strings.Contains(out, "10.11.0.5/32,2001:db8::/64") {
		t.Errorf("device show: got %q, exit %d", out, code)
	}
	if _, _, code := ctl(control, "device", "add", "vm2", "--address", "everything"); code != exitUsage {
		t.Errorf("device add --address everything: exit %d, want %d (usage)", code, exitUsage)
	}
	if _, _, code := ctl(control, "device", "add", "vm3"); code != 0 {
		t.Fatalf("device add vm3: exit %d", code)
	}
	out, _, _ = ctl(control, "device", "show", "vm3")
	if !strings.Contains(out, "none (port GID only)") {
		t.Errorf("device show of a device without addresses: got %q", out)
	}
}
