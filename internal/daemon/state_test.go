package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// stateDaemon is a daemon on the state directory dir, with the devices
// its state file lists restored. It is closed at the end of the test
// unless the test closes it first.
func stateDaemon(t *testing.T, dir string) *Daemon {
	t.Helper()
	d, specs, err := openStateDaemon(dir)
	if err != nil {
		t.Fatalf("open state %s: %v", dir, err)
	}
	if err := d.Restore(specs); err != nil {
		d.Close()
		t.Fatalf("restore: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func openStateDaemon(dir string) (*Daemon, []DeviceSpec, error) {
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := New(logrus.NewEntry(l), Config{})
	specs, err := d.OpenState(dir)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	return d, specs, nil
}

// readState decodes the state file in dir.
func readState(t *testing.T, dir string) stateDoc {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var doc stateDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("state file: %v\n%s", err, b)
	}
	return doc
}

// identity is what must survive a restart.
type identity struct {
	ID, Socket, UUID, GUID, GID string
	Limits                      Limits
	NumQueues                   int
	Persisted                   bool
}

func identityOf(i DeviceInfo) identity {
	return identity{i.ID, i.Socket, i.UUID, i.GUID, i.GID, i.Limits, i.NumQueues, i.Persisted}
}

// TestStateRoundTrip: devices added through the API come back from the
// state file with the same identity, limits and queues; command-line
// devices and removed devices do not.
func TestStateRoundTrip(t *testing.T) {
	state, socks := t.TempDir(), t.TempDir()
	d1 := stateDaemon(t, state)
	h := d1.Handler()
	for _, body := range []string{
		addBody("vm1", filepath.Join(socks, "vm1.sock"), `,"limits":{"max_qps":8,"max_cqs":9,"max_mrs":10,"max_pinned_bytes":4194304},"guid":"0211:2233:4455:6677","doorbell_queues":2`),
		addBody("vm2", filepath.Join(socks, "vm2.sock"), ""),
		addBody("gone", filepath.Join(socks, "gone.sock"), ""),
	} {
		if code, out := call(t, h, "POST", "/v1/devices", body); code != http.StatusCreated {
			t.Fatalf("POST %s: got %d %v", body, code, out)
		}
	}
	if code, out := call(t, h, "DELETE", "/v1/devices/gone", ""); code != http.StatusOK {
		t.Fatalf("DELETE: got %d %v", code, out)
	}
	// A command-line device: served, not saved.
	if _, err := d1.AddDevice(DeviceSpec{ID: "cli", Socket: filepath.Join(socks, "cli.sock")}); err != nil {
		t.Fatal(err)
	}
	doc := readState(t, state)
	var ids []string
	for _, r := range doc.Devices {
		ids = append(ids, r.ID)
	}
	// No device has a share: the file stays version 1, which an older
	// vrdmad reads too.
	if doc.Version != stateVersionNoShare || strings.Join(ids, ",") != "vm1,vm2" {
		t.Fatalf("state file: got version %d devices %q, want %d [vm1 vm2]", doc.Version, ids, stateVersionNoShare)
	}
	before := map[string]identity{}
	for _, dv := range d1.Devices() {
		before[dv.ID] = identityOf(dv.Info())
	}
	if !before["vm1"].Persisted || before["cli"].Persisted {
		t.Errorf("persisted: got vm1 %v cli %v, want true false", before["vm1"].Persisted, before["cli"].Persisted)
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	// Close leaves the file alone: the devices come back.
	if got := readState(t, state); len(got.Devices) != 2 {
		t.Fatalf("state file after Close: got %d devices, want 2", len(got.Devices))
	}

	d2 := stateDaemon(t, state)
	devs := d2.Devices()
	if len(devs) != 2 {
		t.Fatalf("restored: got %d devices, want 2 (vm1, vm2)", len(devs))
	}
	for _, dv := range devs {
		if got, want := identityOf(dv.Info()), before[dv.ID]; got != want {
			t.Errorf("%s after restart:\n got %+v\nwant %+v", dv.ID, got, want)
		}
	}
	if cs := devs[0].Dev.ConfigSpace(); cs.MaxQP != 8 || cs.NodeGUID != 0x0211223344556677 || devs[0].Dev.NumQueues() != 4 {
		t.Errorf("vm1 config space: got max_qp %d guid %#x queues %d, want 8 0x211223344556677 4", cs.MaxQP, cs.NodeGUID, devs[0].Dev.NumQueues())
	}
	// A removal after the restore is saved too.
	if err := d2.RemoveDevice("vm2"); err != nil {
		t.Fatal(err)
	}
	if got := readState(t, state); len(got.Devices) != 1 || got.Devices[0].ID != "vm1" {
		t.Errorf("state file after removing vm2: got %+v, want only vm1", got.Devices)
	}
	if m, _ := filepath.Glob(filepath.Join(state, ".devices.json.tmp-*")); len(m) != 0 {
		t.Errorf("temporary files left: %q", m)
	}
}

// TestCorruptState: a state file that fails any check is moved aside and
// OpenState goes on without its devices; the daemon is degraded with a
// problem naming the file, the copy and the cause until it is
// acknowledged, and the copy holds the bytes as they were. The next
// start is degraded again while the copy is there. A file of another
// version is not moved and stops OpenState.
func TestCorruptState(t *testing.T) {
	valid := func(extra string) string {
		return `{"version":1,"devices":[{"id":"vm1","socket":"/run/vrdma/vm1.sock","uuid":"0211abcd-0000-4000-8000-000000000001"` + extra + `}]}`
	}
	many := `{"version":1,"devices":[` + strings.Repeat(`{"id":"x","socket":"/x","uuid":"0211abcd-0000-4000-8000-000000000001"},`, MaxDevices) +
		`{"id":"x","socket":"/x","uuid":"0211abcd-0000-4000-8000-000000000001"}]}`
	tests := []struct {
		name, content string
		wantErr       string
		wantKept      bool
	}{
		{"empty", "", "malformed JSON", true},
		{"truncated", valid("")[:40], "malformed JSON", true},
		{"not JSON", "\x00\x01garbage", "malformed JSON", true},
		{"array", `[1,2]`, "malformed JSON", true},
		{"trailing data", valid("") + `{}`, "malformed JSON", true},
		{"no version", `{"devices":[]}`, "no version", true},
		{"version string", `{"version":"1","devices":[]}`, "malformed JSON", true},
		{"no devices", `{"version":1}`, "no devices", true},
		{"unknown field", `{"version":1,"devices":[],"extra":1}`, "unknown field", true},
		{"unknown device field", valid(`,"max_qps":3`), "unknown field", true},
		{"bad id", strings.Replace(valid(""), `"vm1"`, `"1vm"`, 1), "start with a letter", true},
		{"relative socket", strings.Replace(valid(""), `/run/vrdma/vm1.sock`, `vm1.sock`, 1), "absolute", true},
		{"no uuid", `{"version":1,"devices":[{"id":"vm1","socket":"/run/vrdma/vm1.sock"}]}`, "uuid missing", true},
		{"guid disagrees", valid(`,"guid":"0211:0000:0000:0001"`), "uuid", true},
		{"limit out of range", valid(`,"limits":{"max_qps":65537}`), "limits.max_qps", true},
		{"doorbells out of range", valid(`,"doorbell_queues":100000`), "doorbell_queues", true},
		{"id twice", `{"version":1,"devices":[{"id":"a","socket":"/a","uuid":"0211abcd-0000-4000-8000-000000000001"},{"id":"a","socket":"/b","uuid":"0211abcd-0000-4000-8000-000000000002"}]}`, "listed twice", true},
		{"socket twice", `{"version":1,"devices":[{"id":"a","socket":"/a","uuid":"0211abcd-0000-4000-8000-000000000001"},{"id":"b","socket":"/a","uuid":"0211abcd-0000-4000-8000-000000000002"}]}`, "also device", true},
		{"too many devices", many, "more than", true},
		{"too large", valid("") + strings.Repeat(" ", maxStateBytes), "larger than", true},
		{"newer version", `{"version":3,"devices":[],"future":true}`, "version 3", false},
		{"version 0", `{"version":0,"devices":[]}`, "version 0", false},
		{"share out of range", valid(`,"share":{"weight":5000}`), "share.weight", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, StateFile)
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			d, specs, err := openStateDaemon(dir)
			if !tt.wantKept {
				if err == nil {
					d.Close()
					t.Fatalf("OpenState: got %d devices and no error, want an error with %q", len(specs), tt.wantErr)
				}
				var se *StateError
				if !errors.As(err, &se) || !errors.Is(err, ErrState) {
					t.Fatalf("got %T %v, want a *StateError", err, err)
				}
				if !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), path) || se.Kept != "" {
					t.Errorf("error %q (kept %q): want it to name %s, say %q, and the file left in place", err, se.Kept, path, tt.wantErr)
				}
				if b, err := os.ReadFile(path); err != nil || string(b) != tt.content {
					t.Errorf("state file: got %v, want it unchanged", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("OpenState: %v; want it to set the file aside and go on", err)
			}
			if len(specs) != 0 {
				t.Errorf("OpenState: got %d devices, want none", len(specs))
			}
			p := setAsideProblem1(t, d)
			if !strings.HasPrefix(p.File, path+".corrupt-") || !strings.Contains(p.Message, tt.wantErr) ||
				!strings.Contains(p.Message, path) || !strings.Contains(p.Message, p.File) {
				t.Errorf("problem %+v: want a copy %s.corrupt-<time>, named in the message with %s and %q", p, path, path, tt.wantErr)
			}
			if b, err := os.ReadFile(p.File); err != nil || !bytes.Equal(b, []byte(tt.content)) {
				t.Errorf("kept copy: got %d bytes, %v; want the original %d bytes", len(b), err, len(tt.content))
			}
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("state file after the set-aside: %v, want it moved", err)
			}
			d.Close()
			// The next start runs without the bad file's devices, and is
			// degraded again while the copy is there.
			d, specs, err = openStateDaemon(dir)
			if err != nil {
				t.Fatalf("second start: %v", err)
			}
			defer d.Close()
			if len(specs) != 0 {
				t.Errorf("second start: got %d devices, want 0", len(specs))
			}
			if p2 := setAsideProblem1(t, d); p2.File != p.File || p2.ID != p.ID || !strings.Contains(p2.Message, "earlier start") {
				t.Errorf("second start: problem %+v, want the same copy %s, from an earlier start", p2, p.File)
			}
		})
	}
}

// setAsideProblem1 is the daemon's one problem, which must be a set-aside
// state file that needs an acknowledgement.
func setAsideProblem1(t *testing.T, d *Daemon) controlapi.Problem {
	t.Helper()
	h := d.Health()
	if h.Status != controlapi.StatusDegraded || len(h.Problems) != 1 {
		t.Fatalf("health: got %s with %d problems %+v, want degraded with one", h.Status, len(h.Problems), h.Problems)
	}
	p := h.Problems[0]
	if p.Kind != controlapi.ProblemStateSetAside || !p.NeedsAck || p.ID == "" || p.Since.IsZero() {
		t.Fatalf("problem %+v: want kind %s needing an acknowledgement, with an id and a time", p, controlapi.ProblemStateSetAside)
	}
	return p
}

// TestStateUnreadable: a state file that cannot be read (here a
// directory in its place) is moved aside too.
func TestStateUnreadable(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, StateFile), 0o700); err != nil {
		t.Fatal(err)
	}
	d, _, err := openStateDaemon(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := setAsideProblem1(t, d)
	if !strings.Contains(p.Message, "not a regular file") {
		t.Errorf("problem %+v: want it to say not a regular file", p)
	}
	if fi, err := os.Stat(p.File); err != nil || !fi.IsDir() {
		t.Errorf("kept copy %s: %v", p.File, err)
	}
}

// TestStateSymlink: a symbolic link in the state file's place is not
// followed; it is set aside like any unusable file, its target untouched.
func TestStateSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(t.TempDir(), "elsewhere.json")
	if err := os.WriteFile(target, []byte(`{"version":1,"devices":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, StateFile)); err != nil {
		t.Fatal(err)
	}
	d, _, err := openStateDaemon(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := setAsideProblem1(t, d)
	if fi, err := os.Lstat(p.File); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("kept copy %s: %v, want the link itself", p.File, err)
	}
	if _, err := os.Stat(target); err != nil {
		t.Errorf("link target: %v, want it untouched", err)
	}
}

// TestStateDirLocked: one vrdmad per state directory.
func TestStateDirLocked(t *testing.T) {
	dir := t.TempDir()
	stateDaemon(t, dir)
	_, _, err := openStateDaemon(dir)
	if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "in use by another vrdmad") {
		t.Fatalf("second daemon on %s: got %v, want ErrState saying it is in use", dir, err)
	}
}

// TestStateDirUnwritable: a state directory that cannot be created or
// written is an error at OpenState; one that goes away later makes the
// API's adds fail and leaves nothing behind, and removals still remove.
func TestStateDirUnwritable(t *testing.T) {
	t.Run("not a directory", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, err := openStateDaemon(filepath.Join(file, "state"))
		if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "create the state directory") {
			t.Fatalf("got %v, want ErrState about creating the directory", err)
		}
	})
	t.Run("read-only", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root writes into a read-only directory; the other cases cover the error path")
		}
		dir := t.TempDir()
		if err := os.Chmod(dir, 0o500); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(dir, 0o700)
		_, _, err := openStateDaemon(dir)
		if !errors.Is(err, ErrState) || !strings.Contains(err.Error(), "not writable") {
			t.Fatalf("got %v, want ErrState saying not writable", err)
		}
	})
	t.Run("gone after start", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "state")
		socks := t.TempDir()
		d := stateDaemon(t, state)
		h := d.Handler()
		if code, out := call(t, h, "POST", "/v1/devices", addBody("kept", filepath.Join(socks, "kept.sock"), "")); code != http.StatusCreated {
			t.Fatalf("POST: got %d %v", code, out)
		}
		if err := os.RemoveAll(state); err != nil {
			t.Fatal(err)
		}
		sock := filepath.Join(socks, "lost.sock")
		code, out := call(t, h, "POST", "/v1/devices", addBody("lost", sock, ""))
		if msg, _ := out["error"].(string); code != http.StatusInternalServerError || !strings.Contains(msg, "device state") {
			t.Errorf("POST with the state directory gone: got %d %v, want 500 naming the device state", code, out)
		}
		if _, ok := d.Device("lost"); ok {
			t.Error("device lost was added although it could not be saved")
		}
		if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket of the failed add: %v, want it removed", err)
		}
		code, out = call(t, h, "DELETE", "/v1/devices/kept", "")
		if msg, _ := out["warning"].(string); code != http.StatusOK || out["removed"] != true || out["still_listed"] != true ||
			!strings.Contains(msg, "still lists it") {
			t.Errorf("DELETE with the state directory gone: got %d %v, want 200, removed, still listed, a warning saying so", code, out)
		}
		if _, ok := d.Device("kept"); ok {
			t.Error("device kept still served after DELETE")
		}
	})
}

// TestRestoreConflicts: a saved device whose socket is now taken — by
// another process, a file, or a device from the command line — or whose
// id is a command-line device's, is not restored, and Restore says which
// and why.
func TestRestoreConflicts(t *testing.T) {
	socks := t.TempDir()
	taken := filepath.Join(socks, "taken.sock")
	listenBusy(t, taken)
	plain := filepath.Join(socks, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, socket string
		cliID        string // a command-line device added first, on cli.sock
		want         error
		wantMsg      string
	}{
		{"socket of another process", taken, "", ErrSocketInUse, "another process"},
		{"path not a socket", plain, "", ErrSocketInUse, "not a socket"},
		{"socket directory gone", filepath.Join(socks, "no", "x.sock"), "", nil, "listen"},
		{"id of a command-line device", filepath.Join(socks, "free.sock"), "vm1", ErrExists, "device exists"},
		{"socket of a command-line device", filepath.Join(socks, "cli.sock"), "other", ErrSocketInUse, "served by device other"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			rec := AddRequest{ID: "vm1", Socket: tt.socket, UUID: uuid.NewString()}
			spec, err := requestSpec(rec)
			if err != nil {
				t.Fatal(err)
			}
			st, err := openStateStore(state)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.save([]AddRequest{spec.record()}); err != nil {
				t.Fatal(err)
			}
			st.close()
			d, specs, err := openStateDaemon(state)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			if tt.cliID != "" {
				if _, err := d.AddDevice(DeviceSpec{ID: tt.cliID, Socket: filepath.Join(socks, "cli.sock")}); err != nil {
					t.Fatal(err)
				}
			}
			err = d.Restore(specs)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) || !strings.Contains(err.Error(), tt.wantMsg) ||
				!strings.Contains(err.Error(), "vm1") || !strings.Contains(err.Error(), tt.socket) || !strings.Contains(err.Error(), state) {
				t.Errorf("Restore: got %v, want %v (%q) naming vm1, %s and the state file", err, tt.want, tt.wantMsg, tt.socket)
			}
			// The saved device is not lost: the file still lists it.
			if got := readState(t, state); len(got.Devices) != 1 || got.Devices[0].ID != "vm1" {
				t.Errorf("state file after the failed restore: got %+v, want vm1 still listed", got.Devices)
			}
		})
	}
}

// TestRestartFrontendReconnect: a device added through the API, a
// front-end using it, the daemon restarted from its state file: the
// front-end reconnects to the restored socket as QEMU does (reconnect-ms),
// is told it lost its objects, resets the device and works again on a
// device with the same node GUID.
func TestRestartFrontendReconnect(t *testing.T) {
	state := t.TempDir()
	sock := filepath.Join(t.TempDir(), "vm1.sock")
	d1 := stateDaemon(t, state)
	if code, out := call(t, d1.Handler(), "POST", "/v1/devices", addBody("vm1", sock, `,"guid":"0211:2233:4455:6677"`)); code != http.StatusCreated {
		t.Fatalf("POST: got %d %v", code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, sock, 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defer c.Close()
	if _, err := c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	d1.Close()

	d2 := stateDaemon(t, state)
	if _, ok := d2.Device("vm1"); !ok {
		t.Fatal("vm1 not restored")
	}
	if err := f.Reconnect(ctx); err != nil {
		t.Fatalf("reconnect to the restored socket: %v", err)
	}
	ev, err := c.GetAsyncEvent(10 * time.Second)
	if err != nil || ev.Type != abi.EventDeviceFatal {
		t.Fatalf("after the restart: event %+v, %v; want DEVICE_FATAL", ev, err)
	}
	c.Close()
	c2, err := f.Reopen()
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	attr, err := c2.QueryDevice()
	if err != nil {
		t.Fatal(err)
	}
	if attr.NodeGUID != 0x0211223344556677 {
		t.Errorf("node GUID after the restart: got %#x, want 0x211223344556677", attr.NodeGUID)
	}
	pd, err := c2.AllocPD()
	if err != nil {
		t.Fatalf("after reset: %v", err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatal(err)
	}
}

// TestRecordSpecRoundTrip: a device's state-file record gives back the
// spec it came from.
func TestRecordSpecRoundTrip(t *testing.T) {
	for _, body := range []string{
		addBody("a", "/run/a.sock", ""),
		addBody("b", "/run/b.sock", `,"limits":{"max_qps":1,"max_pinned_bytes":2097152},"doorbell_queues":256`),
		addBody("c", "/run/c.sock", `,"gid":"fe80::211:2233:4455:6677"`),
	} {
		spec, err := DecodeAddRequest([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(spec.record())
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeAddRequest(b)
		if err != nil {
			t.Fatalf("%s: record %s: %v", body, b, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(spec) {
			t.Errorf("%s:\n got %+v\nwant %+v", body, got, spec)
		}
	}
}

func FuzzDecodeState(f *testing.F) {
	f.Add([]byte(`{"version":1,"devices":[{"id":"vm1","socket":"/run/vrdma/vm1.sock","uuid":"0211abcd-0000-4000-8000-000000000001","guid":"0311:abcd:0000:4000","limits":{"max_qps":64}}]}`))
	f.Add([]byte(`{"version":1,"devices":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		specs, err := decodeState(b)
		if err != nil {
			if specs != nil {
				t.Fatalf("error %v with %d specs", err, len(specs))
			}
			return
		}
		ids := map[string]bool{}
		for _, s := range specs {
			if checkID(s.ID) != nil || checkSocket(s.Socket) != nil || s.Device.UUID == uuid.Nil || ids[s.ID] || !s.Persist {
				t.Fatalf("accepted %+v", s)
			}
			ids[s.ID] = true
			if abi.CheckGUID(abi.GUIDOfUUID(s.Device.UUID)) != nil {
				t.Fatalf("accepted uuid %s", s.Device.UUID)
			}
		}
	})
}
