package qemu

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Defaults used when a field is left zero. The device's are the defaults
// of QEMU's vhost-user-rdma-pci (patches/0003) and what vrdmad serves by
// default (docs/spec.md): a controlq, an eventq and one doorbell queue,
// 256 entries each, and the 96-byte struct vrdma_config.
const (
	DefaultMemoryMiB = 256
	DefaultSMP       = 1
	// DefaultVirtioID is the virtio device ID of the RDMA device.
	DefaultVirtioID   = 42
	DefaultNumVQs     = 3
	DefaultVQSize     = 256
	DefaultConfigSize = 96
)

// Limits enforced by Validate. They mirror what QEMU 10 accepts without
// aborting: virtio_add_queue aborts above VIRTQUEUE_MAX_SIZE (1024) entries
// or VIRTIO_QUEUE_MAX (1024) queues; vhost-user carries at most 256 bytes
// of config space.
const (
	MaxMemoryMiB  = 1 << 20 // 1 TiB
	MaxSMP        = 255
	MaxNumVQs     = 1024
	MaxVQSize     = 1024
	MaxConfigSize = 256
	// MaxReconnectMs bounds VhostUserDevice.ReconnectMs (one hour).
	MaxReconnectMs = 3600 * 1000
	// MaxPCIePorts bounds root ports (free ones plus one per device) on
	// pcie.0, which has 32 slots of which q35 uses some.
	MaxPCIePorts = 24
	// MaxNICs bounds Config.NICs (they sit on pcie.0 beside the root
	// ports).
	MaxNICs = 4
	// maxUnixPath is sizeof(sockaddr_un.sun_path) minus the NUL.
	maxUnixPath = 107
	maxIDLen    = 64
)

// Names QEMU reserves for objects Args creates.
const (
	memID      = "mem"
	qmpID      = "qmp"
	serialID   = "serial0"
	chrSuffix  = "-chr"
	portSuffix = "-port"
	// freePortPrefix names the free root ports: vrdma-rp0, vrdma-rp1, ...
	freePortPrefix = "vrdma-rp"
)

// VhostUserDevice is one vrdma device, a vhost-user PCI device whose
// back-end listens on a unix socket (QEMU is the client). QEMU creates it
// as vhost-user-rdma-pci, or as a generic vhost-user device (see
// DeviceName).
type VhostUserDevice struct {
	// ID is the QEMU device id (qdev id). It must start with a letter and
	// hold only letters, digits, '-', '.' and '_'. The chardev is named
	// ID+"-chr"; a device on the command line sits behind its own
	// pcie-root-port named ID+"-port", so it can be hot-unplugged.
	ID string
	// Socket is the back-end's listening unix socket.
	Socket string
	// VirtioID is the virtio device ID; zero means 42 (RDMA device),
	// the only one vhost-user-rdma-pci takes.
	VirtioID int
	// NumVQs is the number of virtqueues, 2 plus the back-end device's
	// doorbell queues (its num_queues); zero means 3.
	NumVQs int
	// VQSize is the size of every virtqueue, a power of two; zero means
	// 256.
	VQSize int
	// ConfigSize is the size of the device config space in bytes; zero
	// means 96 (struct vrdma_config).
	ConfigSize int
	// ReconnectMs makes the chardev of a device on the command line
	// reconnect: when the back-end's connection drops (vrdmad restarted),
	// QEMU tries to connect again every ReconnectMs milliseconds
	// ("reconnect-ms", QEMU 9.2 and later). Zero means no reconnect: the
	// device stays without a back-end. With the project's QEMU patch
	// (patches/0002-vhost-user-base-reconnect.patch) QEMU waits for the
	// back-end at start-up and restarts a running driver's rings on the new
	// connection; see docs/spec.md, "Reset and disconnect". Hot-plugged
	// devices (AttachVhostUser) always reconnect every second and ignore
	// this field.
	ReconnectMs int
}

// Config describes a QEMU q35 virtual machine with guest RAM in a shared
// memfd and generic vhost-user devices.
type Config struct {
	// Binary is the qemu-system-x86_64 to run (see FindBinary). Not used
	// by Args.
	Binary string
	// MemoryMiB is the guest RAM size; zero means DefaultMemoryMiB.
	MemoryMiB int
	// SMP is the number of vCPUs; zero means DefaultSMP.
	SMP int
	// Kernel, Initrd and Append boot a Linux kernel directly. Empty Kernel
	// means no kernel: the machine sits in SeaBIOS. Initrd and Append need
	// Kernel.
	Kernel, Initrd, Append string
	// QMPSocket is the path of the QMP unix socket QEMU listens on. Empty
	// means: Args adds no QMP monitor; Start puts one in a private
	// temporary directory.
	QMPSocket string
	// SerialLog is the file the guest's serial console is written to.
	// Empty means QEMU's stdout, which Start keeps in memory (VM.Serial).
	SerialLog string
	// Devices are the vhost-user devices present from boot. Their
	// back-ends must be listening before QEMU starts.
	Devices []VhostUserDevice
	// RootPorts is the number of free pcie-root-port slots for hot-plug,
	// named vrdma-rp0, vrdma-rp1, ...
	RootPorts int
	// NICs are virtio-net network cards, on pcie.0 (not hot-pluggable).
	NICs []NIC
	// DeviceName is the QEMU device Devices (and the VM's hot-plugs) are
	// created as: DeviceNameRDMA, DeviceNameGeneric or DeviceNameTest.
	// Empty means the one Binary offers, vrdma's own first (see
	// DeviceName); DeviceNameGeneric keeps the generic device on a QEMU
	// that has both. Args takes the name as its argument instead.
	DeviceName string
	// Incoming starts the machine as a migration's destination
	// ("-incoming defer"): it waits, paused, until VM.MigrateIncoming
	// names where the stream comes from, and runs once it loaded the
	// state. Its Devices need back-ends of their own, and everything else
	// must match the source's Config (migrate.go).
	Incoming bool
	// ExtraArgs are appended to the command line unchanged.
	ExtraArgs []string
}

// withDefaults returns d with zero fields replaced by their defaults.
func (d VhostUserDevice) withDefaults() VhostUserDevice {
	if d.VirtioID == 0 {
		d.VirtioID = DefaultVirtioID
	}
	if d.NumVQs == 0 {
		d.NumVQs = DefaultNumVQs
	}
	if d.VQSize == 0 {
		d.VQSize = DefaultVQSize
	}
	if d.ConfigSize == 0 {
		d.ConfigSize = DefaultConfigSize
	}
	return d
}

// checkFor checks d (after defaults) against what the QEMU device name
// takes: vhost-user-rdma-pci has no virtio-id property, it is device 42.
func (d VhostUserDevice) checkFor(name, field string) error {
	if name == DeviceNameRDMA && d.VirtioID != DefaultVirtioID {
		return configErr(field+".VirtioID", "%d: %s is virtio device %d only (%s takes any)",
			d.VirtioID, DeviceNameRDMA, DefaultVirtioID, DeviceNameGeneric)
	}
	return nil
}

// validate checks d (after defaults); field prefixes the field names in
// errors.
func (d VhostUserDevice) validate(field string) error {
	if err := validateID(field+".ID", d.ID); err != nil {
		return err
	}
	if err := validatePath(field+".Socket", d.Socket); err != nil {
		return err
	}
	if len(d.Socket) > maxUnixPath {
		return configErr(field+".Socket", "%d bytes, a unix socket path holds at most %d", len(d.Socket), maxUnixPath)
	}
	if d.VirtioID < 1 || d.VirtioID > 0xffff {
		return configErr(field+".VirtioID", "%d out of range [1, 65535]", d.VirtioID)
	}
	if d.NumVQs < 1 || d.NumVQs > MaxNumVQs {
		return configErr(field+".NumVQs", "%d out of range [1, %d]", d.NumVQs, MaxNumVQs)
	}
	if d.VQSize < 1 || d.VQSize > MaxVQSize || d.VQSize&(d.VQSize-1) != 0 {
		return configErr(field+".VQSize", "%d is not a power of two in [1, %d]", d.VQSize, MaxVQSize)
	}
	if d.ConfigSize < 1 || d.ConfigSize > MaxConfigSize {
		return configErr(field+".ConfigSize", "%d out of range [1, %d] (0 means %d)", d.ConfigSize, MaxConfigSize, DefaultConfigSize)
	}
	if d.ReconnectMs < 0 || d.ReconnectMs > MaxReconnectMs {
		return configErr(field+".ReconnectMs", "%d out of range [0, %d] (0: no reconnect)", d.ReconnectMs, MaxReconnectMs)
	}
	return nil
}

// deviceValue returns the "-device" value for d as device deviceName on
// bus (empty: QEMU picks). The queue count, queue size and config size are
// always given, the named device's defaults too: they are the back-end
// device's, which QEMU cannot know.
func (d VhostUserDevice) deviceValue(deviceName, bus string) string {
	var b strings.Builder
	b.WriteString(deviceName)
	b.WriteString(",id=" + d.ID)
	if bus != "" {
		b.WriteString(",bus=" + bus)
	}
	b.WriteString(",chardev=" + d.ID + chrSuffix)
	if deviceName != DeviceNameRDMA {
		b.WriteString(",virtio-id=" + strconv.Itoa(d.VirtioID))
	}
	b.WriteString(",num_vqs=" + strconv.Itoa(d.NumVQs))
	b.WriteString(",vq_size=" + strconv.Itoa(d.VQSize))
	b.WriteString(",config_size=" + strconv.Itoa(d.ConfigSize))
	return b.String()
}

// chardevValue returns the "-chardev" value for d: a unix socket client,
// reconnecting when d.ReconnectMs is set.
func (d VhostUserDevice) chardevValue() string {
	v := "socket,id=" + d.ID + chrSuffix + ",path=" + optEscape(d.Socket)
	if d.ReconnectMs > 0 {
		v += ",reconnect-ms=" + strconv.Itoa(d.ReconnectMs)
	}
	return v
}

// validateID checks a QEMU id as QEMU's id_wellformed does, bounded.
func validateID(field, id string) error {
	if id == "" {
		return configErr(field, "empty")
	}
	if len(id) > maxIDLen {
		return configErr(field, "%d bytes, at most %d", len(id), maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		letter := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		if i == 0 && !letter {
			return configErr(field, "%q must start with a letter", id)
		}
		if !letter && !(c >= '0' && c <= '9') && c != '-' && c != '.' && c != '_' {
			return configErr(field, "%q holds %q; use letters, digits, '-', '.', '_'", id, c)
		}
	}
	return nil
}

// validatePath checks a non-empty path that goes into a QEMU option.
func validatePath(field, p string) error {
	if p == "" {
		return configErr(field, "empty")
	}
	if strings.ContainsAny(p, "\x00\n") {
		return configErr(field, "holds a NUL or newline")
	}
	return nil
}

// optEscape escapes a value for QEMU's key=value,... option syntax, where
// a literal comma is written twice.
func optEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// Validate reports the first problem with c as a *ConfigError, or nil.
// Zero fields are checked after their defaults are applied.
func (c Config) Validate() error {
	if c.MemoryMiB < 0 || c.MemoryMiB > MaxMemoryMiB {
		return configErr("MemoryMiB", "%d out of range [1, %d] (0 means %d)", c.MemoryMiB, MaxMemoryMiB, DefaultMemoryMiB)
	}
	if c.SMP < 0 || c.SMP > MaxSMP {
		return configErr("SMP", "%d out of range [1, %d] (0 means %d)", c.SMP, MaxSMP, DefaultSMP)
	}
	if c.Kernel != "" {
		if err := validatePath("Kernel", c.Kernel); err != nil {
			return err
		}
	} else {
		if c.Initrd != "" {
			return configErr("Initrd", "set without Kernel")
		}
		if c.Append != "" {
			return configErr("Append", "set without Kernel")
		}
	}
	if c.Initrd != "" {
		if err := validatePath("Initrd", c.Initrd); err != nil {
			return err
		}
	}
	if strings.ContainsRune(c.Append, 0) {
		return configErr("Append", "holds a NUL")
	}
	if c.QMPSocket != "" {
		if err := validatePath("QMPSocket", c.QMPSocket); err != nil {
			return err
		}
		if len(c.QMPSocket) > maxUnixPath {
			return configErr("QMPSocket", "%d bytes, a unix socket path holds at most %d", len(c.QMPSocket), maxUnixPath)
		}
	}
	if c.SerialLog != "" {
		if err := validatePath("SerialLog", c.SerialLog); err != nil {
			return err
		}
	}
	if c.RootPorts < 0 {
		return configErr("RootPorts", "%d is negative", c.RootPorts)
	}
	if c.RootPorts > MaxPCIePorts || len(c.Devices) > MaxPCIePorts-c.RootPorts {
		return configErr("RootPorts", "%d free ports plus %d devices exceed %d root ports", c.RootPorts, len(c.Devices), MaxPCIePorts)
	}
	// Every id Args creates must be unique.
	ids := map[string]string{memID: "memory backend", qmpID: "QMP chardev", serialID: "serial chardev"}
	claim := func(field, id, what string) error {
		if prev, ok := ids[id]; ok {
			return configErr(field, "id %q is already used by the %s", id, prev)
		}
		ids[id] = what
		return nil
	}
	for i := 0; i < c.RootPorts; i++ {
		ids[freePortPrefix+strconv.Itoa(i)] = "free root port " + strconv.Itoa(i)
	}
	for i, d := range c.Devices {
		field := fmt.Sprintf("Devices[%d]", i)
		d = d.withDefaults()
		if err := d.validate(field); err != nil {
			return err
		}
		what := fmt.Sprintf("Devices[%d]", i)
		for _, id := range []string{d.ID, d.ID + chrSuffix, d.ID + portSuffix} {
			if err := claim(field+".ID", id, what); err != nil {
				return err
			}
		}
	}
	for i, n := range c.NICs {
		field := fmt.Sprintf("NICs[%d]", i)
		if err := n.validate(field); err != nil {
			return err
		}
		for _, id := range []string{n.ID, n.ID + netSuffix} {
			if err := claim(field+".ID", id, field); err != nil {
				return err
			}
		}
	}
	if c.DeviceName != "" && !slices.Contains(deviceNames[:], c.DeviceName) {
		return configErr("DeviceName", "%q is none of %s, %s, %s", c.DeviceName, DeviceNameRDMA, DeviceNameGeneric, DeviceNameTest)
	}
	if len(c.NICs) > MaxNICs {
		return configErr("NICs", "%d NICs, at most %d", len(c.NICs), MaxNICs)
	}
	for i, a := range c.ExtraArgs {
		if strings.ContainsRune(a, 0) {
			return configErr(fmt.Sprintf("ExtraArgs[%d]", i), "holds a NUL")
		}
	}
	return nil
}

// Args returns QEMU's command line (without the binary) for c, with
// deviceName (DeviceNameRDMA, DeviceNameGeneric or DeviceNameTest, see
// DeviceName) as the driver of c.Devices. deviceName is only checked when
// there are devices.
//
// The machine is q35 with its RAM in a shared memfd (vhost-user back-ends
// map it), no default devices, no graphics, and exit instead of reboot.
func (c Config) Args(deviceName string) ([]string, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if len(c.Devices) > 0 {
		if err := validateID("deviceName", deviceName); err != nil {
			return nil, err
		}
	}
	for i, d := range c.Devices {
		if err := d.withDefaults().checkFor(deviceName, fmt.Sprintf("Devices[%d]", i)); err != nil {
			return nil, err
		}
	}
	mem := c.MemoryMiB
	if mem == 0 {
		mem = DefaultMemoryMiB
	}
	smp := c.SMP
	if smp == 0 {
		smp = DefaultSMP
	}
	size := strconv.Itoa(mem) + "M"
	args := []string{
		"-machine", "q35,memory-backend=" + memID,
		"-m", size,
		"-object", "memory-backend-memfd,id=" + memID + ",size=" + size + ",share=on",
		"-smp", strconv.Itoa(smp),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
	}
	if c.SerialLog != "" {
		args = append(args, "-chardev", "file,id="+serialID+",path="+optEscape(c.SerialLog))
	} else {
		args = append(args, "-chardev", "stdio,id="+serialID+",signal=off")
	}
	args = append(args, "-serial", "chardev:"+serialID)
	if c.QMPSocket != "" {
		args = append(args,
			"-chardev", "socket,id="+qmpID+",path="+optEscape(c.QMPSocket)+",server=on,wait=off",
			"-mon", "chardev="+qmpID+",mode=control")
	}
	if c.Kernel != "" {
		args = append(args, "-kernel", c.Kernel)
		if c.Initrd != "" {
			args = append(args, "-initrd", c.Initrd)
		}
		if c.Append != "" {
			args = append(args, "-append", c.Append)
		}
	}
	chassis := 1
	for _, d := range c.Devices {
		d = d.withDefaults()
		port := d.ID + portSuffix
		args = append(args,
			"-device", "pcie-root-port,id="+port+",bus=pcie.0,chassis="+strconv.Itoa(chassis),
			"-chardev", d.chardevValue(),
			"-device", d.deviceValue(deviceName, port))
		chassis++
	}
	for i := 0; i < c.RootPorts; i++ {
		args = append(args, "-device",
			"pcie-root-port,id="+freePortPrefix+strconv.Itoa(i)+",bus=pcie.0,chassis="+strconv.Itoa(chassis))
		chassis++
	}
	for i, n := range c.NICs {
		args = append(args, "-netdev", n.netdevValue(i), "-device", n.deviceValue())
	}
	if c.Incoming {
		args = append(args, "-incoming", "defer")
	}
	args = append(args, c.ExtraArgs...)
	return args, nil
}
