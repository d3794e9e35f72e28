package backend

import (
	"encoding/json"
	"testing"
)

// FuzzAdoptState feeds Adopt decoded states with no real descriptors
// (every index out of range or naming -1): it must refuse them all without
// a panic, and a refusal returns no server.
func FuzzAdoptState(f *testing.F) {
	b, err := json.Marshal(validState())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b, uint8(0))
	f.Add([]byte(`{"listener":0,"session":{"conn":1,"backend":-1,"rings":[{"kick":-1,"call":-1,"err":-1}]}}`), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, n uint8) {
		var st ServerState
		if json.Unmarshal(data, &st) != nil {
			return
		}
		fds := make([]int, n%8)
		for i := range fds {
			fds[i] = -1
		}
		srv, err := Adopt(Config{Socket: "/nonexistent/s.sock", Device: newFakeDevice(2)}, &st, fds)
		if err == nil || srv != nil {
			t.Fatalf("Adopt without descriptors: %v, %v", srv, err)
		}
	})
}
