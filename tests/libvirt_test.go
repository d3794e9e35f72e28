package tests

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
	"github.com/vrdma/vrdma/vmm/qemu/qemutest"
)

// TestFakeVirshHelper is the fake virsh of qemutest.InstallFakeVirsh when
// this test binary runs as one; in a test run it skips.
func TestFakeVirshHelper(t *testing.T) { qemutest.FakeVirshHelper(t) }

// TestLibvirtHotplug is the hot-plug of TestHotplug on a VM whose QMP
// socket belongs to libvirt: every command goes through
// `virsh qemu-monitor-command` (a fake virsh in $PATH that forwards to the
// VM's monitor, as libvirtd would), so there are no QMP events and detach
// polls QEMU until the guest has released the device. One round: device
// add, attach, the guest probes and runs the selftest, detach (the guest
// lets go), device rm. vrdmactl does the attach and detach when it has
// --libvirt; otherwise the same vmm/qemu calls it would make.
func TestLibvirtHotplug(t *testing.T) {
	env := needGuestImage(t)
	ctl := needBinary(t, "vrdmactl")
	dir := t.TempDir()
	d := startVrdmad(t, dir)
	monitor := filepath.Join(dir, "monitor.sock")
	env.vms.Add(1)
	cfg := guestvm.Config{
		Name: "libvirt", QEMU: env.qemu, Kernel: env.kernel, Initrd: env.initrd,
		Run: "hotplug", Args: []string{"--rounds", "1", "--ack"},
		// A libvirt domain as docs/libvirt-domain.xml has it: spare root
		// ports with user aliases, and a monitor that libvirt holds.
		ExtraQEMUArgs: []string{
			"-device", "pcie-root-port,id=pci.1,bus=pcie.0,chassis=1",
			"-device", "pcie-root-port,id=ua-vrdma-rp0,bus=pcie.0,chassis=2",
			"-chardev", "socket,id=charmonitor,path=" + monitor + ",server=on,wait=off",
			"-mon", "chardev=charmonitor,mode=control",
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	g := boot(t, ctx, cfg)
	lines := g.Lines()
	waitFile(t, monitor)
	virsh := qemutest.InstallFakeVirsh(t, "TestFakeVirshHelper", "vm1", monitor)

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, ctl, append([]string{"--control", d.control}, args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("vrdmactl %s: %v: %s", strings.Join(args, " "), err, stderr.String())
		}
		return stdout.String()
	}
	help, _ := exec.Command(ctl, "vm", "attach", "--help").CombinedOutput()
	viaCtl := bytes.Contains(help, []byte("-libvirt"))

	next := func(want string) guestresult.Hotplug {
		t.Helper()
		return nextGuestEvent[guestresult.Hotplug](t, ctx, lines, guestresult.RoleHotplug, want, 1)
	}
	sock := filepath.Join(dir, "lv0.sock")
	next("waiting")
	start := time.Now()
	run("device", "add", "lv0", "--socket", sock)
	if viaCtl {
		run("vm", "attach", "--libvirt", "vm1", "--device", "lv0")
	} else {
		mon, err := qemu.DialLibvirt(ctx, "vm1", qemu.LibvirtOptions{})
		if err != nil {
			t.Fatal(err)
		}
		dev := qemu.VhostUserDevice{ID: "lv0", Socket: sock, VirtioID: abi.DeviceID,
			NumVQs: abi.FirstDoorbellQueue + 1, VQSize: 256, ConfigSize: abi.ConfigSize}
		bus, err := qemu.AttachVhostUserQMP(ctx, mon, dev, "", qemu.HotplugOptions{Version: *mon.Version})
		if err != nil {
			t.Fatal(err)
		}
		if bus != "ua-vrdma-rp0" {
			t.Errorf("attached on %s, want ua-vrdma-rp0 (the port kept for vrdma, not libvirt's pci.1)", bus)
		}
	}
	attached := time.Since(start)
	next("usable")
	next("attached")
	if info := deviceInfo(t, d, "lv0"); !info.Connected {
		t.Errorf("device lv0 not connected after attach: %+v", info)
	}
	start = time.Now()
	if viaCtl {
		run("vm", "detach", "--libvirt", "vm1", "--device", "lv0")
	} else {
		mon, err := qemu.DialLibvirt(ctx, "vm1", qemu.LibvirtOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := qemu.DetachVhostUserQMP(ctx, mon, "lv0", nil); err != nil {
			t.Fatal(err)
		}
	}
	detached := time.Since(start)
	run("device", "rm", "lv0")
	gone := next("detached")
	if err := g.WriteLine("VRDMA-NEXT"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.WaitResult(ctx); err != nil {
		t.Fatalf("guest: %v", err)
	}
	// Every QEMU command went through virsh.
	calls := virsh.Calls()
	for _, c := range calls {
		if len(c) < 4 || c[0] != "qemu-monitor-command" || c[2] != "vm1" {
			t.Errorf("virsh run %q, want qemu-monitor-command --domain vm1 JSON", c)
		}
	}
	t.Logf("libvirt hot-plug (vrdmactl: %v): attach %.3f s, detach %.3f s (guest released the slot: %v), %d virsh runs",
		viaCtl, attached.Seconds(), detached.Seconds(), gone.Released, len(calls))
}
