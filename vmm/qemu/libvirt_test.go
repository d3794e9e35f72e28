package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/vmm/qemu/qemutest"
)

// TestFakeVirshHelper is the fake virsh of qemutest.InstallFakeVirsh when
// this test binary runs as one; in a test run it skips.
func TestFakeVirshHelper(t *testing.T) { qemutest.FakeVirshHelper(t) }

const fakeVirshHelper = "TestFakeVirshHelper"

func TestParseVirshReply(t *testing.T) {
	tests := []struct {
		name, out, want, wantErr string
	}{
		{"return", `{"return":{},"id":"libvirt-12"}` + "\n\n", `{"return":{},"id":"libvirt-12"}`, ""},
		{"pretty", "{\n  \"return\": [\n    1\n  ]\n}\n", "{\n  \"return\": [\n    1\n  ]\n}", ""},
		{"null return", `{"return":null}`, `{"return":null}`, ""},
		{"qmp error", `{"id":"libvirt-3","error":{"class":"GenericError","desc":"Duplicate device ID 'rdma1'"}}`, "", "Duplicate device ID 'rdma1'"},
		{"error without desc", `{"error":{"class":"CommandNotFound"}}`, "", "CommandNotFound"},
		{"empty", "\n", "", "no QMP reply"},
		{"not json", "error: something\n", "", "no QMP reply"},
		{"neither", `{"id":"libvirt-1"}`, "", "neither return nor error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVirshReply([]byte(tt.out))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || got != nil {
					t.Fatalf("got %q, %v; want nil and an error with %q", got, err, tt.wantErr)
				}
				return
			}
			if err != nil || string(got) != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestNewLibvirtMonitorInvalid(t *testing.T) {
	for _, tc := range []struct {
		domain string
		o      LibvirtOptions
	}{
		{"", LibvirtOptions{}},
		{"vm\n1", LibvirtOptions{}},
		{strings.Repeat("d", 300), LibvirtOptions{}},
		{"vm1", LibvirtOptions{URI: "qemu:///system\x00"}},
		{"vm1", LibvirtOptions{CommandTimeout: -time.Second}},
	} {
		if _, err := NewLibvirtMonitor(tc.domain, tc.o); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewLibvirtMonitor(%q, %+v): got %v, want ErrInvalidConfig", tc.domain, tc.o, err)
		}
	}
}

// TestLibvirtMonitor runs LibvirtMonitor against a fake virsh in $PATH
// that forwards to a fake QMP server: the virsh command line, QMP replies
// and errors, and every way virsh itself fails.
func TestLibvirtMonitor(t *testing.T) {
	srv := qemutest.NewQMPServer(t, externalHandler([]string{DeviceNameGeneric}, func(execute string, _ map[string]any) (any, error) {
		if execute == "device_del" {
			return nil, errors.New("Device 'nosuch' not found")
		}
		return nil, fmt.Errorf("The command %s has not been found", execute)
	}))
	virsh := qemutest.InstallFakeVirsh(t, fakeVirshHelper, "vm1", srv.Socket)
	ctx := context.Background()

	mon, err := DialLibvirt(ctx, "vm1", LibvirtOptions{URI: "qemu:///system"})
	if err != nil {
		t.Fatalf("DialLibvirt: %v", err)
	}
	if mon.Version == nil || mon.Version.QEMU.Major != 10 || mon.Version.QEMU.Micro != 2 {
		t.Errorf("Version: got %+v, want 10.0.2", mon.Version)
	}
	calls := virsh.Calls()
	want := []string{"-c", "qemu:///system", "qemu-monitor-command", "--domain", "vm1", `{"execute":"query-version"}`}
	if len(calls) != 1 || !slices.Equal(calls[0], want) {
		t.Errorf("virsh runs: got %q, want one: %q", calls, want)
	}

	// A QMP error comes back as virsh's exit 0 with QEMU's reply.
	_, err = runQMP(ctx, mon, "device_del", map[string]any{"id": "nosuch"})
	if !errors.Is(err, ErrQMP) || errors.Is(err, ErrLibvirt) || !strings.Contains(err.Error(), "Device 'nosuch' not found") {
		t.Errorf("device_del nosuch: got %v, want ErrQMP with QEMU's words", err)
	}
	if name, err := DeviceNameQMP(ctx, mon); err != nil || name != DeviceNameGeneric {
		t.Errorf("DeviceNameQMP: got %q, %v, want %s", name, err, DeviceNameGeneric)
	}
	if _, err := mon.Run([]byte("query-pci")); err == nil {
		t.Errorf("Run of a non-JSON command: got nil error")
	}
	if _, err := mon.Events(ctx); !errors.Is(err, errEventsNotSupported()) {
		t.Errorf("Events: got %v, want ErrEventsNotSupported", err)
	}

	failures := []struct {
		name    string
		domain  string
		o       LibvirtOptions
		setup   func(t *testing.T)
		wantErr error
		wantMsg string
	}{
		{name: "unknown domain", domain: "vm9", wantErr: ErrLibvirt, wantMsg: "failed to get domain 'vm9'"},
		{name: "wrong connection", domain: "vm1", o: LibvirtOptions{URI: "qemu:///session"},
			setup:   func(t *testing.T) { virsh.RequireURI(t, "qemu:///system") },
			wantErr: ErrLibvirt, wantMsg: "failed to connect to the hypervisor"},
		{name: "domain not running", domain: "vm1",
			setup:   func(t *testing.T) { t.Setenv("VRDMA_FAKE_VIRSH_QMP", filepath.Join(t.TempDir(), "gone.sock")) },
			wantErr: ErrLibvirt, wantMsg: "domain is not running"},
		{name: "no virsh in PATH", domain: "vm1",
			setup:   func(t *testing.T) { t.Setenv("PATH", t.TempDir()) },
			wantErr: ErrLibvirt, wantMsg: "install libvirt-clients"},
		{name: "virsh given and missing", domain: "vm1", o: LibvirtOptions{Virsh: "/nonexistent/virsh"}, wantErr: ErrLibvirt},
		{name: "virsh hangs", domain: "vm1", o: LibvirtOptions{CommandTimeout: 300 * time.Millisecond},
			setup:   func(t *testing.T) { virsh.Hang(t) },
			wantErr: context.DeadlineExceeded, wantMsg: "virsh did not answer"},
	}
	for _, tt := range failures {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				tt.setup(t)
			}
			start := time.Now()
			m, err := DialLibvirt(ctx, tt.domain, tt.o)
			if m != nil || !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Fatalf("DialLibvirt: got %v, %v; want nil and %v with %q", m, err, tt.wantErr, tt.wantMsg)
			}
			if got := errors.Is(err, ErrNoDomain); got != (tt.name == "unknown domain") {
				t.Errorf("errors.Is(%v, ErrNoDomain) = %v", err, got)
			}
			var le *LibvirtError
			if !errors.As(err, &le) || le.Domain != tt.domain || le.Op != "qemu-monitor-command" {
				t.Errorf("got %#v, want a *LibvirtError for domain %s, op qemu-monitor-command", err, tt.domain)
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

// libvirtQEMU is a fake QEMU behind libvirt for the hot-plug tests: root
// ports as libvirt names them, a device that leaves QOM goneAfter polls
// after device_del (never when negative), and a chardev that is busy for
// one chardev-remove after that.
func libvirtQEMU(goneAfter int) qemutest.Handler {
	var mu sync.Mutex
	plugged, deleted, polls, busy := false, false, 0, true
	ports := map[string]bool{"pci.1": true, "pci.2": false, "ua-vrdma-rp0": false}
	inner := externalHandler([]string{DeviceNameGeneric}, hotplugHandler(ports, true, 1, nil))
	return func(execute string, args map[string]any) (any, error) {
		mu.Lock()
		defer mu.Unlock()
		switch execute {
		case "device_add":
			plugged = true
		case "device_del":
			if !plugged {
				return nil, fmt.Errorf("Device '%v' not found", args["id"])
			}
			deleted = true
			return map[string]any{}, nil
		case "chardev-remove":
			if deleted && busy {
				busy = false
				return nil, fmt.Errorf("Chardev '%v' is busy", args["id"])
			}
			return map[string]any{}, nil
		case "qom-list":
			if args["path"] == "/machine/peripheral" && plugged {
				if deleted {
					polls++
				}
				out, _ := inner(execute, args)
				if !deleted || goneAfter < 0 || polls <= goneAfter {
					out = append(out.([]any), map[string]string{"name": "rdma1", "type": "child<vhost-user-device-pci>"})
				} else {
					plugged = false
				}
				return out, nil
			}
		}
		return inner(execute, args)
	}
}

// TestLibvirtHotplug attaches and detaches a device through virsh: the
// spare port libvirt's domain keeps for vrdma, and a detach that polls
// QOM (virsh gives no events) and waits out a busy chardev.
func TestLibvirtHotplug(t *testing.T) {
	dev := VhostUserDevice{ID: "rdma1", Socket: "/s", NumVQs: 3, VQSize: 256, ConfigSize: 96}
	tests := []struct {
		name      string
		goneAfter int
		wantErr   error
		wantTail  []string
	}{
		{"released", 2, nil, []string{"device_del", "qom-list", "qom-list", "qom-list", "chardev-remove", "chardev-remove"}},
		{"never released", -1, context.DeadlineExceeded, nil},
	}
	// Every command is a process of this test binary: slow under -race
	// on a busy machine, so the deadlines are generous.
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := qemutest.NewQMPServer(t, libvirtQEMU(tt.goneAfter))
			qemutest.InstallFakeVirsh(t, fakeVirshHelper, "vm1", srv.Socket)
			ctx := context.Background()
			mon, err := DialLibvirt(ctx, "vm1", LibvirtOptions{})
			if err != nil {
				t.Fatal(err)
			}
			o := HotplugOptions{Version: *mon.Version}
			bus, err := AttachVhostUserQMP(ctx, mon, dev, "", o)
			if err != nil || bus != "ua-vrdma-rp0" {
				t.Fatalf("AttachVhostUserQMP: got %q, %v, want ua-vrdma-rp0", bus, err)
			}
			n := len(srv.Commands())
			timeout := 30 * time.Second
			if tt.wantErr != nil {
				timeout = 5 * time.Second
			}
			dctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			err = DetachVhostUserQMP(dctx, mon, dev.ID, nil)
			got := srv.Commands()[n:]
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), "did the guest release the device?") {
					t.Fatalf("DetachVhostUserQMP: got %v, want %v", err, tt.wantErr)
				}
				if slices.Contains(got, "chardev-remove") {
					t.Errorf("chardev-remove of a device still present: %q", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("DetachVhostUserQMP: %v", err)
			}
			if !slices.Equal(got, tt.wantTail) {
				t.Errorf("detach: got commands %q, want %q", got, tt.wantTail)
			}
		})
	}
}

// TestLibvirtRealQEMU drives the patched QEMU through the fake virsh, as
// vrdmactl --libvirt would drive a libvirt domain: its version, PCI bus,
// a device hot-plugged against vrdmad on the free root port, and a detach
// that times out because no guest is there to release it (the e2e test
// tests/libvirt_test.go has a guest).
func TestLibvirtRealQEMU(t *testing.T) {
	if testing.Short() {
		// make test's -race pass: the full pass runs it, and its virsh
		// runs, each a start of this test binary, crawl under -race.
		t.Skip("short mode")
	}
	bin := testBinary(t)
	vrdmad := filepath.Join("..", "..", "bin", "vrdmad")
	if _, err := os.Stat(vrdmad); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI is set but bin/vrdmad is missing (make build): %v", err)
		}
		t.Skipf("bin/vrdmad not built: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "vrdma-lv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	d, err := vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: vrdmad, Dir: dir, Devices: []string{"rdma1"}, LogLevel: "info", LogLimit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Error(err)
		}
	})
	sock := filepath.Join(dir, "rdma1.sock")

	// The domain's monitor: a second QMP socket, as libvirt's own.
	libvirtQMP := filepath.Join(dir, "monitor.sock")
	vm, err := Start(ctx, Config{Binary: bin, MemoryMiB: 128, RootPorts: 1, ExtraArgs: []string{
		"-chardev", "socket,id=lvmon,path=" + libvirtQMP + ",server=on,wait=off",
		"-mon", "chardev=lvmon,mode=control"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vm.Kill() })
	virsh := qemutest.InstallFakeVirsh(t, fakeVirshHelper, "vm1", libvirtQMP)

	mon, err := DialLibvirt(ctx, "vm1", LibvirtOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := mon.Version.QEMU; got.Major != 10 {
		t.Errorf("QEMU version through virsh: got %+v, want 10.x", got)
	}
	dev := VhostUserDevice{ID: "rdma1", Socket: sock, NumVQs: 3, VQSize: 256, ConfigSize: 96}
	start := time.Now()
	bus, err := AttachVhostUserQMP(ctx, mon, dev, "", HotplugOptions{Version: *mon.Version})
	if err != nil || bus != "vrdma-rp0" {
		t.Fatalf("AttachVhostUserQMP: got %q, %v, want vrdma-rp0", bus, err)
	}
	t.Logf("attach through %d virsh runs took %v", len(virsh.Calls())-1, time.Since(start))
	// QEMU has the device, with what we asked for, behind the port.
	var pci []PCIDevice
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if pci, err = QueryPCIQMP(ctx, mon); err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(pci, func(p PCIDevice) bool { return p.ID == "rdma1" }) || time.Now().After(deadline) {
			break
		}
	}
	i := slices.IndexFunc(pci, func(p PCIDevice) bool { return p.ID == "rdma1" })
	if i < 0 || pci[i].VendorID != 0x1af4 || pci[i].DeviceID != 0x1040+DefaultVirtioID {
		t.Fatalf("query-pci through virsh: no 1af4:106a with id rdma1: %+v", pci)
	}
	if raw, err := runQMP(ctx, mon, "qom-get", map[string]any{"path": "/machine/peripheral/rdma1", "property": "num_vqs"}); err != nil || string(raw) != "3" {
		t.Errorf("qom-get num_vqs: got %s, %v, want 3", raw, err)
	}
	// The same id again is QEMU's error, and nothing is left behind.
	if _, err := AttachVhostUserQMP(ctx, mon, dev, "", HotplugOptions{}); !errors.Is(err, ErrNoFreeRootPort) {
		t.Errorf("second attach: got %v, want ErrNoFreeRootPort", err)
	}
	// No guest: device_del is sent and the device stays; detach says so
	// and keeps the chardev (the device still uses it).
	dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
	err = DetachVhostUserQMP(dctx, mon, "rdma1", nil)
	dcancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "did the guest release the device?") {
		t.Errorf("DetachVhostUserQMP without a guest: got %v, want a timeout asking about the guest", err)
	}
	raw, err := runQMP(ctx, mon, "query-chardev", nil)
	if err != nil || !strings.Contains(string(raw), "rdma1-chr") {
		t.Errorf("query-chardev after a detach that timed out: got %s, %v, want rdma1-chr kept", raw, err)
	}
}

func errEventsNotSupported() error {
	_, err := (&fakeMonitor{}).Events(context.Background())
	return err
}
