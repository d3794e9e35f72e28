package virtiopci

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Vendor and device IDs of the vrdma device (virtio 1.x: 0x1040 + 42).
const (
	VendorVirtio = 0x1af4
	DeviceRDMA   = 0x106a
)

const sysfsDevices = "/sys/bus/pci/devices"

// Find lists the PCI addresses (like 0000:00:03.0) of the functions with
// the given vendor and device IDs, sorted.
func Find(vendor, device uint16) ([]string, error) {
	return findIn(sysfsDevices, vendor, device)
}

func findIn(root string, vendor, device uint16) ([]string, error) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", root, err)
	}
	var out []string
	for _, e := range ents {
		v, err1 := readHex(filepath.Join(root, e.Name(), "vendor"))
		d, err2 := readHex(filepath.Join(root, e.Name(), "device"))
		if err1 == nil && err2 == nil && v == uint64(vendor) && d == uint64(device) {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// readHex reads a sysfs "0x1af4\n" file.
func readHex(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 32)
}

// validAddr reports whether a is a PCI address and nothing else (it becomes
// a path).
func validAddr(a string) bool {
	if a == "" || len(a) > 32 || strings.ContainsAny(a, "/\x00") || a == "." || a == ".." {
		return false
	}
	return true
}

// readConfig copies the first 256 bytes of config space.
func readConfig(cs ConfigSpace) ([]byte, error) {
	cfg := make([]byte, 256)
	n, err := cs.ReadAt(cfg, 0)
	if n < 0x40 {
		return nil, fmt.Errorf("read config space: %d bytes: %v: %w", n, err, ErrNoDevice)
	}
	return cfg[:n], nil
}

// enableDevice sets memory-space enable and bus master in the command
// register ("writing the config file's command register").
func enableDevice(cs ConfigSpace) error {
	var raw [2]byte
	if _, err := cs.ReadAt(raw[:], cfgCommand); err != nil {
		return fmt.Errorf("read command register: %w", err)
	}
	cmd := binary.LittleEndian.Uint16(raw[:])
	if cmd&(cmdMemory|cmdBusMaster) == cmdMemory|cmdBusMaster {
		return nil
	}
	binary.LittleEndian.PutUint16(raw[:], cmd|cmdMemory|cmdBusMaster)
	if _, err := cs.WriteAt(raw[:], cfgCommand); err != nil {
		return fmt.Errorf("write command register: %w", err)
	}
	if _, err := cs.ReadAt(raw[:], cfgCommand); err != nil {
		return fmt.Errorf("read command register: %w", err)
	}
	if got := binary.LittleEndian.Uint16(raw[:]); got&(cmdMemory|cmdBusMaster) != cmdMemory|cmdBusMaster {
		return fmt.Errorf("command register reads %#x after enabling memory and bus master", got)
	}
	return nil
}

// Open initialises the virtio-pci device at PCI address addr (as Find
// returns) for the RDMA device type: it enables memory and bus mastering,
// parses the virtio capabilities, maps the BARs they name through
// sysfs resourceN, resets the device, negotiates features, sets up every
// virtqueue in hugepage DMA memory, sets DRIVER_OK and stocks the event
// queue. No driver may be bound to the device (never load virtio_pci).
// On failure after the reset the device is left FAILED.
func Open(addr string, opts ...Option) (*Transport, error) {
	o := defaults()
	for _, f := range opts {
		f(&o)
	}
	if !validAddr(addr) {
		return nil, fmt.Errorf("pci address %q: %w", addr, ErrNoDevice)
	}
	dir := filepath.Join(o.sysfs, addr)
	log := o.log.WithField("device", addr)
	o.log = log
	cf, err := os.OpenFile(filepath.Join(dir, "config"), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s config: %v: %w", addr, err, ErrNoDevice)
	}
	var release []func() error
	cleanup := func() {
		for i := len(release) - 1; i >= 0; i-- {
			release[i]()
		}
	}
	release = append(release, cf.Close)
	cfg, err := readConfig(cf)
	if err != nil {
		cleanup()
		return nil, err
	}
	if v, dv := binary.LittleEndian.Uint16(cfg[cfgVendorID:]), binary.LittleEndian.Uint16(cfg[cfgDeviceID:]); v != VendorVirtio || dv < 0x1040 || dv > 0x107f {
		cleanup()
		return nil, fmt.Errorf("%s is %04x:%04x, not a modern virtio device: %w", addr, v, dv, ErrNoDevice)
	}
	l, err := ParseCaps(cfg)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	if err := enableDevice(cf); err != nil {
		cleanup()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	bars := make(map[uint8]Regs)
	regs := func(c *Cap) (Regs, error) {
		r, ok := bars[c.BAR]
		if !ok {
			b, unmap, err := mapBAR(dir, int(c.BAR))
			if err != nil {
				return nil, err
			}
			release = append(release, unmap)
			bars[c.BAR], r = b, b
		}
		w, ok := newWindow(r, c.BAROffset, c.Length)
		if !ok {
			return nil, fmt.Errorf("structure type %d at BAR %d [%#x, +%#x) beyond the BAR's %#x bytes: %w",
				c.Type, c.BAR, c.BAROffset, c.Length, r.Len(), ErrBAR)
		}
		return w, nil
	}
	var common, notify, devcfg Regs
	for _, s := range []struct {
		c *Cap
		r *Regs
	}{{l.Common, &common}, {l.Notify, &notify}, {l.Device, &devcfg}} {
		if *s.r, err = regs(s.c); err != nil {
			cleanup()
			return nil, fmt.Errorf("%s: %w", addr, err)
		}
	}
	src, err := newHugeSource()
	if err != nil {
		cleanup()
		return nil, err
	}
	release = append(release, src.Close)
	d, err := newTransport(common, notify, devcfg, l.Notify.NotifyOffMultiplier, newDMA(src, o.hugepageLimit), o)
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	d.addr, d.release = addr, release
	log.WithFields(map[string]any{"features": fmt.Sprintf("%#x", d.features), "queues": len(d.queues)}).Info("device ready")
	return d, nil
}
