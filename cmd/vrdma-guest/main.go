// Command vrdma-guest drives a vrdma device (virtio-pci 1af4:106a) from
// guest user space, where Linux has no driver for it, and prints
// machine-readable lines on stdout (log chatter goes to stderr):
//
//	vrdma-guest probe    [--device ADDR]
//	vrdma-guest selftest [--device ADDR]
//	vrdma-guest server   [--device ADDR] --op OP --size N --iters N [--lat-iters N] [--tx-depth N] [--duration D]
//	vrdma-guest client   [--device ADDR] --op OP --size N --iters N [--lat-iters N] [--tx-depth N] [--duration D]
//	vrdma-guest hotplug  [--rounds N] [--timeout D] [--ack]
//	vrdma-guest restart  [--device ADDR] [--rounds N] [--timeout D] [--ack]
//
// restart is the guest's side of a vrdmad restart under a reconnecting
// QEMU (restart.go): it verifies traffic on a loopback pair, prints
// "VRDMA-RESULT {role: restart, event: ready}", then per round waits for
// DEVICE_FATAL, checks that an old handle answers NOT_FOUND, resets and
// re-initialises the device, verifies traffic again and prints the events
// device_fatal, not_found, reset and recovered; with --ack it waits for a
// "VRDMA-NEXT" line on stdin after each recovery, so the host can look at
// the re-created objects before the guest goes on (or exits).
//
// hotplug is the guest's side of a hot-plug test: each round rescans the
// PCI bus until the device appears, probes it and runs the selftest,
// prints "VRDMA-RESULT {role: hotplug, event: attached, attach_s, ...}",
// then waits until the host unplugs the device (powering the slot off as
// soon as the host asks, so Linux's 5 s pciehp delay does not apply) and
// prints an "event: detached" result; with --ack it then waits for a
// "VRDMA-NEXT" line on stdin, so it never powers off before the host saw
// DEVICE_DELETED.
//
// With --duration (both sides) the bandwidth pass is a stream that goes on
// until D has passed, every operation verified as without it; the results
// then tell the bytes moved and the longest pause between completions
// (max_gap_ms), what a live migration of either guest costs the stream.
//
// Results are "VRDMA-RESULT {json}" lines. server and client print one
// "VRDMA-EXCHANGE {json endpoint, role}" line, then read one
// "VRDMA-PEER {json endpoint}" line from stdin (a harness relays it from the
// other VM's console). Every failure prints "VRDMA-ERROR <message>" and
// exits 1. Build it static: CGO_ENABLED=0 go build ./cmd/vrdma-guest.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/guest/virtiopci"
	"github.com/vrdma/vrdma/internal/guestresult"
	"github.com/vrdma/vrdma/internal/perftest"
	"github.com/vrdma/vrdma/internal/units"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Line prefixes: a harness greps them. (Result lines are
// internal/guestresult's.)
const (
	prefixExchange = "VRDMA-EXCHANGE "
	prefixPeer     = "VRDMA-PEER "
	prefixError    = "VRDMA-ERROR "
)

func main() {
	log := logrus.New()
	log.SetOutput(os.Stderr)
	env := &env{stdin: os.Stdin, stdout: os.Stdout, log: logrus.NewEntry(log), open: openPCI}
	if err := env.run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stdout, "%s%s\n", prefixError, strings.ReplaceAll(err.Error(), "\n", " "))
		os.Exit(1)
	}
}

// env is what a run needs; tests replace open.
type env struct {
	stdin  io.Reader
	stdout io.Writer
	log    *logrus.Entry
	// open opens the device at addr ("" = the first one found).
	open func(addr string, log *logrus.Entry) (*verbs.Context, func(), error)
}

// openPCI finds and initialises the device and opens the verbs context.
func openPCI(addr string, log *logrus.Entry) (*verbs.Context, func(), error) {
	if addr == "" {
		found, err := virtiopci.Find(virtiopci.VendorVirtio, virtiopci.DeviceRDMA)
		if err != nil {
			return nil, nil, fmt.Errorf("no device found: %w", err)
		}
		if len(found) == 0 {
			return nil, nil, errors.New("no device found: no PCI function 1af4:106a (is the device attached?)")
		}
		addr = found[0]
	}
	d, err := virtiopci.Open(addr, virtiopci.WithLogger(log))
	if err != nil {
		return nil, nil, err
	}
	c, err := verbs.Open(d)
	if err != nil {
		d.Close()
		return nil, nil, fmt.Errorf("open verbs context: %w", err)
	}
	return c, func() { c.Close(); d.Close() }, nil
}

// result prints v as a VRDMA-RESULT line.
func (e *env) result(v any) error { return guestresult.Write(e.stdout, v) }

const guestUsage = "usage: vrdma-guest probe|selftest|server|client|hotplug|restart [flags] (-h after a subcommand lists its flags)"

func (e *env) run(args []string) error {
	if len(args) == 0 {
		return errors.New(guestUsage)
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		_, err := fmt.Fprintln(e.stdout, guestUsage)
		return err
	}
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet("vrdma-guest "+cmd, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	device := fs.String("device", "", "PCI address of the device (default: the first 1af4:106a)")
	var cfg perftest.Config
	var size string
	rounds, timeout, ack := new(int), new(time.Duration), new(bool)
	if cmd == "hotplug" {
		fs.BoolVar(ack, "ack", false, "after each round wait for a VRDMA-NEXT line on stdin (the host finished its detach)")
		fs.IntVar(rounds, "rounds", 1, "attach/detach rounds")
		fs.DurationVar(timeout, "timeout", 60*time.Second, "longest wait for the device to appear or go")
	}
	if cmd == "restart" {
		fs.BoolVar(ack, "ack", false, "after each recovery wait for a VRDMA-NEXT line on stdin (the host checked the device)")
		fs.IntVar(rounds, "rounds", 1, "restarts of vrdmad to live through")
		fs.DurationVar(timeout, "timeout", 5*time.Minute, "longest wait for each DEVICE_FATAL")
	}
	if cmd == "server" || cmd == "client" {
		fs.StringVar(&cfg.Op, "op", "write", "operation: write, read, send or atomic")
		fs.StringVar(&size, "size", "4K", "message size (atomic: always 8)")
		fs.IntVar(&cfg.Iters, "iters", 1000, "bandwidth iterations")
		fs.IntVar(&cfg.LatIters, "lat-iters", 100, "latency iterations")
		fs.IntVar(&cfg.TxDepth, "tx-depth", perftest.DefaultTxDepth, "work requests in flight")
		fs.DurationVar(&cfg.Timeout, "timeout", perftest.DefaultTimeout, "longest wait without progress")
		fs.DurationVar(&cfg.Duration, "duration", 0, "stream for this long (at least --iters operations); both sides need it")
		fs.Func("gid-index", "GID table entry the QP sends from (perftest's -x; default 0)", func(v string) error {
			n, err := strconv.ParseUint(v, 0, 8)
			if err != nil || n >= abi.GIDTableLen {
				return fmt.Errorf("want 0 … %d", abi.GIDTableLen-1)
			}
			cfg.GIDIndex = uint32(n)
			return nil
		})
		fs.Func("ack-timeout", "local ACK timeout code, 4.096 µs × 2^N (1 … 31; default 14)", func(v string) error {
			n, err := strconv.ParseUint(v, 0, 8)
			if err != nil || n < 1 || n > 31 {
				return errors.New("want 1 … 31")
			}
			cfg.AckTimeout = uint8(n)
			return nil
		})
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch cmd {
	case "probe", "selftest":
	case "hotplug":
		if *rounds < 1 || *rounds > 1000 {
			return fmt.Errorf("--rounds %d: want 1..1000", *rounds)
		}
		if *timeout <= 0 || *timeout > time.Hour {
			return fmt.Errorf("--timeout %v: want (0, 1h]", *timeout)
		}
		if *device != "" {
			return errors.New("hotplug finds the device itself: no --device")
		}
		return e.hotplug(*rounds, *timeout, *ack)
	case "restart":
		if *rounds < 1 || *rounds > 1000 {
			return fmt.Errorf("--rounds %d: want 1..1000", *rounds)
		}
		if *timeout <= 0 || *timeout > 24*time.Hour {
			return fmt.Errorf("--timeout %v: want (0, 24h]", *timeout)
		}
		return e.restart(*device, *rounds, *timeout, *ack)
	case "server", "client":
		n, err := units.ParseBytes(size)
		if err != nil {
			return fmt.Errorf("--size: %w", err)
		}
		cfg.Size, cfg.Verify = n, true
		if _, err := perftest.NewSideConfig(cfg); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unknown subcommand %q: want probe, selftest, server, client, hotplug or restart", cmd)
	}
	c, closeDev, err := e.open(*device, e.log)
	if err != nil {
		return err
	}
	defer closeDev()
	switch cmd {
	case "probe":
		return e.probe(c)
	case "selftest":
		return e.selftest(c)
	default:
		return e.perf(c, cmd, cfg)
	}
}

func (e *env) probe(c *verbs.Context) error {
	dev, err := c.QueryDevice()
	if err != nil {
		return fmt.Errorf("query device: %w", err)
	}
	port, err := c.QueryPort()
	if err != nil {
		return fmt.Errorf("query port: %w", err)
	}
	gid, err := c.QueryGID()
	if err != nil {
		return fmt.Errorf("query gid: %w", err)
	}
	return e.result(map[string]any{"role": "probe", "config": c.Config(), "device": dev, "port": port,
		"gid": fmt.Sprintf("%x", gid[:])})
}

// perf runs one side of a two-VM measurement.
func (e *env) perf(c *verbs.Context, role string, cfg perftest.Config) error {
	s, err := perftest.NewSide(c, cfg, role == "server")
	if err != nil {
		return err
	}
	defer s.Close()
	ep := s.Endpoint()
	b, err := json.Marshal(struct {
		Role string `json:"role"`
		perftest.Endpoint
	}{role, ep})
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.stdout, "%s%s\n", prefixExchange, b); err != nil {
		return err
	}
	peer, err := readPeer(e.stdin)
	if err != nil {
		return err
	}
	var r perftest.Result
	if role == "server" {
		r, err = s.Serve(peer)
	} else {
		r, err = s.Run(peer)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", role, err)
	}
	r.Role = role
	return e.result(r)
}

// readPeer reads lines until a VRDMA-PEER line (others, like echoed
// console noise, are skipped) and decodes its endpoint.
func readPeer(r io.Reader) (perftest.Endpoint, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 1<<16)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		i := strings.Index(line, prefixPeer)
		if i < 0 {
			continue
		}
		var ep perftest.Endpoint
		if err := json.Unmarshal([]byte(line[i+len(prefixPeer):]), &ep); err != nil {
			return ep, fmt.Errorf("peer line %q: %w", line, err)
		}
		return ep, nil
	}
	if err := sc.Err(); err != nil {
		return perftest.Endpoint{}, fmt.Errorf("read peer: %w", err)
	}
	return perftest.Endpoint{}, errors.New("read peer: stdin ended without a VRDMA-PEER line")
}
