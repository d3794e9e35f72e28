package virtiopci

import (
	"encoding/binary"
	"fmt"
)

// PCI configuration space offsets and bits (PCI Local Bus 3.0 §6.1).
const (
	cfgVendorID   = 0x00
	cfgDeviceID   = 0x02
	cfgCommand    = 0x04
	cfgStatus     = 0x06
	cfgCapPointer = 0x34

	cmdMemory              = 1 << 1 // memory space enable
	cmdBusMaster           = 1 << 2 // bus master enable
	statusCapabilitiesList = 1 << 4

	capIDVendor = 0x09 // vendor-specific: the virtio structures
)

// virtio structure types (virtio 1.2 §4.1.4, cfg_type).
const (
	CapCommonCfg = 1
	CapNotifyCfg = 2
	CapISRCfg    = 3
	CapDeviceCfg = 4
	CapPCICfg    = 5
)

// Sizes the driver relies on.
const (
	capHeaderLen    = 16 // struct virtio_pci_cap
	notifyCapLen    = 20 // struct virtio_pci_notify_cap
	minCommonCfgLen = 0x38
	maxCaps         = 48 // (256-64)/4: a longer walk is a loop
	numBARs         = 6
)

// Cap is one virtio vendor-specific capability (struct virtio_pci_cap).
type Cap struct {
	Offset    int    // of the capability in config space
	Type      uint8  // cfg_type: CapCommonCfg …
	BAR       uint8  // 0 … 5
	ID        uint8  // distinguishes capabilities of one type
	BAROffset uint32 // offset of the structure in the BAR
	Length    uint32 // of the structure
	// NotifyOffMultiplier is the notify capability's
	// notify_off_multiplier; zero for other types.
	NotifyOffMultiplier uint32
}

// Layout is where the virtio structures the driver uses live: the first
// capability of each type ("The driver SHOULD use the first instance of
// each virtio structure type they can support").
type Layout struct {
	Common, Notify, ISR, Device, PCICfg *Cap
	// All lists every virtio capability found, in list order.
	All []Cap
}

// ParseCaps walks the capability list of a copy of config space cfg (at
// least the 256-byte PCI header) and returns the virtio structures. It
// checks that the common, notify and device structures exist and are large
// enough; it does not check them against the BARs (Open does).
func ParseCaps(cfg []byte) (Layout, error) {
	if len(cfg) < 0x40 {
		return Layout{}, &CapError{Offset: 0, Reason: fmt.Sprintf("config space of %d bytes", len(cfg))}
	}
	if binary.LittleEndian.Uint16(cfg[cfgStatus:])&statusCapabilitiesList == 0 {
		return Layout{}, &CapError{Offset: cfgStatus, Reason: "no capability list"}
	}
	var l Layout
	seen := make(map[int]bool)
	p := int(cfg[cfgCapPointer]) &^ 3
	for i := 0; p != 0; i++ {
		if i >= maxCaps || seen[p] {
			return Layout{}, &CapError{Offset: p, Reason: "capability list loops"}
		}
		seen[p] = true
		if p < 0x40 || p+2 > len(cfg) {
			return Layout{}, &CapError{Offset: p, Reason: "pointer outside the device-specific header"}
		}
		id, next := cfg[p], int(cfg[p+1])&^3
		if id == capIDVendor {
			c, ok, err := parseVirtioCap(cfg, p)
			if err != nil {
				return Layout{}, err
			}
			if ok {
				l.All = append(l.All, c)
				l.take(c)
			}
		}
		p = next
	}
	if l.Common == nil {
		return Layout{}, &CapError{Offset: cfgCapPointer, Reason: "no common configuration capability (not a virtio 1.x device)"}
	}
	if l.Notify == nil {
		return Layout{}, &CapError{Offset: cfgCapPointer, Reason: "no notification capability"}
	}
	if l.Device == nil {
		return Layout{}, &CapError{Offset: cfgCapPointer, Reason: "no device configuration capability"}
	}
	if l.Common.Length < minCommonCfgLen {
		return Layout{}, &CapError{Offset: l.Common.Offset, Reason: fmt.Sprintf("common configuration of %d bytes, want at least %d", l.Common.Length, minCommonCfgLen)}
	}
	if l.Notify.Length < 2 {
		return Layout{}, &CapError{Offset: l.Notify.Offset, Reason: fmt.Sprintf("notification structure of %d bytes", l.Notify.Length)}
	}
	return l, nil
}

// take records c as the structure of its type unless one came first.
func (l *Layout) take(c Cap) {
	var slot **Cap
	switch c.Type {
	case CapCommonCfg:
		slot = &l.Common
	case CapNotifyCfg:
		slot = &l.Notify
	case CapISRCfg:
		slot = &l.ISR
	case CapDeviceCfg:
		slot = &l.Device
	case CapPCICfg:
		slot = &l.PCICfg
	default:
		return
	}
	if *slot == nil {
		cc := c
		*slot = &cc
	}
}

// parseVirtioCap decodes the vendor capability at p. ok is false for
// capabilities the driver must ignore: "The driver MUST ignore any
// vendor-specific capability structure which has a reserved cfg_type
// value" and ones naming a reserved BAR.
func parseVirtioCap(cfg []byte, p int) (c Cap, ok bool, err error) {
	if p+capHeaderLen > len(cfg) {
		return Cap{}, false, &CapError{Offset: p, Reason: "truncated by the end of config space"}
	}
	n := int(cfg[p+2])
	if n < capHeaderLen || p+n > len(cfg) {
		return Cap{}, false, &CapError{Offset: p, Reason: fmt.Sprintf("cap_len %d", n)}
	}
	var raw [notifyCapLen]byte
	copy(raw[:], cfg[p:p+min(n, notifyCapLen)])
	c = Cap{
		Offset:    p,
		Type:      raw[3],
		BAR:       raw[4],
		ID:        raw[5],
		BAROffset: binary.LittleEndian.Uint32(raw[8:]),
		Length:    binary.LittleEndian.Uint32(raw[12:]),
	}
	if c.Type < CapCommonCfg || c.Type > CapPCICfg || c.BAR >= numBARs {
		return Cap{}, false, nil
	}
	if c.Type == CapNotifyCfg {
		if n < notifyCapLen {
			return Cap{}, false, &CapError{Offset: p, Reason: fmt.Sprintf("notification capability of %d bytes, want %d", n, notifyCapLen)}
		}
		c.NotifyOffMultiplier = binary.LittleEndian.Uint32(raw[16:])
	}
	if uint64(c.BAROffset)+uint64(c.Length) > 1<<32 {
		return Cap{}, false, &CapError{Offset: p, Reason: fmt.Sprintf("offset %#x + length %#x overflows", c.BAROffset, c.Length)}
	}
	return c, true, nil
}
