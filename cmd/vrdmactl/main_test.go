package main

import (
	"bytes"
	"encoding/json"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/daemon"
)

func startControl(t *testing.T) (string, *daemon.Daemon) {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	control := filepath.Join(t.TempDir(), "control.sock")
	if err := d.ServeControl(control); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return control, d
}

func ctl(control string, args ...string) (string, error) {
	var out bytes.Buffer
	err := run(append([]string{"--control", control}, args...), &out)
	return out.String(), err
}

func TestDeviceLifecycle(t *testing.T) {
	control, d := startControl(t)
	sock := filepath.Join(filepath.Dir(control), "vm1.sock")
	out, err := ctl(control, "device", "add", "vm1", "--socket", sock, "--max-qps", "32", "--max-pinned", "64M", "--guid", "0211:2233:4455:6677", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var info daemon.DeviceInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("device add --json: %q: %v", out, err)
	}
	if info.ID != "vm1" || info.Socket != sock || info.Limits.MaxQPs != 32 || info.Limits.MaxPinnedBytes != 64<<20 || info.GUID != "0211:2233:4455:6677" {
		t.Errorf("device add: got %+v", info)
	}
	// Default socket: ID.sock next to the control socket; flags after the ID.
	if _, err := ctl(control, "device", "add", "vm2"); err != nil {
		t.Fatal(err)
	}
	if dv, ok := d.Device("vm2"); !ok || dv.Server.Socket() != filepath.Join(filepath.Dir(control), "vm2.sock") {
		t.Errorf("device add vm2: got %v, want a socket beside the control socket", ok)
	}
	out, err = ctl(control, "device", "ls")
	if err != nil || !strings.Contains(out, "vm1") || !strings.Contains(out, "vm2") {
		t.Errorf("device ls: got %q, %v", out, err)
	}
	out, err = ctl(control, "device", "show", "vm1")
	if err != nil || !strings.Contains(out, "max_qps") || !strings.Contains(out, "32") {
		t.Errorf("device show: got %q, %v", out, err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"device", "add", "vm1", "--socket", filepath.Join(filepath.Dir(control), "x.sock")}, "409"},
		{[]string{"device", "add", "vm3", "--socket", sock}, "socket path in use"},
		{[]string{"device", "add", "vm3", "--max-qps", "70000"}, "limits.max_qps"},
		{[]string{"device", "add"}, "one device ID"},
		{[]string{"device", "rm", "nope"}, "404"},
		{[]string{"device", "show", "nope"}, "no such device"},
		{[]string{"vm", "attach", "--device", "vm1"}, "--qmp"},
		{[]string{"vm", "attach", "--qmp", "/nonexistent/qmp.sock", "--device", "nope"}, "no such device"},
		{[]string{"vm", "attach", "--qmp", "/nonexistent/qmp.sock", "--device", "vm1"}, "qmp /nonexistent/qmp.sock"},
		{[]string{"vm", "detach", "--qmp", "/nonexistent/qmp.sock"}, "--device"},
		{[]string{"device", "frob"}, "unknown command"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := ctl(control, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
	for _, id := range []string{"vm1", "vm2"} {
		if out, err := ctl(control, "device", "rm", id); err != nil || out != "removed "+id+"\n" {
			t.Errorf("device rm %s: got %q, %v", id, out, err)
		}
	}
	if n := len(d.Devices()); n != 0 {
		t.Errorf("after rm: got %d devices, want 0", n)
	}
}
