package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/sirupsen/logrus"
)

// This file holds hot-plug through any QMP monitor: the QEMU need not be
// one Start ran (vrdmactl attaches to a VM that an operator or libvirt
// runs). The VM methods AttachVhostUser and DetachVhostUser call the same
// code with the VM's own monitor.

// maxQOMTypes bounds the qom-list-types reply DeviceNameQMP looks at.
const maxQOMTypes = 1 << 16

// QEMUVersion asks the QEMU behind mon for its version (query-version).
func QEMUVersion(ctx context.Context, mon qmp.Monitor) (qmp.Version, error) {
	raw, err := runQMP(ctx, mon, "query-version", nil)
	if err != nil {
		return qmp.Version{}, err
	}
	var v qmp.Version
	if err := json.Unmarshal(raw, &v); err != nil {
		return qmp.Version{}, &QMPError{Command: "query-version", Err: fmt.Errorf("decode reply: %w", err)}
	}
	return v, nil
}

// DeviceNameQMP asks the QEMU behind mon (qom-list-types) for the device
// vrdma attaches: DeviceNameRDMA, else DeviceNameGeneric, else
// DeviceNameTest. If it has none (Debian's QEMU 7.2, upstream QEMU before
// 8.2) the error matches ErrNoRDMADevice. QOM lists a type whether or not
// it is user-creatable: the hidden generic device of a stock QEMU 10.0
// passes here, and AttachVhostUserQMP says what is wrong when device_add
// refuses it.
func DeviceNameQMP(ctx context.Context, mon qmp.Monitor) (string, error) {
	raw, err := runQMP(ctx, mon, "qom-list-types", map[string]any{"implements": "pci-device", "abstract": false})
	if err != nil {
		return "", err
	}
	var types []struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(raw, &types); err != nil {
		return "", &QMPError{Command: "qom-list-types", Err: fmt.Errorf("decode reply: %w", err)}
	}
	if len(types) > maxQOMTypes {
		return "", &QMPError{Command: "qom-list-types", Err: fmt.Errorf("%d types, more than %d", len(types), maxQOMTypes)}
	}
	listed := map[string]bool{}
	for _, t := range types {
		listed[t.Name] = true
	}
	return pickDevice(listed, "the QEMU")
}

// HotplugOptions say how to reach a QEMU for AttachVhostUserQMP. The zero
// value asks QEMU for everything.
type HotplugOptions struct {
	// DeviceName is the device to add (DeviceNameRDMA,
	// DeviceNameGeneric or DeviceNameTest); "" asks QEMU
	// (DeviceNameQMP).
	DeviceName string
	// Version is QEMU's version (it decides the chardev reconnect
	// option); the zero value asks QEMU (QEMUVersion).
	Version qmp.Version
	// Log receives one Info line per attach or detach; nil discards.
	Log *logrus.Entry
}

// AttachVhostUserQMP hot-plugs dev into the QEMU behind mon: it checks that
// guest RAM is shared (else ErrNoSharedMemory), adds a reconnecting unix
// socket chardev (dev.ID+"-chr"), waits until the back-end at dev.Socket
// accepted the connection, and adds the device on bus (a free
// pcie-root-port; "" picks one with FreeRootPort, else ErrNoFreeRootPort).
// It returns the bus it used. On failure nothing stays behind. ctx bounds
// the whole call (at most 30 s).
func AttachVhostUserQMP(ctx context.Context, mon qmp.Monitor, dev VhostUserDevice, bus string, o HotplugOptions) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	dev = dev.withDefaults()
	if err := dev.validate("dev"); err != nil {
		return "", err
	}
	if bus != "" {
		if err := validateID("bus", bus); err != nil {
			return "", err
		}
	}
	log := o.Log
	if log == nil {
		log = discardLogger()
	}
	version := o.Version
	if version.QEMU.Major == 0 {
		v, err := QEMUVersion(ctx, mon)
		if err != nil {
			return "", fmt.Errorf("attach %s: %w", dev.ID, err)
		}
		version = v
	}
	name := o.DeviceName
	if name == "" {
		n, err := DeviceNameQMP(ctx, mon)
		if err != nil {
			return "", fmt.Errorf("attach %s: QEMU %s: %w", dev.ID, version, err)
		}
		name = n
	} else if err := validateID("DeviceName", name); err != nil {
		return "", err
	}
	if err := dev.checkFor(name, "dev"); err != nil {
		return "", err
	}
	if err := checkSharedMemory(ctx, mon); err != nil {
		return "", fmt.Errorf("attach %s: %w", dev.ID, err)
	}
	if bus == "" {
		b, err := FreeRootPort(ctx, mon)
		if err != nil {
			return "", fmt.Errorf("attach %s: %w", dev.ID, err)
		}
		bus = b
	}
	chr := dev.ID + chrSuffix
	if _, err := runQMP(ctx, mon, qmpCmdChardevAdd, chardevAddArgs(chr, dev.Socket, version)); err != nil {
		return "", fmt.Errorf("attach %s: %w", dev.ID, err)
	}
	rollback := func() {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer rcancel()
		if _, err := runQMP(rctx, mon, qmpCmdChardevRemove, map[string]any{"id": chr}); err != nil {
			log.WithError(err).WithField("chardev", chr).Warn("rollback: chardev-remove")
		}
	}
	if err := waitChardevConnected(ctx, mon, chr); err != nil {
		rollback()
		return "", fmt.Errorf("attach %s: back-end at %s: %w", dev.ID, dev.Socket, err)
	}
	cmd, err := deviceAddCommand(name, dev, bus)
	if err != nil {
		rollback()
		return "", fmt.Errorf("attach %s: %w", dev.ID, err)
	}
	if _, err := runRawQMP(ctx, mon, qmpCmdDeviceAdd, cmd); err != nil {
		rollback()
		// QEMU's words for a type that exists but is not
		// user-creatable ("Parameter 'driver' expects a pluggable
		// device type"): the generic device of upstream QEMU 10.0/10.1.
		if name != DeviceNameRDMA && strings.Contains(err.Error(), "pluggable device type") {
			return "", fmt.Errorf("attach %s: QEMU %s: %w: it has %s but does not let it be created, as upstream QEMU 10.0 and 10.1 do not "+
				"(install the package vrdma-qemu and run the VM with %s, whose %s is made for vrdma): %v",
				dev.ID, version, ErrNoRDMADevice, name, InstalledBinary, DeviceNameRDMA, err)
		}
		return "", fmt.Errorf("attach %s on %s: %w", dev.ID, bus, err)
	}
	log.WithFields(logrus.Fields{"device": dev.ID, "bus": bus, "socket": dev.Socket}).Info("vhost-user device attached")
	return bus, nil
}

// waitChardevConnected polls query-chardev until chr is connected. A
// socket chardev's filename starts with "disconnected:" until then.
func waitChardevConnected(ctx context.Context, mon qmp.Monitor, chr string) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		raw, err := runQMP(ctx, mon, "query-chardev", nil)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("not accepting connections: %w", ctx.Err())
			}
			return err
		}
		var infos []struct {
			Label    string `json:"label"`
			Filename string `json:"filename"`
		}
		if err := json.Unmarshal(raw, &infos); err != nil {
			return &QMPError{Command: "query-chardev", Err: fmt.Errorf("decode reply: %w", err)}
		}
		found := false
		for _, in := range infos {
			if in.Label != chr {
				continue
			}
			found = true
			if !strings.HasPrefix(in.Filename, disconnectedPrefix) {
				return nil
			}
		}
		if !found {
			return fmt.Errorf("chardev %s vanished", chr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not accepting connections: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// DetachVhostUserQMP hot-unplugs device id from the QEMU behind mon:
// device_del, wait until QEMU has deleted the device (the guest must
// release it: Linux pciehp or ACPI hot-plug does; firmware alone may not),
// then chardev-remove id+"-chr". A monitor with events (a go-qemu
// SocketMonitor) is waited on for QEMU's DEVICE_DELETED: it listens to
// mon's events and keeps draining them until mon disconnects (a
// SocketMonitor blocks command replies behind unread events once anyone
// listened). A monitor without (Events returns qmp.ErrEventsNotSupported:
// a LibvirtMonitor) is polled instead: qom-list /machine/peripheral every
// 50 ms until id is gone. ctx bounds the whole call (at most 30 s). log
// may be nil.
func DetachVhostUserQMP(ctx context.Context, mon qmp.Monitor, id string, log *logrus.Entry) error {
	if err := validateID("id", id); err != nil {
		return err
	}
	events, err := mon.Events(ctx)
	if errors.Is(err, qmp.ErrEventsNotSupported) {
		return detachVhostUser(ctx, mon, id, log, nil)
	}
	if err != nil {
		return fmt.Errorf("detach %s: qmp events: %w", id, err)
	}
	deleted := make(chan qmp.Event, eventBuffer)
	go func() {
		defer close(deleted)
		for ev := range events {
			if ev.Event != eventDeviceDeleted {
				continue
			}
			select {
			case deleted <- ev:
			default: // nobody waits any more, or a flood: drop
			}
		}
	}()
	return detachVhostUser(ctx, mon, id, log, deleted)
}

// detachVhostUser is DetachVhostUserQMP with events already subscribed to
// (before device_del, so the event cannot be missed); with events nil it
// polls QOM for the device instead.
func detachVhostUser(ctx context.Context, mon qmp.Monitor, id string, log *logrus.Entry, events <-chan qmp.Event) error {
	ctx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	if err := validateID("id", id); err != nil {
		return err
	}
	if log == nil {
		log = discardLogger()
	}
	if _, err := runQMP(ctx, mon, "device_del", map[string]any{"id": id}); err != nil {
		return fmt.Errorf("detach %s: %w", id, err)
	}
	wait := func() error { return waitDeviceDeleted(ctx, events, id) }
	if events == nil {
		wait = func() error { return waitDeviceGone(ctx, mon, id) }
	}
	if err := wait(); err != nil {
		return fmt.Errorf("detach %s: %w", id, err)
	}
	if err := removeChardev(ctx, mon, id+chrSuffix); err != nil {
		return fmt.Errorf("detach %s: %w", id, err)
	}
	log.WithField("device", id).Info("vhost-user device detached")
	return nil
}

// pollInterval is how often waitDeviceGone asks QEMU (through virsh, each
// ask is a process).
const pollInterval = 50 * time.Millisecond

// waitDeviceGone polls qom-list /machine/peripheral until id is no longer
// a child there: QEMU unparents a device when the guest has released it,
// just before it finalizes it and sends DEVICE_DELETED.
func waitDeviceGone(ctx context.Context, mon qmp.Monitor, id string) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		props, err := qomList(ctx, mon, peripheralPath)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("still present (did the guest release the device?): %w", ctx.Err())
			}
			return err
		}
		present := false
		for _, p := range props {
			if p.Name == id && strings.HasPrefix(p.Type, "child<") {
				present = true
				break
			}
		}
		if !present {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("still present (did the guest release the device?): %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// removeChardev runs chardev-remove for chr, again while QEMU says the
// chardev is busy: a device that has left the QOM tree may be finalized
// (and let go of its chardev) a moment later, after an RCU grace period.
func removeChardev(ctx context.Context, mon qmp.Monitor, chr string) error {
	for {
		_, err := runQMP(ctx, mon, qmpCmdChardevRemove, map[string]any{"id": chr})
		if err == nil || !strings.Contains(err.Error(), "is busy") || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pollInterval):
		}
	}
}

// waitDeviceDeleted waits for DEVICE_DELETED with data.device == id.
func waitDeviceDeleted(ctx context.Context, events <-chan qmp.Event, id string) error {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("waiting for %s: %w", eventDeviceDeleted, ErrExited)
			}
			if ev.Event != eventDeviceDeleted {
				continue
			}
			if dev, _ := ev.Data["device"].(string); dev == id {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("no %s event (did the guest release the device?): %w", eventDeviceDeleted, ctx.Err())
		}
	}
}
