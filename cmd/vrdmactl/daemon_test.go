package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/version"
)

// stateControl is a daemon with the state directory state, serving its
// control API in a short directory.
func stateControl(t *testing.T, state string) (string, *daemon.Daemon) {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	t.Cleanup(func() { d.Close() })
	if _, err := d.OpenState(state); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "vrdmactl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	control := filepath.Join(dir, "control.sock")
	if err := d.ServeControl(control); err != nil {
		t.Fatal(err)
	}
	return control, d
}

// TestVersion: vrdmactl version prints its own build and the running
// vrdmad's (version, start, uptime); when vrdmad does not answer it still
// prints its own, says so, and exits 5.
func TestVersion(t *testing.T) {
	control, _ := startControl(t)
	out, errs, code := ctl(control, "version")
	if code != 0 || !strings.Contains(out, "vrdmactl  "+version.Version) || !strings.Contains(out, "vrdmad    "+version.Version+", started ") ||
		!strings.Contains(out, ", up ") || errs != "" {
		t.Errorf("version: exit %d, stdout %q, stderr %q; want both versions, the start and uptime", code, out, errs)
	}
	out, _, code = ctl(control, "version", "--json")
	var v versionAnswer
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != 0 || v.Client.Version != version.Version || v.Daemon == nil ||
		v.Daemon.Version != version.Version || v.Daemon.Started.IsZero() || v.GoVersion == "" {
		t.Errorf("version --json: exit %d, %q (%v); want client and daemon", code, out, err)
	}

	gone := filepath.Join(t.TempDir(), "nobody.sock")
	out, errs, code = ctl(gone, "version")
	if code != exitUnreachable || !strings.Contains(out, "vrdmactl  "+version.Version) || !strings.Contains(out, "unreachable at "+gone) ||
		!strings.Contains(errs, "unreachable") {
		t.Errorf("version, no vrdmad: exit %d, stdout %q, stderr %q; want %d, the client's version, unreachable", code, out, errs, exitUnreachable)
	}
	out, errs, code = ctl(gone, "--json", "version")
	v = versionAnswer{}
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != exitUnreachable || v.Client.Version != version.Version || v.Daemon != nil ||
		!strings.Contains(errs, `"exit_code":5`) {
		t.Errorf("version --json, no vrdmad: exit %d, stdout %q, stderr %q; want daemon null and the error as JSON", code, out, errs)
	}
}

// TestDaemonStatusAck: daemon status shows the health and exits 1 while
// degraded, naming the problem and how to clear it; daemon ack clears it
// (by its ID or all), an unknown ID exits 3.
func TestDaemonStatusAck(t *testing.T) {
	state := t.TempDir()
	if err := os.WriteFile(filepath.Join(state, daemon.StateFile), []byte("not JSON"), 0o600); err != nil {
		t.Fatal(err)
	}
	control, d := stateControl(t, state)
	h := d.Health()
	if len(h.Problems) != 1 {
		t.Fatalf("health %+v: want one problem", h)
	}
	id := h.Problems[0].ID
	out, errs, code := ctl(control, "daemon", "status")
	for _, want := range []string{"status          degraded", "version         " + version.Version, "devices         0", "(up ",
		"problem " + id + " (" + controlapi.ProblemStateSetAside, "clear it with: vrdmactl daemon ack " + id, h.Problems[0].File} {
		if !strings.Contains(out, want) {
			t.Errorf("daemon status lacks %q:\n%s", want, out)
		}
	}
	if code != exitFailure || !strings.Contains(errs, "degraded") {
		t.Errorf("daemon status degraded: exit %d, stderr %q; want %d saying degraded", code, errs, exitFailure)
	}
	out, _, code = ctl(control, "daemon", "status", "--json")
	var got controlapi.Health
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != exitFailure || got.Status != controlapi.StatusDegraded || len(got.Problems) != 1 {
		t.Errorf("daemon status --json: exit %d, %q (%v)", code, out, err)
	}
	if _, errs, code := ctl(control, "daemon", "ack", "nope"); code != exitNotFound || !strings.Contains(errs, "no such problem") {
		t.Errorf("daemon ack nope: exit %d, stderr %q; want %d, no such problem", code, errs, exitNotFound)
	}
	if _, _, code := ctl(control, "daemon", "ack", "a", "b"); code != exitUsage {
		t.Errorf("daemon ack a b: exit %d, want %d", code, exitUsage)
	}
	out, errs, code = ctl(control, "daemon", "ack", id)
	if code != 0 || out != "acknowledged "+id+"\nstatus: ok\n" {
		t.Errorf("daemon ack %s: exit %d, stdout %q, stderr %q", id, code, out, errs)
	}
	if out, _, code := ctl(control, "daemon", "ack"); code != 0 || out != "nothing to acknowledge\nstatus: ok\n" {
		t.Errorf("daemon ack (all, none left): exit %d, stdout %q", code, out)
	}
	if out, errs, code := ctl(control, "daemon", "status"); code != 0 || !strings.Contains(out, "status          ok") || strings.Contains(out, "problem") {
		t.Errorf("daemon status after the ack: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// TestRmUnsaved: device rm of a device whose removal could not be saved
// exits 0, and warns on standard error that the state file still lists
// it.
func TestRmUnsaved(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	control, d := stateControl(t, state)
	if _, errs, code := ctl(control, "device", "add", "vm1"); code != 0 {
		t.Fatalf("device add: exit %d: %s", code, errs)
	}
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	out, errs, code := ctl(control, "device", "rm", "vm1")
	if code != 0 || out != "removed vm1\n" || !strings.HasPrefix(errs, "vrdmactl: warning: ") || !strings.Contains(errs, "still lists it") {
		t.Errorf("device rm unsaved: exit %d, stdout %q, stderr %q; want 0, removed, a warning that the file still lists it", code, out, errs)
	}
	if _, ok := d.Device("vm1"); ok {
		t.Error("vm1 still served")
	}
	out, _, code = ctl(control, "device", "add", "vm2")
	if code == 0 {
		t.Fatalf("device add with the state directory gone: exit 0, %q", out)
	}
	if _, _, code := ctl(control, "daemon", "status"); code != exitFailure {
		t.Errorf("daemon status after failed saves: exit %d, want %d (degraded)", code, exitFailure)
	}
}
