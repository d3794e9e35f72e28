package main

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vrdma/vrdma/vmm/qemu"
	"github.com/vrdma/vrdma/vmm/qemu/qemutest"
)

// TestVMAttachDevice: vm attach adds vrdma's own vhost-user-rdma-pci where
// the QEMU has it, falls back to the generic device, and where the QEMU
// has no device vrdma can use it says so, names the QEMU to use instead,
// and leaves nothing behind in QEMU.
func TestVMAttachDevice(t *testing.T) {
	control, _ := startControl(t)
	sock := filepath.Join(filepath.Dir(control), "vm1.sock")
	if _, errs, code := ctl(control, "device", "add", "vm1", "--socket", sock); code != 0 {
		t.Fatalf("device add: exit %d: %s", code, errs)
	}
	// What QEMU 10.0 says to device_add of a type that is not
	// user-creatable: its unpatched generic device.
	hidden := errors.New("Parameter 'driver' expects a pluggable device type")
	tests := []struct {
		name    string
		types   []string
		addErr  error
		code    int
		want    []string // in the error message
		driver  string   // of the device_add that succeeded
		wantCmd []string // commands QEMU must, or (prefixed "!") must not, have seen
	}{
		{name: "vrdma-qemu", types: []string{qemu.DeviceNameGeneric, qemu.DeviceNameRDMA},
			driver: qemu.DeviceNameRDMA, wantCmd: []string{"chardev-add", "device_add"}},
		{name: "patched without 0003", types: []string{qemu.DeviceNameGeneric},
			driver: qemu.DeviceNameGeneric, wantCmd: []string{"device_add"}},
		{name: "no device", types: []string{"virtio-net-pci", "vhost-user-blk-pci"}, code: exitFailure,
			want:    []string{"QEMU 10.0.2", "no device for vrdma", qemu.DeviceNameRDMA, "vrdma-qemu", qemu.InstalledBinary},
			wantCmd: []string{"qom-list-types", "!chardev-add", "!device_add"}},
		{name: "generic device hidden", types: []string{qemu.DeviceNameGeneric}, addErr: hidden, code: exitFailure,
			want:    []string{"no device for vrdma", "does not let it be created", "vrdma-qemu", "pluggable device type"},
			wantCmd: []string{"device_add", "chardev-remove"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var mu sync.Mutex
			var added map[string]any
			srv := qemutest.NewQMPServer(t, func(cmd string, args map[string]any) (any, error) {
				switch cmd {
				case "qom-list-types":
					var out []map[string]string
					for _, n := range tt.types {
						out = append(out, map[string]string{"name": n})
					}
					return out, nil
				case "query-memdev":
					return []map[string]any{{"id": "mem", "share": true, "size": 1 << 30}}, nil
				case "query-chardev":
					return []map[string]string{{"label": "vm1-chr", "filename": "unix:" + sock}}, nil
				case "chardev-add", "chardev-remove":
					return map[string]any{}, nil
				case "device_add":
					if tt.addErr != nil {
						return nil, tt.addErr
					}
					mu.Lock()
					added = args
					mu.Unlock()
					return map[string]any{}, nil
				}
				return nil, errors.New("unknown command " + cmd)
			})
			_, errs, code := ctl(control, "vm", "attach", "--qmp", srv.Socket, "--device", "vm1", "--bus", "rp0")
			if code != tt.code {
				t.Fatalf("exit %d (%s), want %d", code, errs, tt.code)
			}
			if errs != "" {
				t.Logf("vrdmactl said: %s", errs)
			}
			for _, w := range tt.want {
				if !strings.Contains(errs, w) {
					t.Errorf("error %q does not say %q", errs, w)
				}
			}
			cmds := srv.Commands()
			for _, c := range tt.wantCmd {
				if not, ok := strings.CutPrefix(c, "!"); ok {
					if slices.Contains(cmds, not) {
						t.Errorf("QEMU saw %s: %q", not, cmds)
					}
				} else if !slices.Contains(cmds, c) {
					t.Errorf("QEMU did not see %s: %q", c, cmds)
				}
			}
			if tt.driver == "" {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if added["driver"] != tt.driver || added["bus"] != "rp0" || added["num_vqs"] != 3.0 || added["config_size"] != 96.0 {
				t.Errorf("device_add: got %v, want driver %s on rp0 with num_vqs 3, config_size 96", added, tt.driver)
			}
			// vhost-user-rdma-pci is device 42 and has no virtio-id.
			if _, has := added["virtio-id"]; has != (tt.driver != qemu.DeviceNameRDMA) {
				t.Errorf("device_add of %s: virtio-id given: %v, want %v", tt.driver, has, !has)
			}
		})
	}
}
