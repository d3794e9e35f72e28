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

// Generic vhost-user PCI device names: QEMU 10.0/10.1 (patched to be
// user-creatable) and QEMU 10.2+ (CONFIG_VHOST_USER_TEST).
const (
	DeviceNameGeneric = "vhost-user-device-pci"
	DeviceNameTest    = "vhost-user-test-device-pci"
)

// FindBinary returns $VRDMA_QEMU if set, else
// <repoRoot>/bin/qemu-system-x86_64 (built by `make qemu`). The file must
// be an executable regular file; otherwise the error matches ErrNoBinary.
func FindBinary(repoRoot string) (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if err := checkExecutable(p); err != nil {
			return "", fmt.Errorf("$%s: %w", EnvBinary, err)
		}
		return p, nil
	}
	p := filepath.Join(repoRoot, "bin", "qemu-system-x86_64")
	if err := checkExecutable(p); err != nil {
		return "", fmt.Errorf("%w (run `make qemu` or set $%s)", err, EnvBinary)
	}
	return p, nil
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

// DeviceName runs `binary -device help` and returns the name of its
// user-creatable generic vhost-user PCI device: DeviceNameGeneric or, on
// QEMU 10.2+, DeviceNameTest. If there is none (stock QEMU 10.0 hides the
// device) the error matches ErrNoGenericDevice. The answer is kept for the
// life of the process, per binary file (path, inode, size, modification
// time), so QEMU is asked once however many VMs start; a rebuilt binary is
// asked again.
func DeviceName(ctx context.Context, binary string) (string, error) {
	key, keyed := deviceNameKeyOf(binary)
	if keyed {
		if name, ok := deviceNames.Load(key); ok {
			return name.(string), nil
		}
	}
	name, err := probeDeviceName(ctx, binary)
	if err == nil && keyed {
		deviceNames.Store(key, name)
	}
	return name, err
}

// deviceNames caches DeviceName: deviceNameKey → device name.
var deviceNames sync.Map

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

// probeDeviceName is DeviceName without the cache.
func probeDeviceName(ctx context.Context, binary string) (string, error) {
	var out limitedBuffer
	out.limit = maxHelpOutput
	cmd := exec.CommandContext(ctx, binary, "-nodefaults", "-machine", "none", "-device", "help")
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s -device help: %w: %s", binary, err, bytes.TrimSpace(out.Bytes()))
	}
	return parseDeviceHelp(out.Bytes(), binary)
}

// parseDeviceHelp finds the generic device in `-device help` output, whose
// lines look like: name "vhost-user-device-pci", bus PCI, desc "..."
func parseDeviceHelp(out []byte, binary string) (string, error) {
	found := map[string]bool{}
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
		if name == DeviceNameGeneric || name == DeviceNameTest {
			found[name] = true
		}
	}
	switch {
	case found[DeviceNameGeneric]:
		return DeviceNameGeneric, nil
	case found[DeviceNameTest]:
		return DeviceNameTest, nil
	}
	return "", fmt.Errorf("%w: %s lists neither %s nor %s (build the patched QEMU with `make qemu`)",
		ErrNoGenericDevice, binary, DeviceNameGeneric, DeviceNameTest)
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
