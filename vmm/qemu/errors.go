package qemu

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Typed errors below match them with errors.Is.
var (
	// ErrInvalidConfig means a Config or VhostUserDevice cannot be turned
	// into a QEMU command line. Returned as *ConfigError.
	ErrInvalidConfig = errors.New("invalid qemu config")

	// ErrNoBinary means no QEMU binary was found (see FindBinary).
	ErrNoBinary = errors.New("qemu binary not found")

	// ErrNoRDMADevice means the QEMU offers no device vrdma can attach:
	// neither vrdma's vhost-user-rdma-pci nor a user-creatable generic
	// vhost-user PCI device. It is not vrdma's QEMU (package vrdma-qemu,
	// `make qemu`).
	ErrNoRDMADevice = errors.New("qemu has no device for vrdma")

	// ErrNoSharedMemory means guest RAM is not backed by shared memory
	// (share=on), which a vhost-user back-end needs to map it.
	ErrNoSharedMemory = errors.New("guest memory is not shared")

	// ErrNoFreeRootPort means every pcie-root-port already holds a device.
	ErrNoFreeRootPort = errors.New("no free pcie-root-port")

	// ErrExited means the QEMU process has exited.
	ErrExited = errors.New("qemu exited")

	// ErrQMP means QEMU answered a QMP command with an error, or the reply
	// could not be read. Returned as *QMPError.
	ErrQMP = errors.New("qmp command failed")
)

// ConfigError describes one invalid field of a Config.
type ConfigError struct {
	// Field names the offending field, e.g. "MemoryMiB" or
	// "Devices[1].VQSize".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("invalid qemu config: %s: %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// QMPError is a failed QMP command.
type QMPError struct {
	// Command is the QMP command name ("device_add").
	Command string
	// Err is QEMU's error (its "desc") or the transport error.
	Err error
}

func (e *QMPError) Error() string { return fmt.Sprintf("qmp %s: %v", e.Command, e.Err) }

// Unwrap returns the underlying error.
func (e *QMPError) Unwrap() error { return e.Err }

// Is reports whether target is ErrQMP.
func (e *QMPError) Is(target error) bool { return target == ErrQMP }

func configErr(field, format string, args ...any) error {
	return &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ErrLibvirt means a virsh command failed: virsh is missing, libvirt
// refused the connection, or the domain is unknown or not running.
// Returned as *LibvirtError.
var ErrLibvirt = errors.New("libvirt command failed")

// LibvirtError is a virsh run that failed (LibvirtMonitor).
type LibvirtError struct {
	// Domain is the libvirt domain; URI the connection ("" for virsh's
	// default).
	Domain, URI string
	// Op is the virsh command ("qemu-monitor-command").
	Op string
	// Message is what virsh said ("failed to get domain 'vm9'"), if
	// anything.
	Message string
	// Err is the cause: the exit status, a timeout, a missing virsh.
	Err error
}

func (e *LibvirtError) Error() string {
	s := "libvirt domain " + e.Domain
	if e.URI != "" {
		s += " (" + e.URI + ")"
	}
	s += ": virsh " + e.Op
	if e.Message != "" {
		return s + ": " + e.Message
	}
	return fmt.Sprintf("%s: %v", s, e.Err)
}

// Unwrap returns the cause.
func (e *LibvirtError) Unwrap() error { return e.Err }

// ErrNoDomain means libvirt has no domain of that name, id or UUID. A
// *LibvirtError matches it (and ErrLibvirt) when virsh says so.
var ErrNoDomain = errors.New("no such libvirt domain")

// Is reports whether target is ErrLibvirt, or ErrNoDomain when virsh could
// not find the domain.
func (e *LibvirtError) Is(target error) bool {
	switch target {
	case ErrLibvirt:
		return true
	case ErrNoDomain:
		return strings.Contains(e.Message, "failed to get domain") || strings.Contains(e.Message, "Domain not found")
	}
	return false
}
