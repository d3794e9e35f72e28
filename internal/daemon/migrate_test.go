package daemon

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// TestAddIncoming: POST /v1/devices with "incoming" accepts the UUID of a
// device the daemon serves (the migration's source), once; without
// "incoming" the duplicate is refused as before; an incoming device
// needs a given identity and the soft RNIC, holds no GID, shows
// "migration": "incoming", is not saved in the state file, and keeps a
// live upgrade from starting.
func TestAddIncoming(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	d := stateDaemon(t, state)
	h := d.Handler()
	u := uuid.New().String()
	sock := func(id string) string { return filepath.Join(dir, id+".sock") }
	if code, out := call(t, h, "POST", "/v1/devices", addBody("src", sock("src"), `,"uuid":"`+u+`"`)); code != http.StatusCreated {
		t.Fatalf("POST src: %d %v", code, out)
	}
	for _, c := range []struct {
		name, extra string
		code        int
		want        string
	}{
		{"duplicate uuid", `,"uuid":"` + u + `"`, http.StatusUnprocessableEntity, "gid already registered"},
		{"incoming without identity", `,"incoming":true`, http.StatusBadRequest, "incoming"},
		{"incoming on a verbs RNIC", `,"uuid":"` + u + `","incoming":true,"rnic":"verbs:mlx5_0"`, http.StatusBadRequest, "soft RNIC"},
		{"incoming not a bool", `,"uuid":"` + u + `","incoming":"yes"`, http.StatusBadRequest, "malformed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, out := call(t, h, "POST", "/v1/devices", addBody("dst", sock("dst"), c.extra))
			if msg, _ := out["error"].(string); code != c.code || !strings.Contains(msg, c.want) {
				t.Fatalf("got %d %v, want %d and an error saying %q", code, out, c.code, c.want)
			}
		})
	}
	code, out := call(t, h, "POST", "/v1/devices", addBody("dst", sock("dst"), `,"uuid":"`+u+`","incoming":true`))
	if code != http.StatusCreated || out["migration"] != "incoming" || out["persisted"] != false || out["uuid"] != u {
		t.Fatalf("POST dst incoming: got %d %v, want 201, migration incoming, not persisted", code, out)
	}
	if gids, _ := out["gids"].([]any); len(gids) != 0 {
		t.Fatalf("an incoming device's GIDs: %v, want none", gids)
	}
	if code, out := call(t, h, "GET", "/v1/devices/src", ""); code != http.StatusOK || out["migration"] != nil {
		t.Fatalf("GET src: got %d %v, want no migration key", code, out)
	}
	// One destination per identity.
	if code, out := call(t, h, "POST", "/v1/devices", addBody("dst2", sock("dst2"), `,"uuid":"`+u+`","incoming":true`)); code != http.StatusConflict {
		t.Fatalf("a second incoming device of the uuid: got %d %v, want 409", code, out)
	}
	// The listing shows both; the state file only the source.
	if code, _ := call(t, h, "GET", "/v1/devices", ""); code != http.StatusOK {
		t.Fatalf("GET /v1/devices: %d", code)
	}
	if got := len(d.Devices()); got != 2 {
		t.Fatalf("devices served: %d, want 2", got)
	}
	doc := readState(t, state)
	if len(doc.Devices) != 1 || doc.Devices[0].ID != "src" {
		t.Fatalf("state file: %+v, want src alone", doc.Devices)
	}
	d.mu.Lock()
	err := d.migratingLocked()
	d.mu.Unlock()
	if err == nil || !strings.Contains(err.Error(), "dst") {
		t.Fatalf("an upgrade with an incoming device: got %v, want it refused naming dst", err)
	}
	// Removing the incoming device gives the identity nothing to lose.
	if code, _ := call(t, h, "DELETE", "/v1/devices/dst", ""); code != http.StatusOK {
		t.Fatalf("DELETE dst: %d", code)
	}
	if code, out := call(t, h, "GET", "/v1/devices/src", ""); code != http.StatusOK || out["gid"] == nil {
		t.Fatalf("GET src after dst's removal: %d %v", code, out)
	} else if gids, _ := out["gids"].([]any); len(gids) == 0 {
		t.Fatal("src lost its GIDs to a removed incoming device")
	}
}

// TestStateIncomingRefused: a state file never lists an incoming device.
func TestStateIncomingRefused(t *testing.T) {
	_, err := decodeState([]byte(`{"version":1,"devices":[{"id":"vm1","socket":"/run/vrdma/vm1.sock","uuid":"` +
		uuid.New().String() + `","incoming":true}]}`))
	if err == nil || !strings.Contains(err.Error(), "incoming") {
		t.Fatalf("got %v, want the incoming record refused", err)
	}
}
