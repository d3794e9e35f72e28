package guestresult

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// perfLine is a client's line as vrdma-guest prints it
// (internal/perftest.Result), with a key Result does not know.
const perfLine = `{"role":"client","op":"write","size":65536,"iters":10,"gbytes_per_s":1.5,"mops":0.02,"lat_us_p50":3.5,"lat_us_p99":9,"verified":true,"extra":[1,2]}`

func TestParse(t *testing.T) {
	r, err := Parse("  " + perfLine + " ")
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Role: "client", Op: "write", Size: 65536, Iters: 10, GBytesPerS: 1.5, Mops: 0.02, LatP50: 3.5, LatP99: 9, Verified: true}
	got := r
	got.Raw = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if string(r.Raw) != perfLine {
		t.Errorf("got raw %s, want the object verbatim", r.Raw)
	}
	if got, want := r.Line(), Prefix+" "+perfLine; got != want {
		t.Errorf("Line: got %q, want %q", got, want)
	}
	// A stream's line (vrdma-guest --duration) adds max_gap_ms and bytes.
	s, err := Parse(`{"role":"client","op":"send","verified":true,"max_gap_ms":812.5,"bytes":1048576}`)
	if err != nil || s.MaxGapMS != 812.5 || s.Bytes != 1<<20 || !s.Verified {
		t.Errorf("stream line: got %+v, %v; want max_gap_ms 812.5, bytes 1048576", s, err)
	}
	for _, bad := range []string{``, ` `, `[]`, `"x"`, `{`, `{"size":-1}`, `{"verified":"yes"}`, `{} {}`, `{}x`, `{"iters":1e99}`, `null`, `{"bytes":-1}`, `{"max_gap_ms":"1"}`} {
		t.Run(bad, func(t *testing.T) {
			r, err := Parse(bad)
			if err == nil {
				t.Fatal("got nil error, want one")
			}
			if !reflect.DeepEqual(r, Result{}) {
				t.Errorf("got %+v on error, want zero", r)
			}
		})
	}
	for _, bad := range []string{``, `[]`, `{`, `{} {}`, `{"round":"1"}`, `{"released":1}`, `null`} {
		t.Run("Decode "+bad, func(t *testing.T) {
			h := Hotplug{Device: "stale"}
			if err := Decode(bad, &h); err == nil || !reflect.DeepEqual(h, Hotplug{}) {
				t.Errorf("got %v and %+v, want an error and zero", err, h)
			}
		})
	}
	h := Hotplug{Device: "stale", Released: true}
	if err := Decode(`{"role":"hotplug","round":1,"event":"waiting"}`, &h); err != nil || h != (Hotplug{Step: Step{RoleHotplug, 1, "waiting"}}) {
		t.Errorf("Decode over a used value: got %+v, %v; want only the payload's keys", h, err)
	}
	if _, err := Parse(`[1]`); !errors.Is(err, ErrNotObject) {
		t.Errorf("got %v, want ErrNotObject", err)
	}
}

// TestWrite checks the exact bytes of the lines vrdma-guest prints: the
// harnesses' parsers and guest/perftest-jobs agree on them.
func TestWrite(t *testing.T) {
	tests := []struct {
		name string
		v    any
		want string
	}{
		{"selftest", map[string]any{"role": "selftest", "op": "all", "verified": true},
			`VRDMA-RESULT {"op":"all","role":"selftest","verified":true}` + "\n"},
		{"hotplug waiting", Hotplug{Step: Step{Role: RoleHotplug, Round: 1, Event: "waiting"}},
			`VRDMA-RESULT {"role":"hotplug","round":1,"event":"waiting","device":""}` + "\n"},
		{"hotplug detached", Hotplug{Step: Step{Role: RoleHotplug, Round: 2, Event: "detached"}, Device: "0000:01:00.0", DetachS: 0.5, Released: true},
			`VRDMA-RESULT {"role":"hotplug","round":2,"event":"detached","device":"0000:01:00.0","detach_s":0.5,"released":true}` + "\n"},
		{"restart reset", Restart{Step: Step{Role: RoleRestart, Round: 1, Event: "reset"}},
			`VRDMA-RESULT {"role":"restart","round":1,"event":"reset"}` + "\n"},
		{"restart ready", Restart{Step: Step{Role: RoleRestart, Event: "ready"}, Device: "0000:00:03.0", QPs: []uint32{1, 2}, Verified: true},
			`VRDMA-RESULT {"role":"restart","round":0,"event":"ready","device":"0000:00:03.0","qps":[1,2],"verified":true}` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := Write(&b, tt.v); err != nil {
				t.Fatal(err)
			}
			if b.String() != tt.want {
				t.Errorf("got %q, want %q", b.String(), tt.want)
			}
			// What Write prints, Parse reads back verbatim.
			r, err := Parse(strings.TrimPrefix(strings.TrimSuffix(b.String(), "\n"), Prefix+" "))
			if err != nil || r.Line()+"\n" != b.String() {
				t.Errorf("Parse: got %q, %v; want the line back", r.Line(), err)
			}
		})
	}
	if err := Write(&bytes.Buffer{}, func() {}); err == nil {
		t.Error("Write of a func: got nil error")
	}
}

func TestDecodeStep(t *testing.T) {
	const usable = `{"role":"hotplug","round":2,"event":"usable","device":"0000:01:00.0","probe_s":0.25,"found_s":0.1}`
	tests := []struct {
		name, payload, role, event string
		round                      int
		ok                         bool
		err                        string // in the error; "" for none
	}{
		{"wanted", usable, RoleHotplug, "usable", 2, true, ""},
		{"another role", `{"role":"selftest","op":"all","verified":true}`, RoleHotplug, "usable", 2, false, ""},
		{"wrong event", usable, RoleHotplug, "attached", 2, false, "got usable of round 2, want attached of round 2"},
		{"wrong round", usable, RoleHotplug, "usable", 1, false, "got usable of round 2, want usable of round 1"},
		{"not JSON", `{oops`, RoleHotplug, "usable", 2, false, `result "{oops"`},
		{"round not a number", `{"role":"hotplug","round":"2"}`, RoleHotplug, "usable", 2, false, "round"},
		{"wanted but a key of the wrong type", `{"role":"hotplug","round":2,"event":"usable","probe_s":"x"}`, RoleHotplug, "usable", 2, false, "probe_s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var h Hotplug
			ok, err := DecodeStep(tt.payload, tt.role, tt.event, tt.round, &h)
			if ok != tt.ok || (err == nil) != (tt.err == "") || err != nil && !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("got %v, %v; want %v and an error with %q", ok, err, tt.ok, tt.err)
			}
			if !ok && !reflect.DeepEqual(h, Hotplug{}) {
				t.Errorf("got %+v with ok false, want zero", h)
			}
			if ok && (h.Device != "0000:01:00.0" || h.ProbeS != 0.25 || h.FoundS != 0.1 || h.Round != 2) {
				t.Errorf("got %+v", h)
			}
		})
	}
	if ok, err := DecodeStep(usable, RoleHotplug, "usable", 2, nil); !ok || err != nil {
		t.Errorf("nil v: got %v, %v; want true, nil", ok, err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(perfLine)
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Parse(s)
		if err != nil {
			if !reflect.DeepEqual(r, Result{}) {
				t.Fatalf("error %v with a non-zero result %+v", err, r)
			}
			return
		}
		if len(r.Raw) == 0 || r.Raw[0] != '{' {
			t.Fatalf("accepted %q with raw %q", s, r.Raw)
		}
		if r2, err := Parse(string(r.Raw)); err != nil || string(r2.Raw) != string(r.Raw) {
			t.Fatalf("raw %q does not parse back: %v", r.Raw, err)
		}
	})
}

func FuzzDecodeStep(f *testing.F) {
	f.Add(`{"role":"restart","round":1,"event":"recovered","qps":[3,4],"verified":true}`)
	f.Fuzz(func(t *testing.T, s string) {
		var r Restart
		ok, err := DecodeStep(s, RoleRestart, "recovered", 1, &r)
		if ok && err != nil {
			t.Fatalf("ok with error %v", err)
		}
		if !ok && !reflect.DeepEqual(r, Restart{}) {
			t.Fatalf("not ok (%v) with a non-zero step %+v", err, r)
		}
		if ok && (r.Role != RoleRestart || r.Event != "recovered" || r.Round != 1) {
			t.Fatalf("ok with %+v", r)
		}
	})
}
