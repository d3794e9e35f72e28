package qemu

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// EnvBinary names the environment variable that overrides the QEMU binary.
const EnvBinary = "VRDMA_QEMU"

// InstalledBinary is where the vrdma-qemu package installs the patched
// QEMU: beside Debian's QEMU, not in its place.
const InstalledBinary = "/usr/lib/vrdma/bin/qemu-system-x86_64"

// installedBinary is InstalledBinary; tests point it elsewhere.
var installedBinary = InstalledBinary

// The names a QEMU may give the device vrdma attaches, in the order
// DeviceName and DeviceNameQMP prefer them.
const (
	// DeviceNameRDMA is vrdma's own device (patches/0003): virtio ID 42,
	// and vrdma's queue count, queue size and config size as defaults.
	DeviceNameRDMA = "vhost-user-rdma-pci"
	// DeviceNameGeneric is QEMU 10.0/10.1's generic vhost-user device,
	// which patches/0001 makes user-creatable: every property is given.
	DeviceNameGeneric = "vhost-user-device-pci"
	// DeviceNameTest is the generic device of QEMU 10.2+ built with
	// CONFIG_VHOST_USER_TEST.
	DeviceNameTest = "vhost-user-test-device-pci"
)

// deviceNames lists the device names in the order of preference.
var deviceNames = [...]string{DeviceNameRDMA, DeviceNameGeneric, DeviceNameTest}

// FindBinary returns $VRDMA_QEMU if set, else
// <repoRoot>/bin/qemu-system-x86_64 (built by `make qemu`), else
// InstalledBinary (package vrdma-qemu). The file must be an executable
// regular file; otherwise the error matches ErrNoBinary.
func FindBinary(repoRoot string) (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("$%s: %w", EnvBinary, err)
		}
		return p, nil
	}
	p := filepath.Join(repoRoot, "bin", "qemu-system-x86_64")
	err := checkExecutable(p)
	if err == nil {
		return p, nil
	}
	if checkExecutable(installedBinary) == nil {
		return installedBinary, nil
	}
	return "", fmt.Errorf("%w (run `make qemu`, install the package vrdma-qemu, or set $%s)", err, EnvBinary)
}

func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoBinary, err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%w: %s is not an executable file", ErrNoBinary, p)
	}
	return nil
}

// maxHelpOutput bounds what DeviceName reads from `-device help`.
const maxHelpOutput = 1 << 20

// DeviceName runs `binary -device help` and returns the name of the
// device it offers for vrdma: DeviceNameRDMA, else DeviceNameGeneric (a
// QEMU with patches 0001 and 0002 only), else DeviceNameTest (QEMU 10.2+).
// `-device help` lists user-creatable devices only, so stock QEMU 10.0,
// which hides its generic device, has none: then the error matches
// ErrNoRDMADevice. The answer is kept for the life of the process, per
// binary file (path, inode, size, modification time), so QEMU is asked
// once however many VMs start; a rebuilt binary is asked again.
func DeviceName(ctx context.Context, binary string) (string, error) {
	listed, err := listedDevices(ctx, binary)
	if err != nil {
		return "", err
	}
	return pickDevice(listed, binary)
}

// HasDevice reports whether `binary -device help` lists the device name
// (one of DeviceNameRDMA, DeviceNameGeneric, DeviceNameTest), with
// DeviceName's cache.
func HasDevice(ctx context.Context, binary, name string) (bool, error) {
	listed, err := listedDevices(ctx, binary)
	if err != nil {
		return false, err
	}
	return listed[name], nil
}

// listedDevices returns which of deviceNames binary lists, from the cache
// or by asking it.
func listedDevices(ctx context.Context, binary string) (map[string]bool, error) {
	key, keyed := deviceNameKeyOf(binary)
	if keyed {
		if listed, ok := deviceHelpCache.Load(key); ok {
			return listed.(map[string]bool), nil
		}
	}
	listed, err := probeDevices(ctx, binary)
	if err == nil && keyed && len(listed) > 0 {
		deviceHelpCache.Store(key, listed)
	}
	return listed, err
}

// deviceHelpCache caches listedDevices: deviceNameKey → map[string]bool,
// never changed once stored. A binary without any of the devices is not
// kept: it is an error every time, and asked again.
var deviceHelpCache sync.Map

// deviceNameKey identifies one version of a binary file.
type deviceNameKey struct {
	path       string
	dev, inode uint64
	size       int64
	mtime      int64
}

func deviceNameKeyOf(binary string) (deviceNameKey, bool) {
	abs, err := filepath.Abs(binary)
	if err != nil {
		return deviceNameKey{}, false
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return deviceNameKey{}, false
	}
	k := deviceNameKey{path: abs, size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		k.dev, k.inode = uint64(st.Dev), st.Ino
	}
	return k, true
}

// probeDevices is listedDevices without the cache.
func probeDevices(ctx context.Context, binary string) (map[string]bool, error) {
	var out limitedBuffer
	out.limit = maxHelpOutput
	cmd := exec.CommandContext(ctx, binary, "-nodefaults", "-machine", "none", "-device", "help")
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s -device help: %w: %s", binary, err, bytes.TrimSpace(out.Bytes()))
	}
	return parseDeviceList(out.Bytes()), nil
}

// parseDeviceHelp returns the device DeviceName picks from `-device help`
// output.
func parseDeviceHelp(out []byte, binary string) (string, error) {
	return pickDevice(parseDeviceList(out), binary)
}

// parseDeviceList returns which of deviceNames `-device help` output
// lists; its lines look like: name "vhost-user-rdma-pci", bus PCI, desc "..."
func parseDeviceList(out []byte) map[string]bool {
	listed := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 4096), 64<<10)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, "name \"")
		if !ok {
			continue
		}
		name, _, ok := strings.Cut(rest, "\"")
		if !ok {
			continue
		}
		for _, n := range deviceNames {
			if name == n {
				listed[n] = true
			}
		}
	}
	return listed
}

// pickDevice returns the preferred device in listed, or an error matching
// ErrNoRDMADevice that names what binary (a path, or "QEMU 7.2.19") is.
func pickDevice(listed map[string]bool, binary string) (string, error) {
	for _, n := range deviceNames {
		if listed[n] {
			return n, nil
		}
	}
	return "", noDeviceError(binary)
}

// noDeviceError says that what (a binary or a QEMU version) offers no
// device for vrdma, and where the QEMU that has one comes from.
func noDeviceError(what string) error {
	return fmt.Errorf("%w: %s lists neither %s nor the generic %s or %s: it is not vrdma's QEMU "+
		"(install the package vrdma-qemu and use %s, or build it with `make qemu`)",
		ErrNoRDMADevice, what, DeviceNameRDMA, DeviceNameGeneric, DeviceNameTest, InstalledBinary)
}

// limitedBuffer keeps the first limit bytes written and drops the rest.
type limitedBuffer struct {
	buf   bytes.Buffer
	limit int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.buf.Len(); room > 0 {
		if len(p) > room {
			b.buf.Write(p[:room])
		} else {
			b.buf.Write(p)
		}
	}
	return len(p), nil
}

func (b *limitedBuffer) Bytes() []byte { return b.buf.Bytes() }
