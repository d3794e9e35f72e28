package metrics

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParseAddr checks that ParseAddr never panics, returns a zero result
// with every error, and only returns addresses net.Listen can take.
func FuzzParseAddr(f *testing.F) {
	f.Add("127.0.0.1:9464")
	f.Fuzz(func(t *testing.T, addr string) {
		network, address, err := ParseAddr(addr)
		if err != nil {
			if network != "" || address != "" {
				t.Fatalf("error %v with a result %q %q", err, network, address)
			}
			if !errors.Is(err, ErrInvalidAddr) {
				t.Fatalf("got %v, want ErrInvalidAddr", err)
			}
			return
		}
		switch network {
		case "unix":
			if "unix:"+address != addr || address == "" || len(address) > maxUnixPath || strings.IndexByte(address, 0) >= 0 {
				t.Fatalf("%q: got unix %q", addr, address)
			}
		case "tcp":
			if address != addr {
				t.Fatalf("%q: got tcp %q", addr, address)
			}
		default:
			t.Fatalf("%q: got network %q", addr, network)
		}
	})
}
