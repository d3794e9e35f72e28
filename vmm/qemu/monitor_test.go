package qemu

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// externalMonitor is a fakeMonitor whose Events behaves like go-qemu's
// SocketMonitor: one shared, never-closed stream, whatever the context.
type externalMonitor struct {
	*fakeMonitor
	events chan qmp.Event
}

func (m externalMonitor) Events(context.Context) (<-chan qmp.Event, error) { return m.events, nil }

// externalHandler adds what AttachVhostUserQMP asks a QEMU it did not
// start: its version and its device types.
func externalHandler(types []string, inner func(string, map[string]any) (any, error)) func(string, map[string]any) (any, error) {
	return func(execute string, args map[string]any) (any, error) {
		switch execute {
		case "query-version":
			return map[string]any{"qemu": map[string]any{"major": 10, "minor": 0, "micro": 2}, "package": ""}, nil
		case "qom-list-types":
			var out []any
			for _, t := range types {
				out = append(out, map[string]any{"name": t, "parent": "virtio-pci"})
			}
			return out, nil
		}
		return inner(execute, args)
	}
}

func TestAttachVhostUserQMP(t *testing.T) {
	dev := VhostUserDevice{ID: "rdma1", Socket: "/s", NumVQs: 3, VQSize: 128, ConfigSize: 96}
	// What QEMU 10.0 answers device_add for a type that is not
	// user-creatable (its generic device, unpatched).
	hidden := errors.New("Parameter 'driver' expects a pluggable device type")
	tests := []struct {
		name       string
		types      []string
		ports      map[string]bool
		share      bool
		addErr     error
		wantErr    error
		wantDriver string
		wantBus    string
	}{
		{"vrdma-qemu", []string{"virtio-rng-pci", DeviceNameGeneric, DeviceNameRDMA}, map[string]bool{"vrdma-rp0": false}, true, nil, nil, DeviceNameRDMA, "vrdma-rp0"},
		{"patched 10.0 without 0003", []string{"virtio-rng-pci", DeviceNameGeneric}, map[string]bool{"vrdma-rp0": false}, true, nil, nil, DeviceNameGeneric, "vrdma-rp0"},
		{"10.2 test device", []string{DeviceNameTest}, map[string]bool{"vrdma-rp0": true, "vrdma-rp1": false}, true, nil, nil, DeviceNameTest, "vrdma-rp1"},
		{"Debian's 7.2: no device", []string{"virtio-rng-pci", "vhost-user-blk-pci"}, map[string]bool{"vrdma-rp0": false}, true, nil, ErrNoRDMADevice, "", ""},
		{"stock 10.0: generic device hidden", []string{DeviceNameGeneric}, map[string]bool{"vrdma-rp0": false}, true, hidden, ErrNoRDMADevice, "", ""},
		{"memory not shared", []string{DeviceNameRDMA}, map[string]bool{"vrdma-rp0": false}, false, nil, ErrNoSharedMemory, "", ""},
		{"no free root port", []string{DeviceNameRDMA}, map[string]bool{"vrdma-rp0": true}, true, nil, ErrNoFreeRootPort, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fm := &fakeMonitor{handle: externalHandler(tt.types, hotplugHandler(tt.ports, tt.share, 1, tt.addErr))}
			mon := externalMonitor{fm, make(chan qmp.Event)}
			bus, err := AttachVhostUserQMP(context.Background(), mon, dev, "", HotplugOptions{})
			if bus != tt.wantBus {
				t.Errorf("got bus %q, want %q", bus, tt.wantBus)
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			add, ok := fm.find("device_add")
			if errors.Is(tt.wantErr, ErrNoRDMADevice) {
				// The operator is told what the QEMU is and where the
				// right one comes from.
				for _, want := range []string{"QEMU 10.0.2", DeviceNameRDMA, "vrdma-qemu", InstalledBinary} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
			}
			if tt.addErr != nil {
				// device_add was tried and refused: the chardev is gone again.
				if got := fm.executed(); !slices.Contains(got, "chardev-remove") {
					t.Errorf("got commands %q, want chardev-remove after the refused device_add", got)
				}
				return
			}
			if tt.wantErr != nil {
				if ok {
					t.Errorf("device_add ran after %v", err)
				}
				if _, ok := fm.find("chardev-add"); ok {
					t.Errorf("chardev-add ran after %v", err)
				}
				return
			}
			if !ok {
				t.Fatal("no device_add")
			}
			if got := add.Args["driver"]; got != tt.wantDriver {
				t.Errorf("driver: got %v, want %s", got, tt.wantDriver)
			}
			if got := add.Args["bus"]; got != tt.wantBus {
				t.Errorf("bus: got %v, want %s", got, tt.wantBus)
			}
			// The named device is device 42 and has no virtio-id
			// property (QEMU would refuse one); the generic ones need it.
			if _, has := add.Args["virtio-id"]; has != (tt.wantDriver != DeviceNameRDMA) {
				t.Errorf("device_add %s with virtio-id: %v, want %v", tt.wantDriver, has, !has)
			}
			for k, want := range map[string]float64{"num_vqs": 3, "vq_size": 128, "config_size": 96} {
				if got := add.Args[k]; got != want {
					t.Errorf("%s: got %v, want %v", k, got, want)
				}
			}
			chr, _ := fm.find("chardev-add")
			data := chr.Args["backend"].(map[string]any)["data"].(map[string]any)
			if got := data["reconnect-ms"]; got != float64(reconnectMs) {
				t.Errorf("reconnect-ms: got %v, want %d", got, reconnectMs)
			}
		})
	}
	// A virtio ID other than 42 cannot be vhost-user-rdma-pci: refused
	// before anything is added.
	fm := &fakeMonitor{handle: externalHandler([]string{DeviceNameRDMA}, hotplugHandler(map[string]bool{"vrdma-rp0": false}, true, 1, nil))}
	other := dev
	other.VirtioID = 41
	if _, err := AttachVhostUserQMP(context.Background(), externalMonitor{fm, nil}, other, "", HotplugOptions{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("virtio ID 41 on %s: got %v, want ErrInvalidConfig", DeviceNameRDMA, err)
	}
	if _, ok := fm.find("chardev-add"); ok {
		t.Error("chardev-add ran for a device the QEMU device cannot be")
	}
}

func TestDetachVhostUserQMP(t *testing.T) {
	tests := []struct {
		name     string
		events   []qmp.Event
		wantErr  error
		wantCmds []string
	}{
		{"deleted", []qmp.Event{
			{Event: "RESUME"},
			{Event: "DEVICE_DELETED", Data: map[string]any{"device": "other"}},
			{Event: "DEVICE_DELETED", Data: map[string]any{"device": "rdma1"}},
			{Event: "RESUME"}, // after the match: still drained
		}, nil, []string{"device_del", "chardev-remove"}},
		{"never released", []qmp.Event{{Event: "DEVICE_DELETED", Data: map[string]any{"device": "other"}}},
			context.DeadlineExceeded, []string{"device_del"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events := make(chan qmp.Event) // unbuffered, like SocketMonitor's
			sent := make(chan struct{})
			inner := hotplugHandler(nil, true, 0, nil)
			fm := &fakeMonitor{handle: func(execute string, args map[string]any) (any, error) {
				if execute == "device_del" {
					go func() {
						defer close(sent)
						for _, ev := range tt.events {
							events <- ev
						}
					}()
				}
				return inner(execute, args)
			}}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			defer func() {
				<-sent
				close(events) // ends the drain, as Disconnect would
			}()
			err := DetachVhostUserQMP(ctx, externalMonitor{fm, events}, "rdma1", nil)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			if got := fm.executed(); !slices.Equal(got, tt.wantCmds) {
				t.Errorf("got commands %q, want %q", got, tt.wantCmds)
			}
		})
	}
	if err := DetachVhostUserQMP(context.Background(), externalMonitor{&fakeMonitor{}, nil}, "bad id!", nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad id: got %v, want ErrInvalidConfig", err)
	}
}
