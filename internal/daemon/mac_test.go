package daemon

import (
	"errors"
	"testing"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestMAC covers POST /v1/devices' "mac": the node GUID is the MAC's
// EUI-64, it must agree with the other identity fields, and DeviceInfo shows
// the MAC back.
func TestMAC(t *testing.T) {
	for _, c := range []struct {
		name, body string
		guid       string // want, when no error
		errField   string
	}{
		{"mac", `{"id":"a","socket":"/run/a.sock","mac":"52:54:00:12:34:56"}`, "5254:00ff:fe12:3456", ""},
		{"mac and matching guid", `{"id":"a","socket":"/run/a.sock","mac":"52:54:00:12:34:56","guid":"525400fffe123456"}`, "5254:00ff:fe12:3456", ""},
		{"mac and other guid", `{"id":"a","socket":"/run/a.sock","mac":"52:54:00:12:34:56","guid":"525400fffe123457"}`, "", "mac"},
		{"global MAC", `{"id":"a","socket":"/run/a.sock","mac":"00:16:3e:12:34:56"}`, "", "mac"},
		{"multicast MAC", `{"id":"a","socket":"/run/a.sock","mac":"53:54:00:12:34:56"}`, "", "mac"},
		{"not a MAC", `{"id":"a","socket":"/run/a.sock","mac":"52:54:00:12:34"}`, "", "mac"},
		{"EUI-64 is not a MAC", `{"id":"a","socket":"/run/a.sock","mac":"52:54:00:ff:fe:12:34:56"}`, "", "mac"},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, err := DecodeAddRequest([]byte(c.body))
			if c.errField != "" {
				var re *RequestError
				if !errors.As(err, &re) || re.Field != c.errField {
					t.Fatalf("got %v, want an error about %q", err, c.errField)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := abi.FormatGUID(abi.GUIDOfUUID(spec.Device.UUID)); got != c.guid {
				t.Fatalf("node GUID %s, want %s", got, c.guid)
			}
		})
	}
	for _, c := range []struct {
		guid uint64
		mac  string
	}{
		{0x525400fffe123456, "52:54:00:12:34:56"},
		{0x0211223344556677, ""},
	} {
		if got := abi.MACOfGUID(c.guid).String(); got != c.mac {
			t.Errorf("MACOfGUID(%#x) = %q, want %q", c.guid, got, c.mac)
		}
	}
}
