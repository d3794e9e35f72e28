// Command vrdmactl manages a running vrdmad through its control API (HTTP
// over a unix socket) and, for VMs, QEMU through QMP.
//
// Usage:
//
//	vrdmactl [--control PATH] device add ID [--socket PATH] [--max-qps N] [--max-cqs N]
//	         [--max-mrs N] [--max-pinned SIZE] [--guid G] [--gid G] [--json]
//	vrdmactl [--control PATH] device rm ID [--json]
//	vrdmactl [--control PATH] device ls [--json]
//	vrdmactl [--control PATH] device show ID [--json]
//	vrdmactl [--control PATH] vm attach --qmp SOCKET --device ID [--bus PORT] [--json]
//	vrdmactl vm detach --qmp SOCKET --device ID [--json]
//	vrdmactl vm pci --qmp SOCKET [--json]
//
// vm attach hot-plugs a vrdmad device into a running QEMU over QMP
// (chardev-add of a reconnecting unix client socket, then device_add of
// vhost-user-device-pci, or vhost-user-test-device-pci on QEMU 10.2+, on a
// free pcie-root-port); vm detach unplugs it (device_del, wait for
// DEVICE_DELETED, chardev-remove).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"text/tabwriter"
	"time"

	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/units"
	"github.com/vrdma/vrdma/vmm/qemu"
)

const defaultControl = "/run/vrdma/control.sock"

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "vrdmactl:", err)
		os.Exit(1)
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `Usage:
  vrdmactl [--control PATH] device add ID [--socket PATH] [--max-qps N] [--max-cqs N]
           [--max-mrs N] [--max-pinned SIZE] [--guid G] [--gid G] [--json]   add a device
  vrdmactl [--control PATH] device rm ID [--json]     remove a device (a connected one is torn down)
  vrdmactl [--control PATH] device ls [--json]        list devices
  vrdmactl [--control PATH] device show ID [--json]   one device
  vrdmactl [--control PATH] vm attach --qmp SOCKET --device ID [--bus PORT] [--json]
                                                      hot-plug a device into a running QEMU
  vrdmactl vm detach --qmp SOCKET --device ID [--json]  hot-unplug it
  vrdmactl vm pci --qmp SOCKET [--json]               PCI functions of a running QEMU
`)
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vrdmactl", flag.ContinueOnError)
	control := fs.String("control", envOr("VRDMA_CONTROL", defaultControl), "vrdmad control socket `PATH` ($VRDMA_CONTROL)")
	fs.Usage = func() { usage(fs.Output()); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	rest := fs.Args()
	if len(rest) < 2 {
		usage(os.Stderr)
		return errors.New("missing command")
	}
	switch rest[0] + " " + rest[1] {
	case "device add":
		return deviceAdd(*control, rest[2:], out)
	case "device rm":
		return deviceRm(*control, rest[2:], out)
	case "vm attach":
		return vmAttach(*control, rest[2:], out)
	case "vm detach":
		return vmDetach(rest[2:], out)
	case "device ls":
		return deviceLs(*control, rest[2:], out)
	case "device show":
		return deviceShow(*control, rest[2:], out)
	case "vm pci":
		return vmPCI(rest[2:], out)
	}
	usage(os.Stderr)
	return fmt.Errorf("unknown command %q", rest[0]+" "+rest[1])
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// client talks HTTP to the control socket.
func client(control string) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", control)
		},
	}}
}

func get(control, path string, v any) error {
	resp, err := client(control).Get("http://vrdmad" + path)
	if err != nil {
		return fmt.Errorf("control API at %s: %w", control, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&e)
		return fmt.Errorf("%s: %s: %s", path, resp.Status, e.Error)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func jsonFlag(name string, args []string) (*flag.FlagSet, *bool, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	j := fs.Bool("json", false, "print JSON")
	return fs, j, fs.Parse(args)
}

func deviceLs(control string, args []string, out io.Writer) error {
	_, asJSON, err := jsonFlag("device ls", args)
	if err != nil {
		return err
	}
	var devs []daemon.DeviceInfo
	if err := get(control, "/v1/devices", &devs); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, devs)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSOCKET\tCONNECTED\tPINNED\tPDS\tMRS\tCQS\tQPS\tMOVED\tERRORS")
	for _, d := range devs {
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\t%d\t%d\t%d\t%d\t%s\t%d\n", d.ID, d.Socket, d.Connected,
			units.FormatBytes(d.PinnedBytes), d.PDs, d.MRs, d.CQs, d.QPs, units.FormatBytes(d.BytesMoved), d.Errors)
	}
	return tw.Flush()
}

func deviceShow(control string, args []string, out io.Writer) error {
	fs, asJSON, err := jsonFlag("device show", args)
	if err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("device show needs one device ID")
	}
	var d daemon.DeviceInfo
	if err := get(control, "/v1/devices/"+fs.Arg(0), &d); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, d)
	}
	return showInfo(out, d)
}

func vmPCI(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vm pci", flag.ContinueOnError)
	sock := fs.String("qmp", "", "QEMU's QMP unix socket")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sock == "" {
		return errors.New("vm pci needs --qmp SOCKET")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	devs, err := qemu.QueryPCISocket(ctx, *sock)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(out, devs)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
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

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
