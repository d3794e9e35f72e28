package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// repoRoot is the checkout, two levels above this package's directory.
func repoRoot(t testing.TB) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

// needBinary finds a binary of the project's bin/ (or QEMU). It skips when
// it is missing outside CI; in CI (CI=true, where make test builds
// everything first) a missing binary is a failure.
func needBinary(t testing.TB, name string) string {
	t.Helper()
	if testing.Short() {
		// make test's -race pass is -short: the binaries and VMs are the
		// same in both passes, so they run once, in the full pass.
		t.Skip("short mode: needs the built binaries")
	}
	var p string
	var err error
	if name == "qemu-system-x86_64" {
		p, err = qemu.FindBinary(repoRoot(t))
	} else {
		p = filepath.Join(repoRoot(t), "bin", name)
		_, err = os.Stat(p)
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: %s is missing (make test builds it): %v", name, err)
		}
		t.Skipf("%s not built (run make build / make qemu): %v", name, err)
	}
	return p
}

// vrdmadProc is the built daemon binary run by startVrdmad: a thin layer
// over internal/vrdmadproc with the names the tests use.
type vrdmadProc struct {
	*vrdmadproc.Proc
	control string // the control socket
}

// startVrdmad runs bin/vrdmad with a control socket in dir, --log-level
// debug and args, waits for its control API, and stops it at cleanup
// (SIGTERM; it must exit cleanly, else the test fails). The log is
// printed when the test failed.
func startVrdmad(t *testing.T, dir string, args ...string) *vrdmadProc {
	t.Helper()
	bin := needBinary(t, "vrdmad")
	p, err := vrdmadproc.Start(context.Background(), vrdmadproc.Config{
		Binary: bin, Dir: dir, Args: args, LogLevel: "debug", LogLimit: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Error(err) // the error holds the log
		} else if t.Failed() {
			t.Logf("vrdmad log:\n%s", p.Log())
		}
	})
	return &vrdmadProc{Proc: p, control: p.Control()}
}

func (p *vrdmadProc) devices() ([]controlapi.DeviceInfo, error) { return p.Devices() }

// waitPCI polls query-pci until vendor:device shows up: a device behind a
// PCIe root port is listed only once the firmware has numbered the
// port's secondary bus, a moment after QEMU starts.
func waitPCI(ctx context.Context, t *testing.T, vm *qemu.VM, vendor, device uint16) (*qemu.PCIDevice, []qemu.PCIDevice) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pci, err := vm.QueryPCI(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range pci {
			if pci[i].VendorID == vendor && pci[i].DeviceID == device {
				return &pci[i], pci
			}
		}
		if time.Now().After(deadline) {
			return nil, pci
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestQEMUAttach starts the patched QEMU with vrdma's vhost-user-rdma-pci
// (and, to keep it working, the generic vhost-user-device-pci) against the
// vrdmad binary and checks, through QMP, that the guest's PCI bus has the
// vrdma device 1af4:106a with the daemon's config size and queue count,
// and, through the control API, that the daemon has the front-end.
func TestQEMUAttach(t *testing.T) {
	for _, name := range []string{qemu.DeviceNameRDMA, qemu.DeviceNameGeneric} {
		t.Run(name, func(t *testing.T) { testQEMUAttach(t, name) })
	}
}

func testQEMUAttach(t *testing.T, name string) {
	qbin := needBinary(t, "qemu-system-x86_64")
	dir := t.TempDir()
	sock := filepath.Join(dir, "vm1.sock")
	d := startVrdmad(t, dir, "--socket", "vrdma0="+sock)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dev := qemu.VhostUserDevice{ID: "vrdma0", Socket: sock, VirtioID: abi.DeviceID,
		NumVQs: abi.FirstDoorbellQueue + 1, VQSize: 256, ConfigSize: abi.ConfigSize}
	vm, err := qemu.Start(ctx, qemu.Config{Binary: qbin, MemoryMiB: 256, Devices: []qemu.VhostUserDevice{dev}, DeviceName: name})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Kill()

	found, pci := waitPCI(ctx, t, vm, 0x1af4, 0x1040+abi.DeviceID)
	for _, p := range pci {
		t.Logf("pci %02x:%02x.%d %04x:%04x %s %s", p.Bus, p.Slot, p.Function, p.VendorID, p.DeviceID, p.ClassInfo, p.ID)
	}
	if found == nil {
		t.Fatalf("no 1af4:%04x device on the guest's PCI bus", 0x1040+abi.DeviceID)
	}
	if found.ID != dev.ID {
		t.Errorf("device id %q, want %q", found.ID, dev.ID)
	}
	qomGet := func(prop string) json.RawMessage {
		t.Helper()
		raw, err := vm.QMP().Run([]byte(fmt.Sprintf(`{"execute":"qom-get","arguments":{"path":"/machine/peripheral/%s","property":%q}}`, dev.ID, prop)))
		if err != nil {
			t.Fatalf("qom-get %s: %v", prop, err)
		}
		var r struct {
			Return json.RawMessage `json:"return"`
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("qom-get %s: %s: %v", prop, raw, err)
		}
		return r.Return
	}
	if typ := string(qomGet("type")); typ != `"`+name+`"` {
		t.Errorf("QOM type %s, want %q", typ, name)
	}
	// The properties QEMU realised the device with: what the daemon serves.
	// vhost-user-rdma-pci is device 42 without a virtio-id property.
	props := map[string]float64{"config_size": abi.ConfigSize, "num_vqs": float64(dev.NumVQs), "vq_size": float64(dev.VQSize)}
	if name != qemu.DeviceNameRDMA {
		props["virtio-id"] = abi.DeviceID
	}
	for prop, want := range props {
		if got := string(qomGet(prop)); got != fmt.Sprint(want) {
			t.Errorf("%s: QEMU has %s, want %v", prop, got, want)
		}
	}
	// The daemon has QEMU as its front-end and saw no protocol errors.
	devs, err := d.devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || !devs[0].Connected || devs[0].ID != "vrdma0" || devs[0].Errors != 0 {
		t.Fatalf("control API: %+v", devs)
	}
	if err := vm.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// QEMU gone: the daemon releases the session.
	deadline := time.Now().Add(10 * time.Second)
	for {
		devs, err := d.devices()
		if err == nil && len(devs) == 1 && !devs[0].Connected {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("device still connected after QEMU quit: %+v %v", devs, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestQEMURDMADeviceDefaults: `-device vhost-user-rdma-pci,chardev=…` with
// nothing else realises vrdmad's default device (3 virtqueues of 256, 96
// bytes of config); a num_vqs that differs from the device vrdmad serves
// (two doorbell queues: 4 virtqueues) stops QEMU with an error that says
// what to set, and so do values the device cannot have.
func TestQEMURDMADeviceDefaults(t *testing.T) {
	qbin := needBinary(t, "qemu-system-x86_64")
	if ok, err := qemu.HasDevice(context.Background(), qbin, qemu.DeviceNameRDMA); err != nil || !ok {
		t.Fatalf("%s lacks %s (%v): make qemu builds it with vmm/qemu/patches/0003", qbin, qemu.DeviceNameRDMA, err)
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "vm1.sock")
	wide := filepath.Join(dir, "vm2.sock")
	startVrdmad(t, dir, "--socket", "vm1="+sock)
	startVrdmad(t, t.TempDir(), "--socket", "vm2="+wide, "--doorbell-queues", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	boot := func(sock, device string) (string, error) {
		qmp := filepath.Join(t.TempDir(), "qmp.sock")
		cmd := exec.CommandContext(ctx, qbin, "-machine", "q35,memory-backend=mem", "-m", "128M",
			"-object", "memory-backend-memfd,id=mem,size=128M,share=on", "-nodefaults", "-display", "none",
			"-chardev", "socket,id=c0,path="+sock, "-device", device,
			"-qmp", "unix:"+qmp+",server=on,wait=off")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			return "", err
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Up once the QMP socket answers; refused devices make QEMU exit
		// before that.
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			select {
			case err := <-exited:
				return out.String(), fmt.Errorf("qemu exited: %v", err)
			default:
			}
			mon, err := qemu.DialQMP(ctx, qmp)
			if err != nil {
				continue
			}
			defer mon.Disconnect()
			raw, err := mon.Run([]byte(`{"execute":"qom-get","arguments":{"path":"/machine/peripheral-anon/device[0]","property":"num_vqs"}}`))
			cmd.Process.Kill()
			<-exited
			return string(raw), err
		}
		cmd.Process.Kill()
		<-exited
		return out.String(), errors.New("QMP never answered")
	}
	out, err := boot(sock, "vhost-user-rdma-pci,chardev=c0")
	if err != nil || !strings.Contains(out, `"return": 3`) && !strings.Contains(out, `"return":3`) {
		t.Errorf("vhost-user-rdma-pci,chardev=c0 against vrdmad's default device: got %v, %s; want it up with num_vqs 3", err, out)
	}
	for _, tc := range []struct{ sock, device, want string }{
		{wide, "vhost-user-rdma-pci,chardev=c0", "set num_vqs=4"},
		{sock, "vhost-user-rdma-pci,chardev=c0,vq_size=100", "vq_size=100 is not a power of two"},
		{sock, "vhost-user-rdma-pci,chardev=c0,num_vqs=2", "num_vqs=2 is out of range"},
		{sock, "vhost-user-rdma-pci,chardev=c0,config_size=64", "config_size=64 is out of range"},
		{sock, "vhost-user-rdma-pci,chardev=c0,virtio-id=41", "virtio-id"},
	} {
		out, err := boot(tc.sock, tc.device)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%s: got %v, %q; want QEMU to stop saying %q", tc.device, err, out, tc.want)
		}
	}
}
