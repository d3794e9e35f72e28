package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// This file reaches a QEMU that libvirt runs. libvirt owns the domain's QMP
// socket (a second client cannot connect to it), so every command goes
// through libvirt: `virsh [-c URI] qemu-monitor-command --domain DOMAIN
// JSON`, one virsh process per command. What comes back is QEMU's reply
// exactly as QEMU sent it ({"return": ...} or {"error": ...}, plus
// libvirt's "id"); virsh exits 0 for a QMP error too, so the reply is
// what tells.
//
// Why virsh and not go-qemu's qmp.NewLibvirtRPCMonitor (libvirt's RPC
// protocol over /var/run/libvirt/libvirt-sock, through go-libvirt): virsh
// takes any connection URI the operator already uses (qemu:///system,
// qemu+ssh://host/system, a modular virtqemud socket) with libvirt's own
// authentication (polkit, SASL, TLS), while the RPC monitor dials one unix
// socket with go-libvirt's 2022 protocol code; and virsh can be replaced
// by a fake in tests, so the hot-plug logic runs end to end against a real
// QEMU without a libvirtd. The price is a process per command (about
// 20 ms) and no QMP events: DetachVhostUserQMP polls QOM instead of
// waiting for DEVICE_DELETED (see there).

// Limits on what a virsh run may print: QEMU replies are small (the
// largest, qom-list-types, is tens of KiB).
const (
	maxVirshOutput = 16 << 20
	maxVirshStderr = 64 << 10
	// defaultVirshTimeout bounds one virsh run when LibvirtOptions says
	// nothing (libvirt waits up to 30 s for a busy domain job itself).
	defaultVirshTimeout = 45 * time.Second
	maxDomainName       = 256
)

// LibvirtOptions say how to reach libvirt. The zero value runs "virsh" from
// $PATH on virsh's default connection ($LIBVIRT_DEFAULT_URI, else
// qemu:///system for root and qemu:///session for other users).
type LibvirtOptions struct {
	// URI is the libvirt connection URI (virsh -c), e.g. "qemu:///system";
	// "" means virsh's default.
	URI string
	// Virsh is the virsh program; "" means "virsh" looked up in $PATH at
	// each command.
	Virsh string
	// CommandTimeout bounds one monitor command; zero means 45 s.
	CommandTimeout time.Duration
}

// LibvirtMonitor is a qmp.Monitor for the QEMU of a libvirt domain, through
// `virsh qemu-monitor-command`. It is safe for concurrent use (each
// command is its own process; libvirt serialises them on the domain).
// Connect, Disconnect and Events do what a SocketMonitor's do, within what
// virsh offers: Events returns qmp.ErrEventsNotSupported.
//
// libvirt does not know about devices added this way: `virsh dumpxml`
// does not show them, and libvirt marks the domain tainted
// ("custom-monitor"). Detach them before migrating or saving the domain.
type LibvirtMonitor struct {
	// Version is QEMU's version, set by Connect (DialLibvirt); nil before.
	Version *qmp.Version

	domain   string         // immutable
	opts     LibvirtOptions // immutable; CommandTimeout filled in
	lookPath bool           // immutable; opts.Virsh is "": look virsh up in $PATH
}

var _ qmp.Monitor = (*LibvirtMonitor)(nil)

// NewLibvirtMonitor returns a monitor for domain (its name, id or UUID, as
// virsh takes it). It runs nothing: Connect or the first command finds out
// whether virsh works and the domain runs. An unusable domain name or
// option is a *ConfigError.
func NewLibvirtMonitor(domain string, o LibvirtOptions) (*LibvirtMonitor, error) {
	if domain == "" {
		return nil, configErr("domain", "empty")
	}
	if len(domain) > maxDomainName {
		return nil, configErr("domain", "%d bytes, at most %d", len(domain), maxDomainName)
	}
	for _, r := range domain {
		if r < 0x20 || r == 0x7f {
			return nil, configErr("domain", "%q holds a control character", domain)
		}
	}
	if strings.ContainsAny(o.URI, "\x00\n") {
		return nil, configErr("URI", "holds a NUL or newline")
	}
	if strings.ContainsRune(o.Virsh, 0) {
		return nil, configErr("Virsh", "holds a NUL")
	}
	if o.CommandTimeout < 0 {
		return nil, configErr("CommandTimeout", "%v is negative", o.CommandTimeout)
	}
	m := &LibvirtMonitor{domain: domain, opts: o, lookPath: o.Virsh == ""}
	if m.opts.CommandTimeout == 0 {
		m.opts.CommandTimeout = defaultVirshTimeout
	}
	return m, nil
}

// DialLibvirt returns a connected monitor for domain: it runs query-version
// through virsh, so it fails at once (ErrLibvirt) when virsh is missing,
// the connection is refused or the domain is not running. ctx bounds it.
// This is what `vrdmactl vm attach|detach --libvirt DOMAIN` uses where the
// --qmp path uses DialQMP; both return a qmp.Monitor for
// AttachVhostUserQMP, DetachVhostUserQMP and QueryPCIQMP.
func DialLibvirt(ctx context.Context, domain string, o LibvirtOptions) (*LibvirtMonitor, error) {
	m, err := NewLibvirtMonitor(domain, o)
	if err != nil {
		return nil, err
	}
	if err := m.connect(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// Domain returns the domain the monitor talks to.
func (m *LibvirtMonitor) Domain() string { return m.domain }

// Connect asks QEMU for its version (query-version), which proves that
// virsh runs, libvirt answers and the domain is running, and sets Version.
func (m *LibvirtMonitor) Connect() error { return m.connect(context.Background()) }

func (m *LibvirtMonitor) connect(ctx context.Context) error {
	v, err := QEMUVersion(ctx, m)
	if err != nil {
		return err
	}
	m.Version = &v
	return nil
}

// Disconnect does nothing: there is no connection between commands.
func (m *LibvirtMonitor) Disconnect() error { return nil }

// Events returns qmp.ErrEventsNotSupported: `virsh qemu-monitor-command`
// returns a command's reply, never an event.
func (m *LibvirtMonitor) Events(context.Context) (<-chan qmp.Event, error) {
	return nil, qmp.ErrEventsNotSupported
}

// Run runs one QMP command (a JSON object) and returns QEMU's reply. A QMP
// error reply becomes an error carrying QEMU's description, as go-qemu's
// SocketMonitor does; a failed virsh run is a *LibvirtError.
func (m *LibvirtMonitor) Run(cmd []byte) ([]byte, error) {
	return m.RunContext(context.Background(), cmd)
}

// RunContext is Run bounded by ctx (and by LibvirtOptions.CommandTimeout):
// when ctx ends, virsh is killed. runRawQMP uses it, so a cancelled
// attach or detach leaves no virsh behind.
func (m *LibvirtMonitor) RunContext(ctx context.Context, cmd []byte) ([]byte, error) {
	cmd = bytes.TrimSpace(cmd)
	if len(cmd) == 0 || cmd[0] != '{' || !json.Valid(cmd) {
		return nil, m.errorf("qemu-monitor-command", "", fmt.Errorf("command is not a JSON object: %.80q", cmd))
	}
	ctx, cancel := context.WithTimeout(ctx, m.opts.CommandTimeout)
	defer cancel()
	out, err := m.virsh(ctx, "qemu-monitor-command", "--domain", m.domain, string(cmd))
	if err != nil {
		return nil, err
	}
	return parseVirshReply(out)
}

// virsh runs virsh with args on the monitor's connection and returns its
// stdout.
func (m *LibvirtMonitor) virsh(ctx context.Context, args ...string) ([]byte, error) {
	op := args[0]
	prog := m.opts.Virsh
	if m.lookPath {
		p, err := exec.LookPath("virsh")
		if err != nil {
			return nil, m.errorf(op, "", fmt.Errorf("%w (install libvirt-clients)", err))
		}
		prog = p
	}
	if m.opts.URI != "" {
		args = append([]string{"-c", m.opts.URI}, args...)
	}
	var stdout, stderr limitedBuffer
	stdout.limit, stderr.limit = maxVirshOutput, maxVirshStderr
	c := exec.CommandContext(ctx, prog, args...)
	c.Stdin = nil
	c.Stdout, c.Stderr = &stdout, &stderr
	// virsh's messages in English, whatever the operator's locale: they
	// go into our errors.
	c.Env = append(os.Environ(), "LC_ALL=C")
	c.WaitDelay = time.Second
	err := c.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	if ctx.Err() != nil {
		return nil, m.errorf(op, "", fmt.Errorf("virsh did not answer: %w", ctx.Err()))
	}
	return nil, m.errorf(op, virshMessage(stderr.Bytes(), stdout.Bytes()), err)
}

func (m *LibvirtMonitor) errorf(op, msg string, err error) error {
	return &LibvirtError{Domain: m.domain, URI: m.opts.URI, Op: op, Message: msg, Err: err}
}

// virshMessage picks what virsh said about a failure: its "error: ..."
// lines (stderr, else stdout), joined, without the prefix virsh repeats.
func virshMessage(stderr, stdout []byte) string {
	for _, b := range [][]byte{stderr, stdout} {
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			l = strings.TrimSpace(l)
			if l == "" {
				continue
			}
			lines = append(lines, strings.TrimPrefix(l, "error: "))
		}
		if len(lines) > 0 {
			s := strings.Join(lines, "; ")
			if len(s) > 1024 {
				s = s[:1024] + "..."
			}
			return s
		}
	}
	return ""
}

// parseVirshReply checks virsh's stdout for one QMP reply and returns it;
// an error reply becomes an error with QEMU's description.
func parseVirshReply(out []byte) ([]byte, error) {
	out = bytes.TrimSpace(out)
	var r struct {
		Return json.RawMessage `json:"return"`
		Error  *struct {
			Class string `json:"class"`
			Desc  string `json:"desc"`
		} `json:"error"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("virsh printed no QMP reply (%v): %.200q", err, out)
	}
	if r.Error != nil {
		desc := r.Error.Desc
		if desc == "" {
			desc = r.Error.Class
		}
		if desc == "" {
			desc = "error reply without a description"
		}
		return nil, errors.New(desc)
	}
	if r.Return == nil {
		return nil, fmt.Errorf("virsh printed a reply with neither return nor error: %.200q", out)
	}
	return out[:dec.InputOffset()], nil
}

// QueryPCIQMP runs query-pci on the QEMU behind mon (a *qmp.SocketMonitor
// from DialQMP or a *LibvirtMonitor from DialLibvirt).
func QueryPCIQMP(ctx context.Context, mon qmp.Monitor) ([]PCIDevice, error) {
	raw, err := runQMP(ctx, mon, "query-pci", nil)
	if err != nil {
		return nil, err
	}
	return parseQueryPCI(raw)
}
