package guestvm

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/vmm/qemu"
)

// Defaults of StackConfig.
const (
	// DefaultDeviceWait is how long stack-init waits for vrdma0 and its
	// GIDs.
	DefaultDeviceWait = 30 * time.Second
	// maxDeviceWait bounds StackConfig.DeviceWait.
	maxDeviceWait = time.Hour
	// maxHosts bounds StackConfig.Hosts.
	maxHosts = 16
)

// Exit codes of a stack guest's run that are not the command's own.
const (
	// ExitTimeout: the run's context ended (a deadline) before the
	// command reported its exit status. As timeout(1).
	ExitTimeout = 124
	// ExitHarness: no exit status from the command: the guest could not
	// boot, init could not run the command, or the guest died (QEMU
	// exited) before the command ended.
	ExitHarness = 125
)

// Host is an /etc/hosts entry of a stack guest.
type Host struct {
	// Name is a host name: letters, digits, '-' and '.'.
	Name string
	// IP is its IPv4 address.
	IP netip.Addr
}

// StackConfig describes a guest of the standard-RDMA-stack image
// (scripts/guest-stack-image.sh: Debian's cloud kernel with the vrdma
// kernel driver, libibverbs with the vrdma provider, perftest, ...), whose
// /init (guest/stack-init) runs one shell command.
type StackConfig struct {
	// Name names the guest in errors and logs and is its host name; empty
	// means DefaultName.
	Name string
	// QEMU is the qemu-system-x86_64 binary (see qemu.FindBinary).
	QEMU string
	// Kernel and Initrd are the image (bin/guest-stack/vmlinuz and
	// bin/guest-stack/initramfs.img).
	Kernel, Initrd string
	// MemoryMiB is the guest RAM; zero means DefaultMemoryMiB.
	MemoryMiB int
	// SMP is the number of vCPUs; zero means one.
	SMP int
	// HugePages is the number of 2 MiB hugepages init reserves; zero
	// reserves none.
	HugePages int
	// Command is run by `sh -c` in the guest, as root, in /root, with its
	// stdout and stderr on the protocol line and stdin from /dev/null. It
	// travels base64-encoded on the kernel command line, which bounds its
	// length (about 1400 bytes); it may not be empty or hold a NUL.
	Command string
	// NIC is the guest's network card (eth0); nil means none. The vrdma
	// kernel driver binds its RDMA port to the netdev whose MAC address
	// matches the device's node GUID (abi.GUIDOfMAC in virtio/rdma/abi).
	NIC *qemu.NIC
	// IP is eth0's IPv4 address and prefix ("10.11.0.1/24"); invalid (the
	// zero Prefix) means none. It needs NIC.
	IP netip.Prefix
	// Hosts are added to /etc/hosts (besides localhost and Name at IP).
	Hosts []Host
	// Gate makes the command wait until Release: init prints VRDMA-WAIT
	// and waits for VRDMA-GO.
	Gate bool
	// AnnounceListen makes init print "VRDMA-LISTEN <port>" when a TCP
	// socket starts listening while the command runs.
	AnnounceListen bool
	// DeviceWait is how long init waits for vrdma0 (and, with a NIC, a
	// non-zero GID); zero means DefaultDeviceWait. Whole seconds.
	DeviceWait time.Duration
	// Append is added to the kernel command line, e.g. "loglevel=7" or
	// "vrdma.dyndbg=+p". Empty adds nothing.
	Append string
	// Devices are the vrdma devices present from boot; their back-ends
	// must be listening.
	Devices []qemu.VhostUserDevice
	// ExtraQEMUArgs are appended to QEMU's command line unchanged.
	ExtraQEMUArgs []string
}

func (c StackConfig) withDefaults() StackConfig {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.MemoryMiB == 0 {
		c.MemoryMiB = DefaultMemoryMiB
	}
	if c.DeviceWait == 0 {
		c.DeviceWait = DefaultDeviceWait
	}
	return c
}

// validHostName: letters, digits, '-' and '.', starting with a letter or
// digit, at most 63 bytes.
func validHostName(s string) bool {
	if len(s) > 63 || !validWord(s, "-.") {
		return false
	}
	return s[0] != '-' && s[0] != '.'
}

// Validate reports the first problem with c as a *ConfigError, or nil.
// Zero fields are checked after their defaults are applied; QEMU's part of
// the configuration is checked again by vmm/qemu.
func (c StackConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.QEMU == "":
		return configErr("QEMU", "empty")
	case c.Kernel == "":
		return configErr("Kernel", "empty")
	case c.Initrd == "":
		return configErr("Initrd", "empty")
	case !validHostName(c.Name):
		return configErr("Name", "must be a host name: letters, digits, '-' and '.', at most 63")
	case strings.TrimSpace(c.Command) == "":
		return configErr("Command", "empty")
	case strings.ContainsRune(c.Command, 0):
		return configErr("Command", "holds a NUL")
	case c.MemoryMiB < 0:
		return configErr("MemoryMiB", "negative")
	case c.HugePages < 0 || c.HugePages*2 >= c.MemoryMiB:
		return configErr("HugePages", fmt.Sprintf("%d hugepages (2 MiB) do not fit in %d MiB of RAM", c.HugePages, c.MemoryMiB))
	case c.DeviceWait < time.Second || c.DeviceWait > maxDeviceWait:
		return configErr("DeviceWait", fmt.Sprintf("%v out of range [1s, %v]", c.DeviceWait, maxDeviceWait))
	case c.IP.IsValid() && (!c.IP.Addr().Is4() || c.IP.Bits() < 1):
		return configErr("IP", fmt.Sprintf("%v is not an IPv4 address with a prefix length", c.IP))
	case c.IP.IsValid() && c.NIC == nil:
		return configErr("IP", "set without a NIC")
	case len(c.Hosts) > maxHosts:
		return configErr("Hosts", fmt.Sprintf("%d entries, at most %d", len(c.Hosts), maxHosts))
	case strings.ContainsAny(c.Append, "\n\r\x00\""):
		return configErr("Append", "holds a newline, NUL or quote")
	}
	for i, h := range c.Hosts {
		if !validHostName(h.Name) || !h.IP.Is4() {
			return configErr(fmt.Sprintf("Hosts[%d]", i), fmt.Sprintf("%q at %v: want a host name and an IPv4 address", h.Name, h.IP))
		}
	}
	if n := len(c.appendLine()); n > maxAppend {
		return configErr("Command", fmt.Sprintf("kernel command line of %d bytes is longer than %d (the command travels on it, base64-encoded): shorten the command", n, maxAppend))
	}
	return nil
}

// appendLine is the kernel command line for c (defaults applied); see
// guest/stack-init for the parameters.
func (c StackConfig) appendLine() string {
	parts := []string{
		// no_timer_check: under TCG on a loaded host the kernel's check
		// that the IO-APIC timer ticks can miss its window and panic the
		// boot ("IO-APIC + timer doesn't work!"); the emulated timer
		// works, only the host was slow.
		"console=ttyS0", "quiet", "panic=-1", "no_timer_check",
		"vrdma.console=ttyS1",
		"vrdma.hostname=" + c.Name,
	}
	if c.IP.IsValid() {
		parts = append(parts, "vrdma.ip="+c.IP.String())
	}
	for _, h := range c.Hosts {
		parts = append(parts, "vrdma.host="+h.Name+":"+h.IP.String())
	}
	if c.Gate {
		parts = append(parts, "vrdma.gate=1")
	}
	if c.AnnounceListen {
		parts = append(parts, "vrdma.listen=1")
	}
	if c.DeviceWait != DefaultDeviceWait {
		parts = append(parts, "vrdma.devwait="+strconv.Itoa(int((c.DeviceWait+time.Second-1)/time.Second)))
	}
	if c.HugePages > 0 {
		parts = append(parts, "vrdma.hugepages="+strconv.Itoa(c.HugePages))
	}
	parts = append(parts, "vrdma.cmd="+base64.StdEncoding.EncodeToString([]byte(c.Command)))
	if c.Append != "" {
		parts = append(parts, c.Append)
	}
	return strings.Join(parts, " ")
}

// BootStack starts QEMU with the stack image, cfg's devices and NIC, and
// connects to the guest's protocol line; it returns once QEMU runs. ctx
// bounds start-up only. On failure nothing stays behind. The caller must
// Close the Guest; RunCommand follows the command to its end.
func BootStack(ctx context.Context, cfg StackConfig, opts ...Option) (*Guest, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	qcfg := qemu.Config{
		Binary:    cfg.QEMU,
		MemoryMiB: cfg.MemoryMiB,
		SMP:       cfg.SMP,
		Kernel:    cfg.Kernel,
		Initrd:    cfg.Initrd,
		Append:    cfg.appendLine(),
		Devices:   cfg.Devices,
		ExtraArgs: cfg.ExtraQEMUArgs,
	}
	if cfg.NIC != nil {
		qcfg.NICs = []qemu.NIC{*cfg.NIC}
	}
	return boot(ctx, cfg.Name, qcfg, opts)
}

// StackLine is one line of a stack guest's console.
type StackLine struct {
	// Text is the line as the guest printed it (no newline).
	Text string
	// Kind is its protocol kind (KindOther for free text).
	Kind Kind
	// Command is true for the command's own output: the lines between
	// VRDMA-CMD-START and VRDMA-CMD-EXIT, but for init's VRDMA-LISTEN.
	Command bool
}

// CommandResult is how a stack guest's run went, as its console told.
type CommandResult struct {
	// Started is true once VRDMA-CMD-START came.
	Started bool
	// ExitCode is the command's exit status (VRDMA-CMD-EXIT, else
	// VRDMA-EXIT); when the guest reported none, ExitHarness or
	// ExitTimeout. Reported says which.
	ExitCode int
	// Reported is true when the guest reported the command's exit status.
	Reported bool
	// Exited is true once VRDMA-EXIT came (init finished its checks).
	Exited bool
	// Errors are init's VRDMA-ERROR messages.
	Errors []string
	// KernelWarnings are the kernel log lines init flagged
	// (VRDMA-KERNEL-WARNING).
	KernelWarnings []string
	// Rmmod is what init said of `rmmod vrdma` ("ok", "failed: ...",
	// "skipped: ..."); empty when it said nothing.
	Rmmod string
	// BootToCommand is the time from Boot to VRDMA-CMD-START; zero when
	// the command did not start.
	BootToCommand time.Duration
}

// splitLine splits a console line into the lines it stands for: a
// command's last line printed without a newline carries init's
// VRDMA-CMD-EXIT at its end ("partialVRDMA-CMD-EXIT 0"), which becomes two
// lines. Any other line is itself.
func splitLine(s string) []string {
	i := strings.LastIndex(s, PrefixCmdExit)
	if i <= 0 {
		return []string{s}
	}
	if k, payload := Classify(s[i:]); k != KindCmdExit {
		return []string{s}
	} else if _, err := ParseExit(payload); err != nil {
		return []string{s}
	}
	return []string{s[:i], s[i:]}
}

// RunCommand follows a stack guest's console from its first line until
// VRDMA-EXIT, passing every line to out (nil: none) as it comes, and
// returns what the guest reported. It returns early, with the result so
// far, when the console closes (a *GuestError matching ErrGuestGone; the
// result's ExitCode is ExitHarness unless the command had reported) or
// when ctx ends (ctx's error; ExitTimeout). out is called from this
// goroutine only.
func (g *Guest) RunCommand(ctx context.Context, out func(StackLine)) (CommandResult, error) {
	res := CommandResult{ExitCode: ExitHarness}
	inCmd := false
	for i := 0; ; {
		s, n, err := g.line.next(ctx, g.done, i)
		if err != nil {
			switch {
			case errors.Is(err, errLogClosed):
				return res, &GuestError{Guest: g.name, Messages: res.Errors, ExitCode: -1}
			case errors.Is(err, errGuestClosed):
				return res, fmt.Errorf("guest %s: %w", g.name, err)
			}
			if !res.Reported {
				res.ExitCode = ExitTimeout
			}
			return res, fmt.Errorf("guest %s: wait for the command: %w", g.name, err)
		}
		i = n
		for _, part := range splitLine(s) {
			kind, payload := Classify(part)
			switch kind {
			case KindCmdStart:
				if !res.Started {
					res.Started = true
					res.BootToCommand = g.line.cmdStartTime().Sub(g.booted)
				}
				inCmd = true
			case KindCmdExit:
				inCmd = false
				if c, err := ParseExit(payload); err == nil && !res.Reported {
					res.ExitCode, res.Reported = c, true
				}
			case KindError:
				if !inCmd {
					res.Errors = append(res.Errors, payload)
				}
			case KindKernelWarning:
				if !inCmd {
					res.KernelWarnings = append(res.KernelWarnings, payload)
				}
			case KindRmmod:
				if !inCmd {
					res.Rmmod = payload
				}
			case KindExit:
				if inCmd {
					break
				}
				res.Exited = true
				if c, err := ParseExit(payload); err == nil && !res.Reported {
					// No VRDMA-CMD-EXIT: init did not run the command (125)
					// or an older init.
					res.ExitCode, res.Reported = c, res.Started
				}
			}
			if out != nil {
				// VRDMA-LISTEN comes from init while the command runs.
				out(StackLine{Text: part, Kind: kind, Command: inCmd && kind != KindCmdStart && kind != KindListen})
			}
			if res.Exited {
				return res, nil
			}
		}
	}
}

// Release lets a guest booted with StackConfig.Gate run its command: it
// waits until init printed VRDMA-WAIT (writing earlier could lose bytes in
// the UART) and writes VRDMA-GO. It fails when the console closes or ctx
// ends first.
func (g *Guest) Release(ctx context.Context) error {
	for i := 0; ; {
		s, n, err := g.line.next(ctx, g.done, i)
		if err != nil {
			return fmt.Errorf("guest %s: wait for %s: %w", g.name, PrefixWait, err)
		}
		i = n
		if k, _ := Classify(s); k == KindWait {
			return g.WriteLine(PrefixGo)
		}
	}
}
