package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeQEMU writes a qemu-system-x86_64 stand-in into dir whose
// `-device help` lists the given generic device names (besides another
// PCI device) and which otherwise records its arguments in dir/argv and
// exits 1, as QEMU does on a bad command line. Every run is counted in
// dir/calls.
func fakeQEMU(t *testing.T, dir string, names ...string) string {
	t.Helper()
	var help strings.Builder
	help.WriteString(`Misc devices:\nname "virtio-rng-pci", bus PCI, alias "virtio-rng"\n`)
	for _, n := range names {
		fmt.Fprintf(&help, `name "%s", bus PCI, desc "Generic vhost-user device"\n`, n)
	}
	script := fmt.Sprintf(`#!/bin/sh
echo run >> %[1]s/calls
for a in "$@"; do
	if [ "$a" = help ]; then printf '%[2]s'; exit 0; fi
done
printf '%%s\n' "$@" > %[1]s/argv
echo "qemu-system-x86_64: fake QEMU, no machine" >&2
exit 1
`, dir, help.String())
	p := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// TestDeviceNameFakeQEMU: a QEMU 10.2 that lists only
// vhost-user-test-device-pci gets that name, QEMU is asked once per
// binary, and a binary replaced in place is asked again.
func TestDeviceNameFakeQEMU(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	bin := fakeQEMU(t, dir, DeviceNameTest)
	for i := 0; i < 3; i++ {
		if name, err := DeviceName(ctx, bin); err != nil || name != DeviceNameTest {
			t.Fatalf("DeviceName #%d: got %q, %v, want %s", i, name, err, DeviceNameTest)
		}
	}
	if n := countLines(t, filepath.Join(dir, "calls")); n != 1 {
		t.Errorf("fake QEMU ran %d times for 3 DeviceName calls, want 1", n)
	}
	// Upgraded in place to a build with every name: vrdma's own wins.
	time.Sleep(10 * time.Millisecond)
	fakeQEMU(t, dir, DeviceNameGeneric, DeviceNameTest, DeviceNameRDMA)
	if name, err := DeviceName(ctx, bin); err != nil || name != DeviceNameRDMA {
		t.Errorf("DeviceName after the binary changed: got %q, %v, want %s", name, err, DeviceNameRDMA)
	}
	if n := countLines(t, filepath.Join(dir, "calls")); n != 2 {
		t.Errorf("fake QEMU ran %d times, want 2 (asked again after it changed)", n)
	}
	// A stock QEMU hides the device: no name, an error, nothing cached.
	stock := fakeQEMU(t, t.TempDir())
	for i := 0; i < 2; i++ {
		if name, err := DeviceName(ctx, stock); !errors.Is(err, ErrNoRDMADevice) || name != "" {
			t.Errorf("DeviceName of a stock QEMU: got %q, %v, want ErrNoRDMADevice", name, err)
		}
	}
	if n := countLines(t, filepath.Join(filepath.Dir(stock), "calls")); n != 2 {
		t.Errorf("stock fake QEMU ran %d times, want 2 (failures are not cached)", n)
	}
}

// TestStartFakeQEMU102: Start on a QEMU that has only the 10.2 name builds
// its -device lines with that name; on one that has neither it never runs
// a machine.
func TestStartFakeQEMU102(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir := t.TempDir()
	bin := fakeQEMU(t, dir, DeviceNameTest)
	cfg := Config{Binary: bin, Devices: []VhostUserDevice{{ID: "rdma0", Socket: "/run/vrdma/rdma0.sock", NumVQs: 3, VQSize: 256, ConfigSize: 96}}, RootPorts: 1}
	_, err := Start(ctx, cfg)
	if !errors.Is(err, ErrExited) || !strings.Contains(err.Error(), "fake QEMU") {
		t.Fatalf("Start: got %v, want ErrExited with the fake's complaint", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "argv"))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimSpace(string(b)), "\n")
	want := DeviceNameTest + ",id=rdma0,bus=rdma0-port,chardev=rdma0-chr,virtio-id=42,num_vqs=3,vq_size=256,config_size=96"
	if devs := flagValues(args, "-device"); !slices.Contains(devs, want) {
		t.Errorf("-device values: got %q, want one %q", devs, want)
	}
	if strings.Contains(string(b), DeviceNameGeneric) {
		t.Errorf("command line names %s, which this QEMU lacks: %q", DeviceNameGeneric, args)
	}

	stockDir := t.TempDir()
	cfg.Binary = fakeQEMU(t, stockDir)
	if _, err := Start(ctx, cfg); !errors.Is(err, ErrNoRDMADevice) {
		t.Errorf("Start on a QEMU without the device: got %v, want ErrNoRDMADevice", err)
	}
	if _, err := os.Stat(filepath.Join(stockDir, "argv")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a machine was started on a QEMU without the device (%v)", err)
	}
}
