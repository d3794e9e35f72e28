package daemon

import (
	"net/netip"

	"github.com/vrdma/vrdma/internal/controlapi"
	"slices"
	"testing"
)

func TestParseAddresses(t *testing.T) {
	for _, tc := range []struct {
		in      []string
		want    []string
		wantErr bool
	}{
		{in: nil, want: nil},
		{in: []string{"10.11.0.5"}, want: []string{"10.11.0.5/32"}},
		{in: []string{"10.11.0.77/24", "10.11.0.0/24"}, want: []string{"10.11.0.0/24"}},
		{in: []string{"::ffff:10.11.0.5"}, want: []string{"10.11.0.5/32"}},
		{in: []string{"::ffff:10.11.0.0/120"}, want: []string{"10.11.0.0/24"}},
		{in: []string{"2001:db8::1/64", "fe80::5054:ff:fe00:1"}, want: []string{"2001:db8::/64", "fe80::5054:ff:fe00:1/128"}},
		{in: []string{"0.0.0.0/0"}, wantErr: true},
		{in: []string{"::/0"}, wantErr: true},
		{in: []string{"::ffff:0.0.0.0/96"}, wantErr: true},
		{in: []string{"::ffff:10.0.0.0/80"}, wantErr: true},
		{in: []string{"224.0.0.1"}, wantErr: true},
		{in: []string{"ff02::1"}, wantErr: true},
		{in: []string{"0.0.0.0"}, wantErr: true},
		{in: []string{"fe80::1%eth0"}, wantErr: true},
		{in: []string{"10.0.0.1/33"}, wantErr: true},
		{in: []string{"host.example"}, wantErr: true},
		{in: []string{""}, wantErr: true},
	} {
		got, err := controlapi.ParseAddresses(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("controlapi.ParseAddresses(%q): error %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err != nil {
			if got != nil {
				t.Errorf("controlapi.ParseAddresses(%q): %v with an error, want nil", tc.in, got)
			}
			continue
		}
		var gs []string
		for _, p := range got {
			gs = append(gs, p.String())
		}
		if !slices.Equal(gs, tc.want) {
			t.Errorf("controlapi.ParseAddresses(%q) = %q, want %q", tc.in, gs, tc.want)
		}
	}
	many := make([]string, controlapi.MaxAddresses+1)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}).String()
	}
	if _, err := controlapi.ParseAddresses(many); err == nil {
		t.Errorf("%d addresses accepted, want at most %d", len(many), controlapi.MaxAddresses)
	}
}

// TestAddressesRecord: a device's assignment goes into its state-file
// record and comes back from it; addresses and gids merge.
func TestAddressesRecord(t *testing.T) {
	spec, err := requestSpec(AddRequest{ID: "vm1", Socket: "/run/vrdma/vm1.sock",
		Addresses: []string{"10.11.0.5", "2001:db8:1::/48"}, GIDs: []string{"::ffff:10.11.0.5", "fe80::1"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.11.0.5/32"), netip.MustParsePrefix("2001:db8:1::/48"),
		netip.MustParsePrefix("fe80::1/128")}
	if !slices.Equal(spec.Device.AllowedGIDs, want) {
		t.Fatalf("assignment: got %v, want %v", spec.Device.AllowedGIDs, want)
	}
	again, err := requestSpec(spec.record())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Device.AllowedGIDs, want) {
		t.Fatalf("assignment after the record: got %v, want %v", again.Device.AllowedGIDs, want)
	}
	if _, err := requestSpec(AddRequest{ID: "vm1", Socket: "/run/vrdma/vm1.sock", Addresses: []string{"::/0"}}); err == nil {
		t.Fatal("an assignment of every address was accepted")
	}
}
