package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// rootPortConfig is a PCIe root port's config space with a PCIe capability
// at 0x40 (after a power management one at 0x50 in the list) whose Slot
// Control is sltctl.
func rootPortConfig(sltctl uint16) []byte {
	cfg := make([]byte, 256)
	binary.LittleEndian.PutUint16(cfg[0x06:], 1<<4) // capability list
	cfg[0x34] = 0x50
	cfg[0x50], cfg[0x51] = 0x01, 0x40 // PM -> PCIe
	cfg[0x40], cfg[0x41] = 0x10, 0x00 // PCIe, end
	binary.LittleEndian.PutUint16(cfg[0x40+0x18:], sltctl)
	return cfg
}

func TestSlotControl(t *testing.T) {
	loop := rootPortConfig(0)
	loop[0x41] = 0x50 // PCIe cap id replaced below: a cycle
	loop[0x40] = 0x05
	short := rootPortConfig(0x2c0)[:0x50]
	tests := []struct {
		name   string
		cfg    []byte
		want   uint16
		wantOK bool
	}{
		{"blinking", rootPortConfig(0x02c0 | 0x0200), 0x02c0 | 0x0200, true},
		{"on", rootPortConfig(0x01c0), 0x01c0, true},
		{"no capabilities", make([]byte, 256), 0, false},
		{"too short", make([]byte, 16), 0, false},
		{"cycle without pcie", loop, 0, false},
		{"truncated", short, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := slotControl(tt.cfg)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("got %#x, %v, want %#x, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func FuzzSlotControl(f *testing.F) {
	f.Add(rootPortConfig(0x02c0))
	f.Fuzz(func(t *testing.T, cfg []byte) {
		v, ok := slotControl(cfg)
		if !ok && v != 0 {
			t.Fatalf("not found but got %#x", v)
		}
	})
}

// TestWaitDeviceAndGone runs the guest's rescan and removal waits on a
// fake sysfs.
func TestWaitDeviceAndGone(t *testing.T) {
	dir := t.TempDir()
	old := sysfs
	t.Cleanup(func() { sysfs = old })
	sysfs = hotplugFS{rescan: filepath.Join(dir, "rescan"), devices: filepath.Join(dir, "devices"), slots: filepath.Join(dir, "slots")}
	for _, p := range []string{sysfs.devices, sysfs.slots} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := waitDevice(100 * time.Millisecond); err == nil {
		t.Fatal("waitDevice with no device: got nil error")
	}
	dev := filepath.Join(sysfs.devices, "0000:01:00.0")
	go func() {
		time.Sleep(60 * time.Millisecond)
		os.MkdirAll(dev, 0o755)
		os.WriteFile(filepath.Join(dev, "device"), []byte("0x106a\n"), 0o644)
		os.WriteFile(filepath.Join(dev, "vendor"), []byte("0x1af4\n"), 0o644)
	}()
	addr, err := waitDevice(5 * time.Second)
	if err != nil || addr != "0000:01:00.0" {
		t.Fatalf("waitDevice: got %q, %v, want 0000:01:00.0", addr, err)
	}
	if b, _ := os.ReadFile(sysfs.rescan); string(b) != "1" {
		t.Errorf("rescan file: got %q, want 1", b)
	}
	if _, _, err := waitGone(addr, 100*time.Millisecond); err == nil {
		t.Error("waitGone with the device present: got nil error")
	}
	go func() {
		time.Sleep(60 * time.Millisecond)
		os.RemoveAll(dev)
	}()
	if _, released, err := waitGone(addr, 5*time.Second); err != nil || released {
		t.Errorf("waitGone: got released=%v, %v, want false, nil", released, err)
	}
}
