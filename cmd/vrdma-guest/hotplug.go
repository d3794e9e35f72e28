package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vrdma/vrdma/guest/virtiopci"
	"github.com/vrdma/vrdma/internal/guestresult"
)

// Hot-plug as the guest sees it. Linux enumerates a device hot-added to a
// pcie-root-port by itself (pciehp, or ACPI hot-plug on q35); the rescan
// every rescanEvery only makes sure of it. On unplug, QEMU presses the
// slot's attention button; pciehp then blinks the power indicator and
// waits 5 s for the button to be pressed again before it powers the slot
// off. The guest here has nothing to cancel, so as soon as it sees the
// blinking indicator it powers the slot off through sysfs, which ends the
// wait: QEMU then unplugs the device and sends DEVICE_DELETED. With ACPI
// hot-plug the kernel ejects the device at once and nothing is needed.
const (
	rescanEvery = 50 * time.Millisecond
	goneEvery   = 20 * time.Millisecond
	// maxCapWalk bounds the capability list walk (a config space holds at
	// most 48 capabilities of 4 bytes after the header).
	maxCapWalk = 48
)

// hotplugFS are the sysfs paths hotplug uses; tests point them elsewhere.
type hotplugFS struct {
	rescan  string // /sys/bus/pci/rescan
	devices string // /sys/bus/pci/devices
	slots   string // /sys/bus/pci/slots
}

var sysfs = hotplugFS{rescan: "/sys/bus/pci/rescan", devices: "/sys/bus/pci/devices", slots: "/sys/bus/pci/slots"}

// lineNext is what a harness writes to the guest's stdin, with --ack, once
// it has finished a round's detach (QEMU sent DEVICE_DELETED): only then
// may the guest go on, and after the last round exit and power off.
const lineNext = "VRDMA-NEXT"

// hotplugStep is the key of hotplug's lines of round r.
func hotplugStep(r int, event string) guestresult.Step {
	return guestresult.Step{Role: guestresult.RoleHotplug, Round: r, Event: event}
}

// hotplug runs rounds of: wait for the device (rescanning), probe and
// selftest it, report, wait until it is gone (releasing it), report, and
// with ack wait for a VRDMA-NEXT line.
func (e *env) hotplug(rounds int, timeout time.Duration, ack bool) error {
	sc := bufio.NewScanner(e.stdin)
	sc.Buffer(make([]byte, 4096), 1<<16)
	for r := 1; r <= rounds; r++ {
		if err := e.result(guestresult.Hotplug{Step: hotplugStep(r, "waiting")}); err != nil {
			return err
		}
		start := time.Now()
		addr, err := waitDevice(timeout)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		found := time.Since(start)
		c, closeDev, err := e.open(addr, e.log)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		if err := e.probe(c); err != nil {
			closeDev()
			return fmt.Errorf("round %d: %w", r, err)
		}
		probed := time.Since(start)
		if err := e.result(guestresult.Hotplug{Step: hotplugStep(r, "usable"), Device: addr,
			ProbeS: probed.Seconds(), FoundS: found.Seconds()}); err != nil {
			closeDev()
			return err
		}
		err = e.selftest(c)
		closeDev()
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		if err := e.result(guestresult.Hotplug{Step: hotplugStep(r, "attached"), Device: addr,
			ProbeS: probed.Seconds(), AttachS: time.Since(start).Seconds(), FoundS: found.Seconds()}); err != nil {
			return err
		}
		d, released, err := waitGone(addr, timeout)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		if err := e.result(guestresult.Hotplug{Step: hotplugStep(r, "detached"), Device: addr,
			DetachS: d.Seconds(), Released: released}); err != nil {
			return err
		}
		if ack {
			if err := waitLine(sc, lineNext); err != nil {
				return fmt.Errorf("round %d: %w", r, err)
			}
		}
	}
	return nil
}

// waitLine reads lines until one holds want (console noise is skipped).
func waitLine(sc *bufio.Scanner, want string) error {
	for sc.Scan() {
		if strings.Contains(sc.Text(), want) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", want, err)
	}
	return fmt.Errorf("stdin ended without a %s line", want)
}

// waitDevice rescans the PCI bus until a vrdma device shows up.
func waitDevice(timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if err := os.WriteFile(sysfs.rescan, []byte("1"), 0); err != nil {
			return "", fmt.Errorf("rescan: %w", err)
		}
		found, err := findIn(sysfs.devices)
		if err != nil {
			return "", err
		}
		if len(found) > 0 {
			return found[0], nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("no device 1af4:106a within %v of rescanning", timeout)
		}
		time.Sleep(rescanEvery)
	}
}

func findIn(devices string) ([]string, error) {
	if devices == "/sys/bus/pci/devices" {
		return virtiopci.Find(virtiopci.VendorVirtio, virtiopci.DeviceRDMA)
	}
	ents, err := os.ReadDir(devices)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		v, _ := os.ReadFile(filepath.Join(devices, e.Name(), "vendor"))
		d, _ := os.ReadFile(filepath.Join(devices, e.Name(), "device"))
		if strings.TrimSpace(string(v)) == "0x1af4" && strings.TrimSpace(string(d)) == "0x106a" {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// waitGone waits until addr has left the PCI bus, powering its slot off as
// soon as the host asked for the unplug. It returns how long the device
// stayed after the request (or after the call, without one seen).
func waitGone(addr string, timeout time.Duration) (time.Duration, bool, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	released := false
	requested := time.Time{}
	for {
		if _, err := os.Lstat(filepath.Join(sysfs.devices, addr)); errors.Is(err, os.ErrNotExist) {
			if requested.IsZero() {
				requested = start
			}
			return time.Since(requested), released, nil
		}
		if !released && unplugRequested(addr) {
			requested = time.Now()
			if slot := slotOf(addr); slot != "" {
				// Best effort: pciehp's own 5 s timer still ends the wait.
				released = os.WriteFile(filepath.Join(sysfs.slots, slot, "power"), []byte("0"), 0) == nil
			}
			if !released {
				released = true // do not retry every poll
			}
		}
		if time.Now().After(deadline) {
			return 0, released, fmt.Errorf("device %s still present %v after its selftest (was it detached?)", addr, timeout)
		}
		time.Sleep(goneEvery)
	}
}

// unplugRequested reports whether the slot above addr blinks its power
// indicator, which is what pciehp does after the attention button was
// pressed (PCIe base spec 6.7.1.1: blinking means the slot is in
// transition).
func unplugRequested(addr string) bool {
	real, err := filepath.EvalSymlinks(filepath.Join(sysfs.devices, addr))
	if err != nil {
		return false
	}
	cfg, err := os.ReadFile(filepath.Join(filepath.Dir(real), "config"))
	if err != nil {
		return false
	}
	sltctl, ok := slotControl(cfg)
	return ok && (sltctl>>8)&3 == 2
}

// slotControl returns the Slot Control register of a PCIe port's config
// space, walking the capability list with bounds checks on every step.
func slotControl(cfg []byte) (uint16, bool) {
	const (
		capPtr      = 0x34
		capIDPCIe   = 0x10
		sltctlOff   = 0x18
		statusReg   = 0x06
		statusCaps  = 1 << 4
		headerBytes = 0x40
	)
	if len(cfg) < headerBytes || binary.LittleEndian.Uint16(cfg[statusReg:])&statusCaps == 0 {
		return 0, false
	}
	p := int(cfg[capPtr]) &^ 3
	for i := 0; i < maxCapWalk && p >= headerBytes && p+2 <= len(cfg); i++ {
		if cfg[p] == capIDPCIe {
			if p+sltctlOff+2 > len(cfg) {
				return 0, false
			}
			return binary.LittleEndian.Uint16(cfg[p+sltctlOff:]), true
		}
		p = int(cfg[p+1]) &^ 3
	}
	return 0, false
}

// slotOf returns the name of the hot-plug slot holding addr
// (/sys/bus/pci/slots/N/address is "dddd:bb:ss"), or "".
func slotOf(addr string) string {
	i := strings.LastIndexByte(addr, '.')
	if i < 0 {
		return ""
	}
	want := addr[:i]
	ents, err := os.ReadDir(sysfs.slots)
	if err != nil {
		return ""
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(sysfs.slots, e.Name(), "address"))
		if err == nil && strings.TrimSpace(string(b)) == want {
			return e.Name()
		}
	}
	return ""
}
