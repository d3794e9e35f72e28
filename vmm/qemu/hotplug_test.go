package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// fakeMonitor answers QMP commands with handle and records them.
type fakeMonitor struct {
	mu     sync.Mutex
	cmds   []fakeCmd // protected by mu
	handle func(execute string, args map[string]any) (any, error)
}

type fakeCmd struct {
	Execute string         `json:"execute"`
	Args    map[string]any `json:"arguments"`
}

func (m *fakeMonitor) Connect() error    { return nil }
func (m *fakeMonitor) Disconnect() error { return nil }
func (m *fakeMonitor) Events(context.Context) (<-chan qmp.Event, error) {
	return nil, qmp.ErrEventsNotSupported
}

func (m *fakeMonitor) Run(raw []byte) ([]byte, error) {
	var c fakeCmd
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("fake: bad command %s: %v", raw, err)
	}
	m.mu.Lock()
	m.cmds = append(m.cmds, c)
	m.mu.Unlock()
	ret, err := m.handle(c.Execute, c.Args)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"return": ret})
}

func (m *fakeMonitor) executed() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, c := range m.cmds {
		out = append(out, c.Execute)
	}
	return out
}

func (m *fakeMonitor) find(execute string) (fakeCmd, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.cmds {
		if c.Execute == execute {
			return c, true
		}
	}
	return fakeCmd{}, false
}

// newFakeVM returns a VM around mon, as Start would leave it, with events
// fed from the returned channel (close it to end the pump).
func newFakeVM(t *testing.T, mon qmp.Monitor, major, minor int) (*VM, chan qmp.Event) {
	t.Helper()
	events := make(chan qmp.Event)
	vm := &VM{
		log:      discardLogger(),
		stderr:   newTailBuffer(1024),
		done:     make(chan struct{}),
		subs:     map[int]chan qmp.Event{},
		pumpDone: make(chan struct{}),
		mon:      mon,
	}
	vm.version.QEMU.Major, vm.version.QEMU.Minor = major, minor
	vm.devName = DeviceNameGeneric
	go vm.pump(events)
	t.Cleanup(func() {
		close(events)
		<-vm.pumpDone
	})
	return vm, events
}

// qomPeripheral answers qom-list as QEMU 10.0 does for /machine/peripheral
// and for the secondary bus of each root port in ports (true: a device is
// plugged into it).
func qomPeripheral(ports map[string]bool, path string) (any, error) {
	typ := map[string]string{"name": "type", "type": "string"}
	if path == "/machine/peripheral" {
		out := []any{typ, map[string]string{"name": "rng0", "type": "child<virtio-rng-pci>"}}
		for p := range ports {
			out = append(out, map[string]string{"name": p, "type": "child<pcie-root-port>"})
		}
		return out, nil
	}
	for p, busy := range ports {
		if path != "/machine/peripheral/"+p+"/"+p {
			continue
		}
		out := []any{typ,
			map[string]string{"name": "realized", "type": "bool"},
			map[string]string{"name": "hotplug-handler", "type": "link<hotplug-handler>"}}
		if busy {
			out = append(out, map[string]string{"name": "child[0]", "type": "link<vhost-user-device-pci>"})
		}
		return out, nil
	}
	return nil, fmt.Errorf("Device '%s' not found", path)
}

// hotplugHandler is a QEMU that has shared memory, the given root ports,
// and a back-end that accepts after connectAfter polls.
func hotplugHandler(ports map[string]bool, share bool, connectAfter int, deviceAddErr error) func(string, map[string]any) (any, error) {
	polls := 0
	return func(execute string, args map[string]any) (any, error) {
		switch execute {
		case "query-memdev":
			return []any{map[string]any{"id": "mem", "size": 268435456, "share": share}}, nil
		case "qom-list":
			path, _ := args["path"].(string)
			return qomPeripheral(ports, path)
		case "chardev-add", "chardev-remove", "device_del":
			return map[string]any{}, nil
		case "query-chardev":
			polls++
			name := "disconnected:unix:/s"
			if polls > connectAfter {
				name = "unix:/s"
			}
			return []any{
				map[string]any{"label": "serial0", "filename": "stdio", "frontend-open": true},
				map[string]any{"label": "rdma1-chr", "filename": name, "frontend-open": false},
			}, nil
		case "device_add":
			if deviceAddErr != nil {
				return nil, deviceAddErr
			}
			return map[string]any{}, nil
		}
		return nil, fmt.Errorf("fake: unexpected %s", execute)
	}
}

func TestAttachVhostUser(t *testing.T) {
	portsFree := map[string]bool{"rdma0-port": true, "vrdma-rp0": true, "vrdma-rp1": false}
	portsFull := map[string]bool{"rdma0-port": true, "vrdma-rp0": true}
	dev := VhostUserDevice{ID: "rdma1", Socket: "/s", NumVQs: 3, VQSize: 128, ConfigSize: 64}
	tests := []struct {
		name         string
		major, minor int
		ports        map[string]bool
		share        bool
		connectAfter int
		deviceAddErr error
		bus          string
		timeout      time.Duration
		wantErr      error
		wantCmds     []string
		wantBus      string
		wantRecon    string
	}{
		{
			// vrdma-rp* before rdma0-port: ports kept for vrdma first.
			name: "free port picked", major: 10, ports: portsFree, share: true, connectAfter: 2,
			wantCmds: []string{"query-memdev", "qom-list", "qom-list", "qom-list",
				"chardev-add", "query-chardev", "query-chardev", "query-chardev", "device_add"},
			wantBus:   "vrdma-rp1",
			wantRecon: "reconnect-ms",
		},
		{
			// libvirt: its own pci.N ports are free too, but the one
			// with the user alias ua-vrdma-* is taken.
			name: "libvirt spare port first", major: 10, share: true,
			ports: map[string]bool{"pci.1": true, "pci.2": false, "pci.3": false, "ua-vrdma-rp0": true, "ua-vrdma-rp1": false},
			wantCmds: []string{"query-memdev", "qom-list", "qom-list", "qom-list",
				"chardev-add", "query-chardev", "device_add"},
			wantBus:   "ua-vrdma-rp1",
			wantRecon: "reconnect-ms",
		},
		{
			name: "no spare port: any free one", major: 10, share: true,
			ports: map[string]bool{"pci.1": true, "pci.2": false},
			wantCmds: []string{"query-memdev", "qom-list", "qom-list", "qom-list",
				"chardev-add", "query-chardev", "device_add"},
			wantBus:   "pci.2",
			wantRecon: "reconnect-ms",
		},
		{
			name: "explicit bus, qemu 9.1", major: 9, minor: 1, ports: portsFree, share: true, bus: "rdma0-port",
			wantCmds:  []string{"query-memdev", "chardev-add", "query-chardev", "device_add"},
			wantBus:   "rdma0-port",
			wantRecon: "reconnect",
		},
		{
			name: "no shared memory", major: 10, ports: portsFree, share: false,
			wantErr: ErrNoSharedMemory, wantCmds: []string{"query-memdev"},
		},
		{
			name: "no free root port", major: 10, ports: portsFull, share: true,
			wantErr: ErrNoFreeRootPort, wantCmds: []string{"query-memdev", "qom-list", "qom-list", "qom-list"},
		},
		{
			name: "device_add fails rolls back", major: 10, ports: portsFree, share: true,
			deviceAddErr: errors.New("Bus 'vrdma-rp1' does not support hotplugging"), bus: "vrdma-rp1",
			wantErr:  ErrQMP,
			wantCmds: []string{"query-memdev", "chardev-add", "query-chardev", "device_add", "chardev-remove"},
		},
		{
			name: "back-end not listening rolls back", major: 10, ports: portsFree, share: true, connectAfter: 1 << 30,
			timeout: 100 * time.Millisecond, wantErr: context.DeadlineExceeded,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mon := &fakeMonitor{handle: hotplugHandler(tt.ports, tt.share, tt.connectAfter, tt.deviceAddErr)}
			vm, _ := newFakeVM(t, mon, tt.major, tt.minor)
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			err := vm.AttachVhostUser(ctx, dev, tt.bus)
			if tt.wantErr == nil && err != nil {
				t.Fatalf("got error %v, want nil", err)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			got := mon.executed()
			if tt.wantCmds != nil && !slices.Equal(got, tt.wantCmds) {
				t.Errorf("got commands %q, want %q", got, tt.wantCmds)
			}
			if tt.wantErr != nil {
				// Whatever failed after chardev-add must remove it again. A
				// command the deadline abandoned (runRawQMP stops waiting
				// for it) may still reach the monitor after the removal.
				if i := slices.Index(got, "chardev-add"); i >= 0 && !slices.Contains(got[i:], "chardev-remove") {
					t.Errorf("got commands %q, want a chardev-remove after chardev-add", got)
				}
				return
			}
			add, _ := mon.find("device_add")
			want := map[string]any{
				"driver": DeviceNameGeneric, "id": "rdma1", "bus": tt.wantBus, "chardev": "rdma1-chr",
				"virtio-id": 42.0, "num_vqs": 3.0, "vq_size": 128.0, "config_size": 64.0,
			}
			if fmt.Sprint(add.Args) != fmt.Sprint(want) {
				t.Errorf("device_add: got %v, want %v", add.Args, want)
			}
			chr, _ := mon.find("chardev-add")
			b, _ := json.Marshal(chr.Args)
			wantChr := fmt.Sprintf(`{"backend":{"data":{"addr":{"data":{"path":"/s"},"type":"unix"},%q:%d,"server":false},"type":"socket"},"id":"rdma1-chr"}`,
				tt.wantRecon, map[string]int{"reconnect-ms": 1000, "reconnect": 1}[tt.wantRecon])
			if string(b) != wantChr {
				t.Errorf("chardev-add: got %s, want %s", b, wantChr)
			}
		})
	}
}

func TestAttachVhostUserInvalid(t *testing.T) {
	mon := &fakeMonitor{handle: hotplugHandler(nil, true, 0, nil)}
	vm, _ := newFakeVM(t, mon, 10, 0)
	for _, tc := range []struct {
		dev VhostUserDevice
		bus string
	}{
		{VhostUserDevice{ID: "", Socket: "/s"}, ""},
		{VhostUserDevice{ID: "a", Socket: "/s", VQSize: 3}, ""},
		{VhostUserDevice{ID: "a", Socket: "/s"}, "bus,x=y"},
	} {
		if err := vm.AttachVhostUser(context.Background(), tc.dev, tc.bus); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("AttachVhostUser(%+v, %q): got %v, want ErrInvalidConfig", tc.dev, tc.bus, err)
		}
	}
	if got := mon.executed(); len(got) != 0 {
		t.Errorf("got commands %q for invalid input, want none", got)
	}
}

func TestDetachVhostUser(t *testing.T) {
	tests := []struct {
		name     string
		events   []qmp.Event
		wantErr  error
		wantCmds []string
	}{
		{
			name: "deleted",
			events: []qmp.Event{
				{Event: "DEVICE_DELETED", Data: map[string]any{"path": "/machine/peripheral/rdma1/virtio-backend"}},
				{Event: "DEVICE_DELETED", Data: map[string]any{"device": "other", "path": "/machine/peripheral/other"}},
				{Event: "DEVICE_DELETED", Data: map[string]any{"device": "rdma1", "path": "/machine/peripheral/rdma1"}},
			},
			wantCmds: []string{"device_del", "chardev-remove"},
		},
		{
			name:     "guest never releases",
			events:   []qmp.Event{{Event: "DEVICE_DELETED", Data: map[string]any{"device": "other"}}},
			wantErr:  context.DeadlineExceeded,
			wantCmds: []string{"device_del"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var events chan qmp.Event
			handler := hotplugHandler(nil, true, 0, nil)
			mon := &fakeMonitor{handle: func(execute string, args map[string]any) (any, error) {
				if execute == "device_del" {
					if got := args["id"]; got != "rdma1" {
						return nil, fmt.Errorf("device_del id %v", got)
					}
					go func() {
						for _, ev := range tt.events {
							events <- ev
						}
					}()
				}
				return handler(execute, args)
			}}
			vm, ch := newFakeVM(t, mon, 10, 0)
			events = ch
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			err := vm.DetachVhostUser(ctx, "rdma1")
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("got error %v, want %v", err, tt.wantErr)
			}
			if got := mon.executed(); !slices.Equal(got, tt.wantCmds) {
				t.Errorf("got commands %q, want %q", got, tt.wantCmds)
			}
			if c, ok := mon.find("chardev-remove"); ok && c.Args["id"] != "rdma1-chr" {
				t.Errorf("chardev-remove: got id %v, want rdma1-chr", c.Args["id"])
			}
		})
	}
}

func TestMonitorEvents(t *testing.T) {
	mon := &fakeMonitor{handle: hotplugHandler(nil, true, 0, nil)}
	vm, events := newFakeVM(t, mon, 10, 0)
	ctx, cancel := context.WithCancel(context.Background())
	a, err := vm.QMP().Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := vm.QMP().Events(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Events subscribes before it returns, so nothing sent now is lost.
	events <- qmp.Event{Event: "RESUME"}
	for name, ch := range map[string]<-chan qmp.Event{"a": a, "b": b} {
		select {
		case ev := <-ch:
			if ev.Event != "RESUME" {
				t.Errorf("%s: got %s, want RESUME", name, ev.Event)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no event", name)
		}
	}
	cancel()
	select {
	case _, ok := <-a:
		if ok {
			t.Errorf("a: got an event after cancel, want a closed channel")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a: not closed after cancel")
	}
}
