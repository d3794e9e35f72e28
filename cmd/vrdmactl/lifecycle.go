package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/digitalocean/go-qemu/qmp"

	cmdline "github.com/vrdma/vrdma/internal/cli"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/units"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// api is the control API of c's daemon. A request gets at most
// controlapi.DefaultTimeout (10 s) to answer.
func (c *cli) api() *controlapi.Client { return controlapi.New(c.control) }

// apiErr maps a control API error to vrdmactl's: a 404 answer matches
// errNotFound, 409 errConflict, 400 errUsage, no answer errUnreachable.
// The message stays the API's ("GET /v1/devices/x: 404 Not Found: no such
// device: x"), except that a control socket the caller may not connect to
// says which group to join ("/run/vrdma/control.sock: permission denied
// (join group vrdma: …)").
func apiErr(err error) error {
	var ue *controlapi.UnreachableError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ue) && (errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM)):
		return kindError{err: cmdline.SocketAccess(ue.Socket, err), kind: errUnreachable}
	case errors.Is(err, controlapi.ErrUnreachable):
		return fmt.Errorf("%w: %w", errUnreachable, err)
	case errors.Is(err, controlapi.ErrNotFound):
		return fmt.Errorf("%w: %w", errNotFound, err)
	case errors.Is(err, controlapi.ErrConflict):
		return fmt.Errorf("%w: %w", errConflict, err)
	case errors.Is(err, controlapi.ErrBadRequest):
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return err
}

// kindError is err, read as it is, whose exit status is kind's.
type kindError struct{ err, kind error }

func (e kindError) Error() string   { return e.err.Error() }
func (e kindError) Unwrap() []error { return []error{e.err, e.kind} }

func defineDeviceAdd(fs *flag.FlagSet, c *cli) func([]string) error {
	sock := fs.String("socket", "", "vhost-user socket `PATH` the device is served on (default: ID.sock beside the control socket)")
	maxQPs := fs.Uint("max-qps", 0, "most QPs (0: the daemon's default)")
	maxCQs := fs.Uint("max-cqs", 0, "most CQs (0: the daemon's default)")
	maxMRs := fs.Uint("max-mrs", 0, "most MRs (0: the daemon's default)")
	maxPinned := fs.String("max-pinned", "0", "pin quota, a `SIZE` such as 1G (0: the daemon's --max-pinned)")
	guid := fs.String("guid", "", "node `GUID` xxxx:xxxx:xxxx:xxxx (default: from a random UUID)")
	mac := fs.String("mac", "", "pair the device with the guest NIC of this MAC `address` (the node GUID becomes its EUI-64)")
	gid := fs.String("gid", "", "port `GID` 0, fe80::/64 with the GUID (default: from the GUID)")
	devUUID := fs.String("uuid", "", "the device's `UUID`, which its node GUID and GID derive from (default: random, or from --guid, --gid, --mac)")
	doorbells := fs.Int("doorbell-queues", 0, "doorbell queues, one per guest vCPU (0: 1)")
	var roceBind addrList
	fs.Var(&roceBind, "roce-bind", "the host `ADDR`ess the device's RoCEv2 traffic to other hosts leaves from, instead of vrdmad's --roce-bind (repeatable)")
	var addresses addressList
	fs.Var(&addresses, "address", "assign the device this IP `ADDR`ess or PREFIX: its guest's driver may add the GIDs within it (repeatable; without any the device holds only its port GID)")
	rnic := fs.String("rnic", "", "what executes the device's work: soft (vrdmad's software RNIC) or verbs:`DEVICE[:PORT]` (the host's RDMA NIC through rdma-core, e.g. verbs:mlx5_0); default: vrdmad's --rnic")
	incoming := fs.Bool("incoming", false, "the destination of a live migration: it takes the source's --uuid (or --guid, --gid, --mac), and its GIDs and QP numbers when QEMU loads the source's state into it (from a device of this vrdmad, or of another host's; its --roce-bind addresses are bound before they arrive with the VM)")
	sf := defineShare(fs)
	return func(pos []string) error {
		if err := wantArgs("device add", pos, "ID"); err != nil {
			return err
		}
		id := pos[0]
		if *sock == "" {
			*sock = filepath.Join(filepath.Dir(c.control), id+".sock")
		}
		if abs, err := filepath.Abs(*sock); err == nil {
			*sock = abs
		}
		pinned, err := units.ParseBytes(*maxPinned)
		if err != nil {
			return usageErr("--max-pinned: %v", err)
		}
		for name, v := range map[string]uint{"max-qps": *maxQPs, "max-cqs": *maxCQs, "max-mrs": *maxMRs} {
			if uint64(v) > 1<<32-1 {
				return usageErr("--%s %d: more than 2^32-1", name, v)
			}
		}
		share, err := sf.share()
		if err != nil {
			return err
		}
		req := controlapi.AddRequest{ID: id, Socket: *sock, GUID: *guid, GID: *gid, UUID: *devUUID, MAC: *mac, DoorbellQueues: *doorbells, Share: share,
			RoCEBind: roceBind, Addresses: addresses, RNIC: *rnic, Incoming: *incoming}
		if *maxQPs != 0 || *maxCQs != 0 || *maxMRs != 0 || pinned != 0 {
			req.Limits = &controlapi.Limits{MaxQPs: uint32(*maxQPs), MaxCQs: uint32(*maxCQs), MaxMRs: uint32(*maxMRs), MaxPinnedBytes: pinned}
		}
		info, err := c.api().AddDevice(context.Background(), req)
		if err != nil {
			return apiErr(err)
		}
		if c.json {
			return printJSON(c.out, info)
		}
		return showInfo(c.out, info)
	}
}

func defineDeviceRm(_ *flag.FlagSet, c *cli) func([]string) error {
	return func(pos []string) error {
		if err := wantArgs("device rm", pos, "ID"); err != nil {
			return err
		}
		res, err := c.api().RemoveDevice(context.Background(), pos[0])
		if err != nil {
			return apiErr(err)
		}
		if res.StillListed {
			// Removed all the same: a success, but the operator must know
			// that the device comes back at the next start.
			fmt.Fprintf(c.errOut, "vrdmactl: warning: %s\n", res.Warning)
		}
		if c.json {
			return printJSON(c.out, res) // the API's answer
		}
		_, err = fmt.Fprintf(c.out, "removed %s\n", pos[0])
		return err
	}
}

func defineDeviceLs(_ *flag.FlagSet, c *cli) func([]string) error {
	return func(pos []string) error {
		if err := wantArgs("device ls", pos); err != nil {
			return err
		}
		devs, err := c.api().Devices(context.Background())
		if err != nil {
			return apiErr(err)
		}
		if devs == nil {
			devs = []controlapi.DeviceInfo{} // --json prints [], not null
		}
		if c.json {
			return printJSON(c.out, devs)
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSOCKET\tCONNECTED\tPINNED\tPDS\tMRS\tCQS\tQPS\tMOVED\tERRORS\tWEIGHT\tMAX-BYTES\tMAX-OPS")
		for _, d := range devs {
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t%s\n", d.ID, d.Socket, d.Connected,
				units.FormatBytes(d.PinnedBytes), d.PDs, d.MRs, d.CQs, d.QPs, units.FormatBytes(d.BytesMoved), d.Errors,
				d.Share.Weight, rateLimit(d.Share.MaxBytesPerSec, true), rateLimit(d.Share.MaxOpsPerSec, false))
		}
		return tw.Flush()
	}
}

func defineDeviceShow(_ *flag.FlagSet, c *cli) func([]string) error {
	return func(pos []string) error {
		if err := wantArgs("device show", pos, "ID"); err != nil {
			return err
		}
		d, err := c.api().Device(context.Background(), pos[0])
		if err != nil {
			return apiErr(err)
		}
		if c.json {
			return printJSON(c.out, d)
		}
		return showInfo(c.out, d)
	}
}

// printIDs prints the device IDs, one a line (the completion scripts' way
// to complete IDs).
func printIDs(c *cli) error {
	devs, err := c.api().Devices(context.Background())
	if err != nil {
		return apiErr(err)
	}
	for _, d := range devs {
		fmt.Fprintln(c.out, d.ID)
	}
	return nil
}

// vmFlags are the flags of the vm commands.
type vmFlags struct {
	qmp, libvirt, uri, device, bus string
	vqSize                         int
	timeout                        time.Duration
}

func defineVM(fs *flag.FlagSet, device, attach bool) *vmFlags {
	f := &vmFlags{}
	fs.StringVar(&f.qmp, "qmp", "", "QEMU's QMP unix `SOCKET`")
	fs.StringVar(&f.libvirt, "libvirt", "", "the libvirt `DOMAIN` (name, id or UUID) instead of --qmp: commands go through virsh qemu-monitor-command")
	fs.StringVar(&f.uri, "connect", "", "libvirt connection `URI` for --libvirt (virsh -c; default: virsh's)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this long")
	if device {
		fs.StringVar(&f.device, "device", "", "vrdmad device `ID` (also the QEMU device id)")
	}
	if attach {
		fs.StringVar(&f.bus, "bus", "", "pcie-root-port id to plug into (default: the first free one)")
		fs.IntVar(&f.vqSize, "vq-size", 256, "virtqueue size (power of two)")
	}
	return f
}

// check validates the flags of command name.
func (f *vmFlags) check(name string, pos []string, device bool) error {
	if err := wantArgs(name, pos); err != nil {
		return err
	}
	switch {
	case f.qmp != "" && f.libvirt != "":
		return usageErr("%s: --qmp and --libvirt exclude each other", name)
	case f.qmp == "" && f.libvirt == "":
		if device {
			return usageErr("%s needs --qmp SOCKET or --libvirt DOMAIN, and --device ID", name)
		}
		return usageErr("%s needs --qmp SOCKET or --libvirt DOMAIN", name)
	case f.uri != "" && f.libvirt == "":
		return usageErr("%s: --connect goes with --libvirt", name)
	case device && f.device == "":
		return usageErr("%s needs --device ID", name)
	case f.timeout <= 0:
		return usageErr("%s: --timeout %v: want more than 0", name, f.timeout)
	}
	return nil
}

// dial connects to the QEMU the flags name.
func (f *vmFlags) dial(ctx context.Context) (qmp.Monitor, *qmp.Version, error) {
	if f.libvirt != "" {
		mon, err := qemu.DialLibvirt(ctx, f.libvirt, qemu.LibvirtOptions{URI: f.uri})
		if err != nil {
			return nil, nil, err
		}
		return mon, mon.Version, nil
	}
	mon, err := qemu.DialQMP(ctx, f.qmp)
	if err != nil {
		return nil, nil, err
	}
	return mon, mon.Version, nil
}

// vmResult is what vm attach and vm detach print with --json.
type vmResult struct {
	Device  string  `json:"device"`
	Action  string  `json:"action"`
	Bus     string  `json:"bus,omitempty"`
	Socket  string  `json:"socket,omitempty"`
	Seconds float64 `json:"seconds"`
}

func defineVMAttach(fs *flag.FlagSet, c *cli) func([]string) error {
	f := defineVM(fs, true, true)
	return func(pos []string) error {
		if err := f.check("vm attach", pos, true); err != nil {
			return err
		}
		start := time.Now()
		info, err := c.api().Device(context.Background(), f.device)
		if err != nil {
			return apiErr(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		defer cancel()
		mon, version, err := f.dial(ctx)
		if err != nil {
			return err
		}
		defer mon.Disconnect()
		o := qemu.HotplugOptions{}
		if version != nil {
			o.Version = *version
		}
		dev := qemu.VhostUserDevice{ID: info.ID, Socket: info.Socket, VirtioID: abi.DeviceID,
			NumVQs: info.NumQueues, VQSize: f.vqSize, ConfigSize: abi.ConfigSize}
		bus, err := qemu.AttachVhostUserQMP(ctx, mon, dev, f.bus, o)
		if err != nil {
			return err
		}
		res := vmResult{Device: info.ID, Action: "attached", Bus: bus, Socket: info.Socket, Seconds: time.Since(start).Seconds()}
		if c.json {
			return printJSON(c.out, res)
		}
		_, err = fmt.Fprintf(c.out, "attached %s (socket %s) on %s in %.3f s\n", res.Device, res.Socket, res.Bus, res.Seconds)
		return err
	}
}

func defineVMDetach(fs *flag.FlagSet, c *cli) func([]string) error {
	f := defineVM(fs, true, false)
	return func(pos []string) error {
		if err := f.check("vm detach", pos, true); err != nil {
			return err
		}
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		defer cancel()
		mon, _, err := f.dial(ctx)
		if err != nil {
			return err
		}
		defer mon.Disconnect()
		if err := qemu.DetachVhostUserQMP(ctx, mon, f.device, nil); err != nil {
			return err
		}
		res := vmResult{Device: f.device, Action: "detached", Seconds: time.Since(start).Seconds()}
		if c.json {
			return printJSON(c.out, res)
		}
		_, err = fmt.Fprintf(c.out, "detached %s in %.3f s\n", res.Device, res.Seconds)
		return err
	}
}

func defineVMPCI(fs *flag.FlagSet, c *cli) func([]string) error {
	f := defineVM(fs, false, false)
	return func(pos []string) error {
		if err := f.check("vm pci", pos, false); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		defer cancel()
		mon, _, err := f.dial(ctx)
		if err != nil {
			return err
		}
		defer mon.Disconnect()
		devs, err := qemu.QueryPCIQMP(ctx, mon)
		if err != nil {
			return err
		}
		if c.json {
			return printJSON(c.out, devs)
		}
		tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "BDF\tVENDOR:DEVICE\tCLASS\tID\t")
		for _, d := range devs {
			note := ""
			if d.VendorID == 0x1af4 && d.DeviceID == 0x106a {
				note = "<- vrdma (virtio RDMA device, ID 42)"
			}
			fmt.Fprintf(tw, "%02x:%02x.%d\t%04x:%04x\t%s\t%s\t%s\n", d.Bus, d.Slot, d.Function, d.VendorID, d.DeviceID, d.ClassInfo, d.ID, note)
		}
		return tw.Flush()
	}
}

func defineCompletion(_ *flag.FlagSet, c *cli) func([]string) error {
	return func(pos []string) error {
		if err := wantArgs("completion", pos, "SHELL"); err != nil {
			return err
		}
		switch pos[0] {
		case "bash":
			_, err := io.WriteString(c.out, bashCompletion())
			return err
		case "zsh":
			_, err := io.WriteString(c.out, zshCompletion())
			return err
		}
		return usageErr("completion %q: want bash or zsh", pos[0])
	}
}

// addrList is a repeatable flag of addresses, kept as given: vrdmad checks
// them (its answer names what is wrong).
// addressList is --address: each value checked as the daemon checks it.
type addressList []string

func (l *addressList) String() string { return strings.Join(*l, ",") }

func (l *addressList) Set(s string) error {
	if _, err := controlapi.ParseAddresses([]string{s}); err != nil {
		return err
	}
	*l = append(*l, s)
	return nil
}

type addrList []string

func (l *addrList) String() string { return strings.Join(*l, ",") }

func (l *addrList) Set(s string) error {
	*l = append(*l, s)
	return nil
}
