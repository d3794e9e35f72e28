package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/units"
	abi "github.com/vrdma/vrdma/virtio/rdma"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// do sends one request with a JSON body (nil: none) and decodes a 2xx
// answer into v (nil: ignore it). Any other status is an error carrying
// the API's JSON error message.
func do(control, method, path string, body, v any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://vrdmad"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client(control).Do(req)
	if err != nil {
		return fmt.Errorf("control API at %s: %w", control, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&e)
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, e.Error)
	}
	if v == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// interleaved parses args whose flags may come before or after the
// positional ones ("device add vm1 --socket S" and "device add --socket S
// vm1").
func interleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func deviceAdd(control string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("device add", flag.ContinueOnError)
	sock := fs.String("socket", "", "vhost-user socket `PATH` the device is served on (default: next to the control socket, ID.sock)")
	maxQPs := fs.Uint("max-qps", 0, "most QPs (0: default)")
	maxCQs := fs.Uint("max-cqs", 0, "most CQs (0: default)")
	maxMRs := fs.Uint("max-mrs", 0, "most MRs (0: default)")
	maxPinned := fs.String("max-pinned", "0", "pin quota in bytes, e.g. 1G (0: the daemon's --max-pinned)")
	guid := fs.String("guid", "", "node GUID xxxx:xxxx:xxxx:xxxx (default: from a random UUID)")
	gid := fs.String("gid", "", "port GID 0, fe80::/64 with the GUID (default: from the GUID)")
	doorbells := fs.Int("doorbell-queues", 0, "doorbell queues, one per guest vCPU (0: 1)")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := interleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("device add needs one device ID")
	}
	id := pos[0]
	if *sock == "" {
		*sock = filepath.Join(filepath.Dir(control), id+".sock")
	}
	if abs, err := filepath.Abs(*sock); err == nil {
		*sock = abs
	}
	pinned, err := units.ParseBytes(*maxPinned)
	if err != nil {
		return fmt.Errorf("--max-pinned: %w", err)
	}
	for name, v := range map[string]uint{"max-qps": *maxQPs, "max-cqs": *maxCQs, "max-mrs": *maxMRs} {
		if uint64(v) > 1<<32-1 {
			return fmt.Errorf("--%s %d: more than 2^32-1", name, v)
		}
	}
	req := daemon.AddRequest{ID: id, Socket: *sock, GUID: *guid, GID: *gid, DoorbellQueues: *doorbells}
	if *maxQPs != 0 || *maxCQs != 0 || *maxMRs != 0 || pinned != 0 {
		req.Limits = &daemon.Limits{MaxQPs: uint32(*maxQPs), MaxCQs: uint32(*maxCQs), MaxMRs: uint32(*maxMRs), MaxPinnedBytes: pinned}
	}
	var info daemon.DeviceInfo
	if err := do(control, http.MethodPost, "/v1/devices", req, &info); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, info)
	}
	return showInfo(out, info)
}

func deviceRm(control string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("device rm", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := interleaved(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("device rm needs one device ID")
	}
	var res map[string]any
	if err := do(control, http.MethodDelete, "/v1/devices/"+pos[0], nil, &res); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, res)
	}
	_, err = fmt.Fprintf(out, "removed %s\n", pos[0])
	return err
}

// vmFlags are the flags of vm attach and vm detach.
type vmFlags struct {
	qmp, device, bus string
	vqSize           int
	timeout          time.Duration
	asJSON           bool
}

func parseVM(name string, args []string, attach bool) (vmFlags, error) {
	var f vmFlags
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&f.qmp, "qmp", "", "QEMU's QMP unix `SOCKET`")
	fs.StringVar(&f.device, "device", "", "vrdmad device `ID` (also the QEMU device id)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "give up after this long")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	if attach {
		fs.StringVar(&f.bus, "bus", "", "pcie-root-port id to plug into (default: the first free one)")
		fs.IntVar(&f.vqSize, "vq-size", 256, "virtqueue size (power of two)")
	}
	pos, err := interleaved(fs, args)
	if err != nil {
		return f, err
	}
	if len(pos) != 0 {
		return f, fmt.Errorf("%s: unexpected arguments %q", name, pos)
	}
	if f.qmp == "" || f.device == "" {
		return f, fmt.Errorf("%s needs --qmp SOCKET and --device ID", name)
	}
	return f, nil
}

// vmResult is what vm attach and vm detach print with --json.
type vmResult struct {
	Device  string  `json:"device"`
	Action  string  `json:"action"`
	Bus     string  `json:"bus,omitempty"`
	Socket  string  `json:"socket,omitempty"`
	Seconds float64 `json:"seconds"`
}

func vmAttach(control string, args []string, out io.Writer) error {
	f, err := parseVM("vm attach", args, true)
	if err != nil {
		return err
	}
	start := time.Now()
	var info daemon.DeviceInfo
	if err := do(control, http.MethodGet, "/v1/devices/"+f.device, nil, &info); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	mon, err := qemu.DialQMP(ctx, f.qmp)
	if err != nil {
		return err
	}
	defer mon.Disconnect()
	o := qemu.HotplugOptions{}
	if mon.Version != nil {
		o.Version = *mon.Version
	}
	dev := qemu.VhostUserDevice{ID: info.ID, Socket: info.Socket, VirtioID: abi.DeviceID,
		NumVQs: info.NumQueues, VQSize: f.vqSize, ConfigSize: abi.ConfigSize}
	bus, err := qemu.AttachVhostUserQMP(ctx, mon, dev, f.bus, o)
	if err != nil {
		return err
	}
	res := vmResult{Device: info.ID, Action: "attached", Bus: bus, Socket: info.Socket, Seconds: time.Since(start).Seconds()}
	if f.asJSON {
		return printJSON(out, res)
	}
	_, err = fmt.Fprintf(out, "attached %s (socket %s) on %s in %.3f s\n", res.Device, res.Socket, res.Bus, res.Seconds)
	return err
}

func vmDetach(args []string, out io.Writer) error {
	f, err := parseVM("vm detach", args, false)
	if err != nil {
		return err
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
	defer cancel()
	mon, err := qemu.DialQMP(ctx, f.qmp)
	if err != nil {
		return err
	}
	defer mon.Disconnect()
	if err := qemu.DetachVhostUserQMP(ctx, mon, f.device, nil); err != nil {
		return err
	}
	res := vmResult{Device: f.device, Action: "detached", Seconds: time.Since(start).Seconds()}
	if f.asJSON {
		return printJSON(out, res)
	}
	_, err = fmt.Fprintf(out, "detached %s in %.3f s\n", res.Device, res.Seconds)
	return err
}

// showInfo prints one device as a two-column table.
func showInfo(out io.Writer, d daemon.DeviceInfo) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	rows := [][2]string{
		{"id", d.ID}, {"socket", d.Socket}, {"uuid", d.UUID}, {"guid", d.GUID}, {"gid", d.GID},
		{"connected", fmt.Sprint(d.Connected)}, {"num_queues", fmt.Sprint(d.NumQueues)},
		{"max_qps", fmt.Sprint(d.Limits.MaxQPs)}, {"max_cqs", fmt.Sprint(d.Limits.MaxCQs)}, {"max_mrs", fmt.Sprint(d.Limits.MaxMRs)},
		{"max_pinned", pinnedLimit(d.Limits.MaxPinnedBytes)},
		{"pinned", units.FormatBytes(d.PinnedBytes)}, {"map_cache", units.FormatBytes(d.CachedBytes)},
		{"pds", fmt.Sprint(d.PDs)}, {"mrs", fmt.Sprint(d.MRs)}, {"cqs", fmt.Sprint(d.CQs)}, {"qps", fmt.Sprint(d.QPs)}, {"ahs", fmt.Sprint(d.AHs)},
		{"bytes_moved", units.FormatBytes(d.BytesMoved)}, {"commands", fmt.Sprint(d.Commands)},
		{"errors", fmt.Sprint(d.Errors)}, {"ring_errors", fmt.Sprint(d.RingErrors)}, {"sessions", fmt.Sprint(d.Sessions)},
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

func pinnedLimit(n uint64) string {
	if n == 0 {
		return "none"
	}
	return units.FormatBytes(n)
}
