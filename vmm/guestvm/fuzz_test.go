package guestvm

import (
	"context"
	"errors"
	"strings"
	"testing"
)

func FuzzParseResult(f *testing.F) {
	f.Add(`{"role":"client","op":"write","size":65536,"iters":10,"gbytes_per_s":1.5,"lat_us_p50":3.5,"lat_us_p99":9,"verified":true}`)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseResult(s)
		if err != nil {
			if r.Role != "" || r.Op != "" || r.Size != 0 || r.Iters != 0 || r.Verified || r.Raw != nil ||
				r.GBytesPerS != 0 || r.Mops != 0 || r.LatP50 != 0 || r.LatP99 != 0 {
				t.Fatalf("error %v with a non-zero result %+v", err, r)
			}
			return
		}
		if len(r.Raw) == 0 || r.Raw[0] != '{' {
			t.Fatalf("accepted %q with raw %q", s, r.Raw)
		}
	})
}

func FuzzParseExit(f *testing.F) {
	f.Add("0")
	f.Fuzz(func(t *testing.T, s string) {
		code, err := ParseExit(s)
		if err != nil && code != 0 {
			t.Fatalf("error %v with code %d", err, code)
		}
		if code < 0 || code > 255 {
			t.Fatalf("code %d out of range", code)
		}
	})
}

// FuzzConsole feeds arbitrary console output to the line reader and
// WaitResult: never a panic, and an error whenever there is no clean exit.
func FuzzConsole(f *testing.F) {
	f.Add("VRDMA-INIT 6.1\nVRDMA-RESULT {\"role\":\"probe\",\"verified\":true}\nVRDMA-EXIT 0\n")
	f.Fuzz(func(t *testing.T, s string) {
		g := fakeGuest(s)
		res, err := g.WaitResult(context.Background())
		if err == nil {
			if !strings.Contains(s, PrefixExit) {
				t.Fatalf("success without %s", PrefixExit)
			}
			return
		}
		var ge *GuestError
		if !errors.As(err, &ge) {
			t.Fatalf("got %v, want a *GuestError", err)
		}
		_ = res
	})
}
