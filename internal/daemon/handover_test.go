package daemon

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// validHandover is a document DecodeHandover accepts: two devices (one
// connected), the control socket and the state directory.
func validHandover() map[string]any {
	return map[string]any{
		"format":    HandoverFormat,
		"version":   HandoverVersion,
		"from":      map[string]any{"pid": 42, "version": "0.1.0", "written": "2026-12-06T15:00:00Z"},
		"num_fds":   6,
		"control":   4,
		"metrics":   -1,
		"state_dir": 5,
		"devices": []any{
			map[string]any{"record": map[string]any{"id": "vm1", "socket": "/run/vrdma/vm1.sock"}, "persist": true,
				"fds": map[string]any{"base": 0, "count": 1}, "server": map[string]any{"listener": 0}},
			map[string]any{"record": map[string]any{"id": "vm2", "socket": "/run/vrdma/vm2.sock"},
				"fds": map[string]any{"base": 1, "count": 3}, "server": map[string]any{"listener": 0}},
		},
	}
}

func encode(t testing.TB, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeHandover(t *testing.T) {
	h, err := DecodeHandover(encode(t, validHandover()))
	if err != nil {
		t.Fatal(err)
	}
	if len(h.Devices) != 2 || h.Devices[1].FDs != (FDRange{1, 3}) || h.Control != 4 || h.StateDir != 5 || !h.Devices[0].Persist {
		t.Fatalf("decoded %+v", h)
	}
	for _, c := range []struct {
		name string
		edit func(m map[string]any)
		want string
	}{
		{"format", func(m map[string]any) { m["format"] = "vrdmad-state" }, "format"},
		{"newer version", func(m map[string]any) { m["version"] = HandoverVersion + 1 }, "version 2"},
		{"version 0", func(m map[string]any) { m["version"] = 0 }, "version 0"},
		{"unknown field", func(m map[string]any) { m["extra"] = 1 }, "unknown field"},
		{"negative num_fds", func(m map[string]any) { m["num_fds"] = -1 }, "num_fds"},
		{"control outside", func(m map[string]any) { m["control"] = 6 }, "outside"},
		{"control shared", func(m map[string]any) { m["control"] = 0 }, "claimed twice"},
		{"metrics below -1", func(m map[string]any) { m["metrics"] = -2 }, "outside"},
		{"device range outside", func(m map[string]any) {
			m["devices"].([]any)[1].(map[string]any)["fds"] = map[string]any{"base": 3, "count": 4}
		}, "outside"},
		{"device range overflow", func(m map[string]any) {
			m["devices"].([]any)[1].(map[string]any)["fds"] = map[string]any{"base": 9223372036854775807, "count": 1}
		}, "outside"},
		{"device ranges overlap", func(m map[string]any) {
			m["devices"].([]any)[1].(map[string]any)["fds"] = map[string]any{"base": 0, "count": 2}
		}, "claimed twice"},
		{"device id", func(m map[string]any) {
			m["devices"].([]any)[1].(map[string]any)["record"] = map[string]any{"id": "../x", "socket": "/run/x.sock"}
		}, "id"},
		{"same id twice", func(m map[string]any) {
			m["devices"].([]any)[1].(map[string]any)["record"] = map[string]any{"id": "vm1", "socket": "/run/x.sock"}
		}, "listed twice"},
		{"same socket twice", func(m map[string]any) {
			m["devices"].([]any)[1].(map[string]any)["record"] = map[string]any{"id": "vm3", "socket": "/run/vrdma/vm1.sock"}
		}, "listed twice"},
		{"objects without a front-end", func(m map[string]any) {
			m["devices"].([]any)[1].(map[string]any)["device"] = map[string]any{}
		}, "without a connected front-end"},
		{"roce without network", func(m map[string]any) {
			m["roce"] = map[string]any{"fds": map[string]any{"base": 4, "count": 0}}
		}, "no network state"},
		{"trailing", nil, "after top-level value"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := validHandover()
			var b []byte
			if c.edit != nil {
				c.edit(m)
				b = encode(t, m)
			} else {
				b = append(encode(t, m), []byte(" {}")...)
			}
			_, err := DecodeHandover(b)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error saying %q", err, c.want)
			}
		})
	}
	// A newer version is refused as such, before the rest is looked at:
	// the old process serves on and says why.
	m := validHandover()
	m["version"] = 99
	m["devices"] = "whatever a newer vrdmad writes"
	if _, err := DecodeHandover(encode(t, m)); !errors.Is(err, ErrHandoverVersion) || !strings.Contains(err.Error(), "version 99") {
		t.Fatalf("version 99: %v", err)
	}
}

// FuzzDecodeHandover: a handover document is input from another process
// (or a file systemd kept): DecodeHandover never panics, and what it
// accepts claims every descriptor at most once, within the list.
func FuzzDecodeHandover(f *testing.F) {
	f.Add(encode(f, validHandover()))
	f.Add([]byte(`{"format":"vrdmad-handover","version":1,"num_fds":0,"control":-1,"metrics":-1,"state_dir":-1,"devices":[]}`))
	f.Add([]byte(`{"format":"vrdmad-handover","version":1,"num_fds":2,"control":1,"metrics":-1,"state_dir":-1,` +
		`"roce":{"fds":{"base":0,"count":1},"network":{}},"devices":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := DecodeHandover(data)
		if err != nil {
			return
		}
		used := make([]int, h.NumFDs)
		mark := func(r FDRange) {
			for i := r.Base; i < r.Base+r.Count; i++ {
				used[i]++ // out of range panics: a finding
			}
		}
		for _, i := range []int{h.Control, h.Metrics, h.StateDir} {
			if i != -1 {
				mark(FDRange{i, 1})
			}
		}
		if h.RoCE != nil {
			mark(h.RoCE.FDs)
		}
		for _, d := range h.Devices {
			mark(d.FDs)
		}
		for i, n := range used {
			if n > 1 {
				t.Fatalf("descriptor %d claimed %d times", i, n)
			}
		}
	})
}
