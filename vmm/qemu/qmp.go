package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

const (
	// reconnectMs is the chardev reconnect interval for hot-plugged
	// devices, so a restarted back-end is picked up again.
	reconnectMs = 1000
	// attachTimeout bounds AttachVhostUser/DetachVhostUser when ctx has no
	// earlier deadline.
	attachTimeout = 30 * time.Second
	// Limits on query-pci replies (QEMU is trusted, but a reply is still
	// input): bridge nesting depth and total device count.
	maxPCIDepth   = 32
	maxPCIDevices = 256 * 32 * 8
)

const (
	peripheralPath      = "/machine/peripheral"
	rootPortType        = "pcie-root-port"
	maxRootPorts        = 256
	disconnectedPrefix  = "disconnected:"
	eventDeviceDeleted  = "DEVICE_DELETED"
	qmpCmdDeviceAdd     = "device_add"
	qmpCmdChardevAdd    = "chardev-add"
	qmpCmdChardevRemove = "chardev-remove"
	// libvirtPortPrefix starts the ids of root ports a libvirt domain
	// keeps for vrdma: libvirt gives a controller with the user alias
	// "ua-vrdma-rp0" that id in QEMU.
	libvirtPortPrefix = "ua-vrdma-"
)

// runQMP runs one QMP command on mon and returns its "return" value. A
// go-qemu monitor cannot be cancelled, so there the call continues in the
// background after ctx ends (it finishes when QEMU answers or the
// connection closes); a LibvirtMonitor's virsh is killed.
func runQMP(ctx context.Context, mon qmp.Monitor, execute string, args any) (json.RawMessage, error) {
	cmd, err := json.Marshal(qmp.Command{Execute: execute, Args: args})
	if err != nil {
		return nil, &QMPError{Command: execute, Err: err}
	}
	return runRawQMP(ctx, mon, execute, cmd)
}

// contextRunner is a monitor whose commands can be cancelled
// (LibvirtMonitor).
type contextRunner interface {
	RunContext(ctx context.Context, cmd []byte) ([]byte, error)
}

func runRawQMP(ctx context.Context, mon qmp.Monitor, execute string, cmd []byte) (json.RawMessage, error) {
	type result struct {
		out []byte
		err error
	}
	var r result
	if cr, ok := mon.(contextRunner); ok {
		r.out, r.err = cr.RunContext(ctx, cmd)
	} else {
		res := make(chan result, 1)
		go func() {
			out, err := mon.Run(cmd)
			res <- result{out, err}
		}()
		select {
		case r = <-res:
		case <-ctx.Done():
			return nil, &QMPError{Command: execute, Err: ctx.Err()}
		}
	}
	if r.err != nil {
		return nil, &QMPError{Command: execute, Err: r.err}
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(r.out, &resp); err != nil {
		return nil, &QMPError{Command: execute, Err: fmt.Errorf("decode reply: %w", err)}
	}
	return resp.Return, nil
}

func (vm *VM) run(ctx context.Context, execute string, args any) (json.RawMessage, error) {
	select {
	case <-vm.done:
		return nil, &QMPError{Command: execute, Err: ErrExited}
	default:
	}
	return runQMP(ctx, vm.QMP(), execute, args)
}

// PCIDevice is one PCI function as query-pci reports it.
type PCIDevice struct {
	Bus, Slot, Function int
	VendorID, DeviceID  uint16
	// ClassInfo is QEMU's class description ("Host bridge"), or the class
	// code as "0x0604" when QEMU has no description.
	ClassInfo string
	// ID is the qdev id ("" for devices created without one).
	ID string
}

// queryPCIDevice is query-pci's PciDeviceInfo, trimmed to what we use.
type queryPCIDevice struct {
	Bus       int `json:"bus"`
	Slot      int `json:"slot"`
	Function  int `json:"function"`
	ClassInfo struct {
		Class int     `json:"class"`
		Desc  *string `json:"desc"`
	} `json:"class_info"`
	ID struct {
		Vendor int `json:"vendor"`
		Device int `json:"device"`
	} `json:"id"`
	QdevID    string `json:"qdev_id"`
	PCIBridge *struct {
		Devices []queryPCIDevice `json:"devices"`
	} `json:"pci_bridge"`
}

type queryPCIBus struct {
	Bus     int              `json:"bus"`
	Devices []queryPCIDevice `json:"devices"`
}

// QueryPCI returns every PCI function of the VM, devices behind bridges
// included (depth first, in QEMU's order). QEMU reports what is behind a
// bridge only once the guest firmware has given the bridge a secondary bus
// number (SeaBIOS does so within a second of start-up); until then a
// bridge looks empty.
func (vm *VM) QueryPCI(ctx context.Context) ([]PCIDevice, error) {
	raw, err := vm.run(ctx, "query-pci", nil)
	if err != nil {
		return nil, err
	}
	return parseQueryPCI(raw)
}

// parseQueryPCI flattens a query-pci "return" value.
func parseQueryPCI(raw []byte) ([]PCIDevice, error) {
	var out []PCIDevice
	err := walkQueryPCI(raw, func(d *queryPCIDevice) error {
		pd, err := d.flat()
		if err != nil {
			return err
		}
		out = append(out, pd)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// walkQueryPCI calls fn for every device of a query-pci reply, depth
// first, with bounded depth and count.
func walkQueryPCI(raw []byte, fn func(*queryPCIDevice) error) error {
	var buses []queryPCIBus
	if err := json.Unmarshal(raw, &buses); err != nil {
		return fmt.Errorf("decode query-pci: %w", err)
	}
	count := 0
	var walk func(devs []queryPCIDevice, depth int) error
	walk = func(devs []queryPCIDevice, depth int) error {
		if depth > maxPCIDepth {
			return fmt.Errorf("query-pci: bridges nested deeper than %d", maxPCIDepth)
		}
		for i := range devs {
			count++
			if count > maxPCIDevices {
				return fmt.Errorf("query-pci: more than %d devices", maxPCIDevices)
			}
			if err := fn(&devs[i]); err != nil {
				return err
			}
			if b := devs[i].PCIBridge; b != nil {
				if err := walk(b.Devices, depth+1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, b := range buses {
		if err := walk(b.Devices, 0); err != nil {
			return err
		}
	}
	return nil
}

func (d *queryPCIDevice) flat() (PCIDevice, error) {
	if d.Bus < 0 || d.Bus > 255 || d.Slot < 0 || d.Slot > 31 || d.Function < 0 || d.Function > 7 {
		return PCIDevice{}, fmt.Errorf("query-pci: bad address %d:%d.%d", d.Bus, d.Slot, d.Function)
	}
	if d.ID.Vendor < 0 || d.ID.Vendor > 0xffff || d.ID.Device < 0 || d.ID.Device > 0xffff {
		return PCIDevice{}, fmt.Errorf("query-pci: bad id %#x:%#x at %02x:%02x.%d", d.ID.Vendor, d.ID.Device, d.Bus, d.Slot, d.Function)
	}
	class := fmt.Sprintf("0x%04x", d.ClassInfo.Class)
	if d.ClassInfo.Desc != nil && *d.ClassInfo.Desc != "" {
		class = *d.ClassInfo.Desc
	}
	return PCIDevice{
		Bus:       d.Bus,
		Slot:      d.Slot,
		Function:  d.Function,
		VendorID:  uint16(d.ID.Vendor),
		DeviceID:  uint16(d.ID.Device),
		ClassInfo: class,
		ID:        d.QdevID,
	}, nil
}

// FreeRootPort returns the id of the first (by name) pcie-root-port with
// an id and no device on its bus, asking mon through QOM: query-pci cannot
// tell, because it shows what is behind a bridge only once firmware has
// numbered the buses. Ports kept for vrdma come first: Config.RootPorts'
// vrdma-rp0, vrdma-rp1, ... and libvirt's ua-vrdma-* (a controller with
// <alias name='ua-vrdma-rp0'/>), so that a libvirt-managed VM does not
// lose a port libvirt means for its own hot-plug. The error matches
// ErrNoFreeRootPort when every port is taken.
func FreeRootPort(ctx context.Context, mon qmp.Monitor) (string, error) {
	props, err := qomList(ctx, mon, peripheralPath)
	if err != nil {
		return "", err
	}
	var ports []string
	for _, p := range props {
		if p.Type == "child<"+rootPortType+">" {
			ports = append(ports, p.Name)
		}
	}
	if len(ports) > maxRootPorts {
		return "", &QMPError{Command: "qom-list", Err: fmt.Errorf("%d root ports, more than %d", len(ports), maxRootPorts)}
	}
	slices.SortFunc(ports, func(a, b string) int {
		if ka, kb := isVrdmaPort(a), isVrdmaPort(b); ka != kb {
			if ka {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for _, port := range ports {
		// A bridge's secondary bus is its child named like the bridge;
		// each device on a bus is a link property "child[N]" of the bus.
		busProps, err := qomList(ctx, mon, peripheralPath+"/"+port+"/"+port)
		if err != nil {
			return "", err
		}
		busy := false
		for _, p := range busProps {
			if strings.HasPrefix(p.Name, "child[") {
				busy = true
				break
			}
		}
		if !busy {
			return port, nil
		}
	}
	return "", fmt.Errorf("%w: all %d pcie-root-ports with an id hold a device (start the VM with more RootPorts)", ErrNoFreeRootPort, len(ports))
}

// isVrdmaPort tells a root port kept for vrdma devices by its id.
func isVrdmaPort(id string) bool {
	return strings.HasPrefix(id, freePortPrefix) || strings.HasPrefix(id, libvirtPortPrefix)
}

// qomProperty is one entry of a qom-list reply.
type qomProperty struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

func qomList(ctx context.Context, mon qmp.Monitor, path string) ([]qomProperty, error) {
	raw, err := runQMP(ctx, mon, "qom-list", map[string]any{"path": path})
	if err != nil {
		return nil, err
	}
	var props []qomProperty
	if err := json.Unmarshal(raw, &props); err != nil {
		return nil, &QMPError{Command: "qom-list", Err: fmt.Errorf("decode reply: %w", err)}
	}
	return props, nil
}

// checkSharedMemory fails with ErrNoSharedMemory unless every memory
// backend is share=on: a vhost-user back-end maps guest RAM through the
// fds QEMU sends, which only works for shared mappings.
func checkSharedMemory(ctx context.Context, mon qmp.Monitor) error {
	raw, err := runQMP(ctx, mon, "query-memdev", nil)
	if err != nil {
		return err
	}
	var devs []struct {
		ID    string `json:"id"`
		Share bool   `json:"share"`
	}
	if err := json.Unmarshal(raw, &devs); err != nil {
		return &QMPError{Command: "query-memdev", Err: fmt.Errorf("decode reply: %w", err)}
	}
	if len(devs) == 0 {
		return fmt.Errorf("%w: no memory backend (use -object memory-backend-memfd,...,share=on and -machine memory-backend=)", ErrNoSharedMemory)
	}
	for _, d := range devs {
		if !d.Share {
			return fmt.Errorf("%w: memory backend %q has share=off", ErrNoSharedMemory, d.ID)
		}
	}
	return nil
}

// chardevAddArgs builds chardev-add arguments for a unix socket client that
// reconnects (reconnect-ms since QEMU 9.2, reconnect in seconds before).
func chardevAddArgs(id, path string, v qmp.Version) map[string]any {
	data := map[string]any{
		"addr":   map[string]any{"type": "unix", "data": map[string]any{"path": path}},
		"server": false,
	}
	if q := v.QEMU; q.Major > 9 || (q.Major == 9 && q.Minor >= 2) {
		data["reconnect-ms"] = reconnectMs
	} else if q.Major > 0 {
		data["reconnect"] = (reconnectMs + 999) / 1000
	}
	return map[string]any{"id": id, "backend": map[string]any{"type": "socket", "data": data}}
}

// deviceAddCommand is the raw device_add for dev as device deviceName.
// go-qemu's generated raw.DeviceAdd cannot carry driver properties such as
// chardev or num_vqs, so the JSON is built here. vhost-user-rdma-pci has no
// virtio-id: it is device 42.
func deviceAddCommand(deviceName string, dev VhostUserDevice, bus string) ([]byte, error) {
	args := map[string]any{
		"driver":      deviceName,
		"id":          dev.ID,
		"chardev":     dev.ID + chrSuffix,
		"num_vqs":     dev.NumVQs,
		"vq_size":     dev.VQSize,
		"config_size": dev.ConfigSize,
	}
	if deviceName != DeviceNameRDMA {
		args["virtio-id"] = dev.VirtioID
	}
	if bus != "" {
		args["bus"] = bus
	}
	return json.Marshal(qmp.Command{Execute: qmpCmdDeviceAdd, Args: args})
}

// AttachVhostUser hot-plugs dev: it checks that guest RAM is shared, adds
// a reconnecting unix socket chardev (ID+"-chr"), waits until the back-end
// accepted the connection, and adds the device on bus (a free
// pcie-root-port; "" picks one with FreeRootPort). On failure nothing
// stays behind. ctx bounds the whole call (at most 30 s). It is
// AttachVhostUserQMP on the VM's own monitor.
func (vm *VM) AttachVhostUser(ctx context.Context, dev VhostUserDevice, bus string) error {
	if err := dev.withDefaults().validate("dev"); err != nil {
		return err
	}
	select {
	case <-vm.done:
		return fmt.Errorf("attach %s: %w", dev.ID, ErrExited)
	default:
	}
	name, err := vm.deviceName(ctx)
	if err != nil {
		return fmt.Errorf("attach %s: %w", dev.ID, err)
	}
	_, err = AttachVhostUserQMP(ctx, vm.QMP(), dev, bus, HotplugOptions{DeviceName: name, Version: vm.version, Log: vm.log})
	return err
}

// DetachVhostUser hot-unplugs device id: device_del, wait for QEMU's
// DEVICE_DELETED event for it (the guest must release the device: Linux
// pciehp does; firmware alone may not), then chardev-remove id+"-chr".
// ctx bounds the whole call (at most 30 s). It is DetachVhostUserQMP on
// the VM's own monitor.
func (vm *VM) DetachVhostUser(ctx context.Context, id string) error {
	select {
	case <-vm.done:
		return fmt.Errorf("detach %s: %w", id, ErrExited)
	default:
	}
	if err := validateID("id", id); err != nil {
		return err
	}
	events, unsubscribe := vm.subscribe()
	defer unsubscribe()
	return detachVhostUser(ctx, vm.QMP(), id, vm.log, events)
}
