// Command vrdmad is the vrdma host daemon: it serves para-virtual RDMA
// devices (virtio device ID 42) to QEMU over vhost-user, one unix socket per
// device.
//
// Usage:
//
//	vrdmad --socket /run/vrdma/vm1.sock [--socket …] [--control PATH]
//	       [--log-level info] [--log-format text|json]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/daemon"
)

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vrdmad:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("vrdmad", flag.ContinueOnError)
	var sockets stringList
	fs.Var(&sockets, "socket", "serve a device on this unix socket `PATH` (repeatable: one device per socket; \"ID=PATH\" names the device)")
	control := fs.String("control", "", "serve the HTTP/JSON control API on this unix socket `PATH`")
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	format := fs.String("log-format", "text", "log format: text or json")
	doorbells := fs.Int("doorbell-queues", 1, "doorbell queues per device (one per guest vCPU)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: vrdmad --socket PATH [--socket PATH ...] [flags]\n\n"+
			"vrdmad serves para-virtual RDMA devices (virtio device ID 42) to QEMU over vhost-user.\n"+
			"Attach one to a VM with:\n"+
			"  -chardev socket,id=vrdma0,path=PATH -device vhost-user-device-pci,chardev=vrdma0,\n"+
			"     virtio-id=42,num_vqs=3,vq_size=256,config_size=96\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	log := logrus.New()
	lv, err := logrus.ParseLevel(*level)
	if err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log.SetLevel(lv)
	switch *format {
	case "text":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return fmt.Errorf("--log-format %q: want text or json", *format)
	}
	if len(sockets) == 0 && *control == "" {
		return errors.New("nothing to serve: give at least one --socket (or --control)")
	}

	d := daemon.New(logrus.NewEntry(log))
	for i, s := range sockets {
		id, path, ok := strings.Cut(s, "=")
		if !ok {
			path = s
			id = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
			if id == "" {
				id = fmt.Sprintf("vrdma%d", i)
			}
		}
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: id, Socket: path, Device: rdma.Config{ID: id, DoorbellQueues: *doorbells}}); err != nil {
			d.Close()
			return err
		}
	}
	if *control != "" {
		if err := d.ServeControl(*control); err != nil {
			d.Close()
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log.WithField("devices", len(sockets)).Info("vrdmad serving")
	<-ctx.Done()
	log.Info("shutting down")
	return d.Close()
}

var _ backend.Device = (*rdma.Device)(nil)
