package daemon

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/version"
)

// health is GET /v1/health through h.
func health(t *testing.T, h http.Handler) map[string]any {
	t.Helper()
	code, out := call(t, h, "GET", "/v1/health", "")
	if code != http.StatusOK {
		t.Fatalf("GET /v1/health: got %d %v", code, out)
	}
	return out
}

// TestHealthBuildAndUptime: /v1/health says which build runs and since
// when, and "ok" with an empty (not null) problem list when healthy.
func TestHealthBuildAndUptime(t *testing.T) {
	before := time.Now().Add(-time.Second)
	_, h := testDaemon(t)
	out := health(t, h)
	started, err := time.Parse(time.RFC3339, out["started"].(string))
	if err != nil || started.Before(before.Truncate(time.Second)) || started.After(time.Now()) {
		t.Errorf("started %v (%v): want the daemon's start, around %v", out["started"], err, before)
	}
	if up, ok := out["uptime_seconds"].(float64); !ok || up < 0 || up > 60 {
		t.Errorf("uptime_seconds %v: want a few seconds", out["uptime_seconds"])
	}
	if out["status"] != "ok" || out["version"] != version.Version || out["revision"] != version.Revision() {
		t.Errorf("health %v: want status ok, version %q, revision %q", out, version.Version, version.Revision())
	}
	if p, ok := out["problems"].([]any); !ok || len(p) != 0 {
		t.Errorf("problems %#v: want []", out["problems"])
	}
}

// TestHealthSaveFailure: a write of the state file that fails is counted
// and makes the daemon degraded, naming the file and the change it lost
// (an add undone, a removal still listed); a removal that cannot be
// saved answers 200 with a warning; the next write that succeeds (here
// SaveState, which SIGHUP runs) clears the problem and leaves the file
// listing exactly the devices served. An acknowledgement does not clear
// it.
func TestHealthSaveFailure(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	socks := t.TempDir()
	d := stateDaemon(t, state)
	h := d.Handler()
	for _, id := range []string{"vm1", "vm2"} {
		if code, out := call(t, h, "POST", "/v1/devices", addBody(id, filepath.Join(socks, id+".sock"), "")); code != http.StatusCreated {
			t.Fatalf("POST %s: got %d %v", id, code, out)
		}
	}
	if d.Degraded() || d.StateSaveFailures() != 0 {
		t.Fatalf("before the failure: degraded %v, %d failures; want neither", d.Degraded(), d.StateSaveFailures())
	}
	select {
	case <-d.Changed():
	default:
		t.Error("Changed not signalled after the adds")
	}
	// The state directory goes (as a full or read-only file system would
	// make it fail; root writes through a read-only mode).
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	if code, out := call(t, h, "POST", "/v1/devices", addBody("vm3", filepath.Join(socks, "vm3.sock"), "")); code != http.StatusInternalServerError {
		t.Fatalf("POST vm3 with the state directory gone: got %d %v, want 500", code, out)
	}
	out := health(t, h)
	problems, _ := out["problems"].([]any)
	if out["status"] != "degraded" || len(problems) != 1 {
		t.Fatalf("health after the failed save: %v, want degraded with one problem", out)
	}
	p := problems[0].(map[string]any)
	if p["kind"] != controlapi.ProblemStateSave || p["file"] != filepath.Join(state, StateFile) || p["needs_ack"] != false ||
		!strings.Contains(p["message"].(string), "addition of device vm3") {
		t.Errorf("problem %v: want %s on %s, naming the addition of vm3, cleared without an acknowledgement", p, controlapi.ProblemStateSave, filepath.Join(state, StateFile))
	}
	select {
	case <-d.Changed():
	default:
		t.Error("Changed not signalled when the health changed")
	}

	code, rm := call(t, h, "DELETE", "/v1/devices/vm2", "")
	if code != http.StatusOK || rm["removed"] != true || rm["still_listed"] != true || !strings.Contains(rm["warning"].(string), "still lists it") {
		t.Errorf("DELETE vm2 unsaved: got %d %v, want 200 with still_listed and a warning", code, rm)
	}
	if _, ok := d.Device("vm2"); ok {
		t.Error("vm2 still served after DELETE")
	}
	if n := d.StateSaveFailures(); n != 2 {
		t.Errorf("save failures: got %d, want 2", n)
	}
	h2 := d.Health()
	if len(h2.Problems) != 1 || !strings.Contains(h2.Problems[0].Message, "removal of device vm2") {
		t.Errorf("problems after the unsaved removal: %+v, want one, naming the removal of vm2", h2.Problems)
	}
	// Not acknowledgeable: the cause is still there.
	if code, out := call(t, h, "POST", "/v1/health/ack", `{"id":"state-save"}`); code != http.StatusConflict {
		t.Errorf("ack of the save failure: got %d %v, want 409", code, out)
	}
	if code, out := call(t, h, "POST", "/v1/health/ack", ""); code != http.StatusOK || len(out["acknowledged"].([]any)) != 0 {
		t.Errorf("ack of all: got %d %v, want 200 with nothing acknowledged", code, out)
	}
	if !d.Degraded() {
		t.Error("an acknowledgement cleared the save failure")
	}
	if err := d.SaveState(); err == nil {
		t.Error("SaveState with the directory still gone: got nil, want an error")
	}

	if err := os.MkdirAll(state, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := d.SaveState(); err != nil {
		t.Fatalf("SaveState with the directory back: %v", err)
	}
	if out := health(t, h); out["status"] != "ok" {
		t.Errorf("health after a good save: %v, want ok", out)
	}
	if doc := readState(t, state); len(doc.Devices) != 1 || doc.Devices[0].ID != "vm1" {
		t.Errorf("state file after the good save: %+v, want vm1 alone", doc.Devices)
	}
	if n := d.StateSaveFailures(); n != 3 {
		t.Errorf("save failures: got %d, want 3 (the counter keeps counting)", n)
	}
}

// TestHealthAck: a set-aside state file keeps the daemon degraded until
// POST /v1/health/ack clears it — by its ID or with the others; an
// unknown ID is 404, a malformed body 400, and the problems that need no
// acknowledgement stay.
func TestHealthAck(t *testing.T) {
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, StateFile), []byte(`{"version":1,"devices":[{`), 0o600); err != nil {
		t.Fatal(err)
	}
	d := stateDaemon(t, state)
	h := d.Handler()
	p := setAsideProblem1(t, d)
	for _, tt := range []struct {
		body string
		code int
		want string
	}{
		{`{"id":"devices.json.corrupt-19700101T000000Z"}`, http.StatusNotFound, "no such problem"},
		{`{"id":` + `"` + strings.Repeat("x", 300) + `"}`, http.StatusBadRequest, "longer than"},
		{`{"id":1}`, http.StatusBadRequest, "malformed JSON"},
		{`{"problem":"x"}`, http.StatusBadRequest, "unknown field"},
		{`{} {}`, http.StatusBadRequest, "trailing data"},
	} {
		code, out := call(t, h, "POST", "/v1/health/ack", tt.body)
		if msg, _ := out["error"].(string); code != tt.code || !strings.Contains(msg, tt.want) {
			t.Errorf("ack %.40q: got %d %v, want %d with %q", tt.body, code, out, tt.code, tt.want)
		}
	}
	if !d.Degraded() {
		t.Fatal("a refused acknowledgement cleared the problem")
	}
	if code, out := call(t, h, "GET", "/v1/health/ack", ""); code != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/health/ack: got %d %v, want 405", code, out)
	}
	code, out := call(t, h, "POST", "/v1/health/ack", `{"id":"`+p.ID+`"}`)
	acked, _ := out["acknowledged"].([]any)
	hl, _ := out["health"].(map[string]any)
	if code != http.StatusOK || len(acked) != 1 || acked[0] != p.ID || hl["status"] != "ok" {
		t.Errorf("ack %s: got %d %v, want 200, it acknowledged, status ok", p.ID, code, out)
	}
	if code, out := call(t, h, "POST", "/v1/health/ack", `{"id":"`+p.ID+`"}`); code != http.StatusNotFound {
		t.Errorf("second ack of %s: got %d %v, want 404", p.ID, code, out)
	}
	// The daemon serves: the API adds devices and saves them.
	sock := filepath.Join(t.TempDir(), "vm1.sock")
	if code, out := call(t, h, "POST", "/v1/devices", addBody("vm1", sock, "")); code != http.StatusCreated {
		t.Errorf("POST after the set-aside: got %d %v", code, out)
	}
	if doc := readState(t, state); len(doc.Devices) != 1 {
		t.Errorf("new state file: %+v, want vm1", doc)
	}
}
