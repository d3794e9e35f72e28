package qemu

import (
	"context"
	"errors"
	"slices"
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
	tests := []struct {
		name       string
		types      []string
		ports      map[string]bool
		share      bool
		wantErr    error
		wantDriver string
		wantBus    string
	}{
		{"patched 10.0", []string{"virtio-rng-pci", DeviceNameGeneric}, map[string]bool{"vrdma-rp0": false}, true, nil, DeviceNameGeneric, "vrdma-rp0"},
		{"10.2 test device", []string{DeviceNameTest}, map[string]bool{"vrdma-rp0": true, "vrdma-rp1": false}, true, nil, DeviceNameTest, "vrdma-rp1"},
		{"no generic device", []string{"virtio-rng-pci"}, map[string]bool{"vrdma-rp0": false}, true, ErrNoGenericDevice, "", ""},
		{"memory not shared", []string{DeviceNameGeneric}, map[string]bool{"vrdma-rp0": false}, false, ErrNoSharedMemory, "", ""},
		{"no free root port", []string{DeviceNameGeneric}, map[string]bool{"vrdma-rp0": true}, true, ErrNoFreeRootPort, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fm := &fakeMonitor{handle: externalHandler(tt.types, hotplugHandler(tt.ports, tt.share, 1, nil))}
			mon := externalMonitor{fm, make(chan qmp.Event)}
			bus, err := AttachVhostUserQMP(context.Background(), mon, dev, "", HotplugOptions{})
			if bus != tt.wantBus {
				t.Errorf("got bus %q, want %q", bus, tt.wantBus)
			}
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			add, ok := fm.find("device_add")
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
			chr, _ := fm.find("chardev-add")
			data := chr.Args["backend"].(map[string]any)["data"].(map[string]any)
			if got := data["reconnect-ms"]; got != float64(reconnectMs) {
				t.Errorf("reconnect-ms: got %v, want %d", got, reconnectMs)
			}
		})
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
