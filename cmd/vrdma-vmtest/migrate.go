package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// The migrate scenario: a live migration of a guest whose vrdma device
// carries a verified RDMA stream to a peer guest on the same vrdmad.
//
// vrdmad serves "peer" and "migrant"; the migrant guest is the stream's
// server (passive for write: its memory is written; it posts the receives
// for send), the peer guest the client, which measures (its clock is not
// the migrated one, so its longest gap between completions is the pause
// the stream saw). After --after of stream, vrdmad gets "migrant-dst", an
// incoming device with the migrant's UUID (POST /v1/devices, "incoming":
// true: it takes over the migrant's GIDs and QPNs when QEMU loads the
// device state into it), and the migrant's guest migrates to a second
// QEMU on it. Both guests' results are awaited and one line sums up:
//
//	VRDMA-MIGRATE {"op":"write","device":true,"cancelled":false,"status":"completed","downtime_ms":..,
//	               "total_ms":..,"setup_ms":..,"ram_bytes":..,"gap_ms":..,"bytes":..,"verified":true,...}
//
// --cancel slows the migration (max-bandwidth) and cancels it halfway:
// the migrant stays on its QEMU and the stream must complete verified
// there. --no-device migrates the same guest without a vrdma device (no
// stream: QEMU's downtime of the bare guest, the bench's baseline).
// --across migrates to a QEMU on a second vrdmad in another network
// namespace, the stream crossing RoCEv2 (migrate_across.go).

const migrateUsage = `usage: vrdma-vmtest [flags] migrate [--across] [--op write|send] [--cancel] [--no-device] [--duration D] [--after D] [--size N]

Boots a guest ("migrant", the stream's server) and a peer guest (the
client) on one vrdmad with a verified RDMA stream between them, live-
migrates the migrant to a second QEMU (its device taken over by an
incoming vrdmad device with the same UUID) and prints one line. With
--across (root) the second QEMU's device is on a second vrdmad in
another network namespace, the stream crosses RoCEv2 between the
devices' own addresses, and the migrant's address moves to that
namespace once the migration completed:

  VRDMA-MIGRATE {"op", "device", "cancelled", "status", "downtime_ms",
                 "total_ms", "setup_ms", "ram_bytes", "ram_total_bytes",
                 "gap_ms", "bytes", "verified", "error"}

downtime_ms, total_ms, setup_ms and ram_bytes are QEMU's (query-migrate);
gap_ms is the stream's longest pause between completions; bytes the data
it moved. The exit status is 0 when the stream completed with every byte
verified (and the migration completed; with --cancel: was cancelled and
the source ran on); with --no-device, when the migration completed.

flags:
`

// migrateFlags are the migrate scenario's flags.
type migrateFlags struct {
	op             string
	size           int
	duration       time.Duration
	after          time.Duration
	cancel, across bool
	noDevice       bool
	// bandwidth is the migration's max-bandwidth in bytes/s (0: the
	// scenario's choice: fast, or slow with --cancel).
	bandwidth int64
}

// failedWait bounds the wait for the guests' results after a migration
// failed.
const failedWait = 20 * time.Second

// Migration bandwidths: a completed migration goes as fast as QEMU can;
// one to cancel goes slowly enough to be in flight for seconds.
const (
	fastBandwidth   = 4 << 30
	cancelBandwidth = 8 << 20
)

func parseMigrate(args []string, stderr io.Writer) (migrateFlags, error) {
	var m migrateFlags
	fs := flag.NewFlagSet("vrdma-vmtest migrate", flag.ContinueOnError)
	fs.StringVar(&m.op, "op", "write", "the stream's operation: write or send")
	fs.IntVar(&m.size, "size", 4096, "message size in bytes (send: at least 128)")
	fs.DurationVar(&m.duration, "duration", 40*time.Second, "how long the stream runs (it must span the migration)")
	fs.DurationVar(&m.after, "after", 4*time.Second, "stream time before the migration starts")
	fs.BoolVar(&m.cancel, "cancel", false, "slow the migration down and cancel it halfway; the stream completes on the source")
	fs.BoolVar(&m.across, "across", false, "migrate to a QEMU on a second vrdmad in another network namespace (RoCEv2 between the guests; root)")
	fs.BoolVar(&m.noDevice, "no-device", false, "migrate the same guest without a vrdma device (baseline downtime; no stream)")
	fs.Int64Var(&m.bandwidth, "bandwidth", 0, "migration max-bandwidth in `bytes/s` (0: 4 GiB/s, with --cancel 8 MiB/s)")
	if err := parseScenario(fs, args, migrateUsage, stderr); err != nil {
		return m, err
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "vrdma-vmtest migrate: unexpected arguments %q\n", fs.Args())
		return m, errUsage
	case m.op != "write" && m.op != "send":
		fmt.Fprintf(stderr, "vrdma-vmtest migrate: --op %q: want write or send\n", m.op)
		return m, errUsage
	case m.size <= 0 || m.size > 1<<24 || (m.op == "send" && m.size < 128):
		fmt.Fprintf(stderr, "vrdma-vmtest migrate: --size %d: want 1 … 16 MiB (send: at least 128)\n", m.size)
		return m, errUsage
	case m.duration <= 0 || m.after <= 0 || m.after >= m.duration:
		fmt.Fprintf(stderr, "vrdma-vmtest migrate: --after %v must be positive and shorter than --duration %v\n", m.after, m.duration)
		return m, errUsage
	case m.bandwidth < 0:
		fmt.Fprintf(stderr, "vrdma-vmtest migrate: --bandwidth %d is negative\n", m.bandwidth)
		return m, errUsage
	case m.noDevice && m.cancel:
		fmt.Fprintf(stderr, "vrdma-vmtest migrate: --no-device and --cancel do not go together\n")
		return m, errUsage
	case m.noDevice && m.across:
		fmt.Fprintf(stderr, "vrdma-vmtest migrate: --no-device and --across do not go together\n")
		return m, errUsage
	}
	if m.bandwidth == 0 {
		m.bandwidth = fastBandwidth
		if m.cancel {
			m.bandwidth = cancelBandwidth
		}
	}
	return m, nil
}

// args are the stream's vrdma-guest arguments, the same on both sides.
func (m migrateFlags) args() []string {
	return []string{"--op", m.op, "--size", strconv.Itoa(m.size), "--iters", "1", "--lat-iters", "100",
		"--duration", m.duration.String()}
}

// migrateLine is what the VRDMA-MIGRATE line says.
type migrateLine struct {
	Op        string `json:"op"`
	Device    bool   `json:"device"`
	Cancelled bool   `json:"cancelled"`
	// Status is the migration's last status (query-migrate).
	Status        string  `json:"status"`
	DowntimeMS    float64 `json:"downtime_ms"`
	TotalMS       float64 `json:"total_ms"`
	SetupMS       float64 `json:"setup_ms"`
	WallMS        float64 `json:"wall_ms"`
	RAMBytes      uint64  `json:"ram_bytes"`
	RAMTotalBytes uint64  `json:"ram_total_bytes"`
	// GapMS is the longest pause of the stream: the larger of the two
	// sides' max_gap_ms.
	GapMS    float64 `json:"gap_ms"`
	Bytes    uint64  `json:"bytes"`
	Verified bool    `json:"verified"`
	Error    string  `json:"error,omitempty"`
}

func runMigrate(ctx context.Context, o options, mf migrateFlags, stdout, stderr io.Writer) error {
	if mf.noDevice {
		return runMigrateBare(ctx, o, mf, stdout, stderr)
	}
	if mf.across {
		return runMigrateAcross(ctx, o, mf, stdout, stderr)
	}
	d, err := startDaemon(ctx, o, "peer", "migrant")
	if err != nil {
		return err
	}
	defer stopDaemon(d, o.verbose, stderr)
	devs, err := d.Devices()
	if err != nil {
		return err
	}
	var uuid string
	for _, dev := range devs {
		if dev.ID == "migrant" {
			uuid = dev.UUID
		}
	}
	if uuid == "" {
		return errors.New("vrdmad lists no device \"migrant\"")
	}
	migrant := guestConfig(o, d, "migrant", "server", mf.args())
	peer := guestConfig(o, d, "peer", "client", mf.args())
	return migrateScenario(ctx, o, mf, migrant, peer, func(g *guestvm.Guest) (guestvm.MigrationResult, error) {
		dst := filepath.Join(d.Dir(), "migrant-dst.sock")
		// The destination: an incoming device with the migrant's UUID.
		if _, err := d.AddDevice(ctx, controlapi.AddRequest{ID: "migrant-dst", Socket: dst, UUID: uuid, Incoming: true}); err != nil {
			return guestvm.MigrationResult{}, err
		}
		return migrateGuest(ctx, g, dst, mf, stdout)
	}, stdout, stderr)
}

// migrateScenario boots the migrant's and the peer's guests, lets the
// stream run mf.after, migrates the migrant with migrate, awaits both
// guests' results and prints the VRDMA-MIGRATE line.
func migrateScenario(ctx context.Context, o options, mf migrateFlags, migrant, peer guestvm.Config,
	migrate func(*guestvm.Guest) (guestvm.MigrationResult, error), stdout, stderr io.Writer) error {
	fmt.Fprintf(stdout, "vrdma-vmtest: booting two VMs (%d MiB, TCG), a %s stream of %d B messages for %v between them\n",
		o.memory, mf.op, mf.size, mf.duration)
	p, err := guestvm.StartPair(ctx, migrant, peer)
	if err != nil {
		return err
	}
	defer p.Close()
	line := migrateLine{Op: mf.op, Device: true}

	var mres guestvm.MigrationResult
	merr := waitStream(ctx, p.Server, mf.after)
	if merr == nil {
		mres, merr = migrate(p.Server)
	}
	line.fill(mres)
	line.Cancelled = mf.cancel && merr == nil && mres.Info.Status == qemu.MigrationCancelled

	wctx := ctx
	if merr != nil {
		// The migrant may be gone (a destination that failed after the
		// switch-over): the peer's stream would only time out.
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, failedWait)
		defer cancel()
	}
	res, werr := p.Wait(wctx)
	printResults(stdout, res.Server)
	printResults(stdout, res.Client)
	line.Verified = werr == nil && merr == nil && streamVerified(mf.op, res)
	for _, r := range append(res.Server, res.Client...) {
		line.GapMS = max(line.GapMS, r.MaxGapMS)
		if r.Role == "client" {
			line.Bytes = r.Bytes
		}
	}
	err = errors.Join(merr, werr)
	if err == nil && !line.Verified {
		err = errors.New("the stream's results are not verified on both sides")
	}
	if err == nil && !migrateResultOK(mf, line) {
		err = fmt.Errorf("the migration ended %s", line.Status)
	}
	if err != nil {
		line.Verified = false
		line.Error = strings.ReplaceAll(err.Error(), "\n", " ")
	}
	printMigrateLine(stdout, line)
	if err != nil || o.verbose {
		fmt.Fprint(stderr, p.Log())
	}
	return err
}

// migrateGuest migrates g (the migrant) to a second QEMU whose device is
// served on dst, the incoming device; with mf.cancel it cancels the
// migration halfway instead.
func migrateGuest(ctx context.Context, g *guestvm.Guest, dst string, mf migrateFlags, stdout io.Writer) (guestvm.MigrationResult, error) {
	cfg := guestvm.MigrateConfig{
		Devices: []qemu.VhostUserDevice{device("migrant", dst)},
		Params:  qemu.MigrationParams{MaxBandwidth: mf.bandwidth},
	}
	fmt.Fprintf(stdout, "vrdma-vmtest: migrating the migrant's guest to a second QEMU (max-bandwidth %d B/s)\n", mf.bandwidth)
	m, err := g.StartMigration(ctx, cfg)
	if err != nil {
		return guestvm.MigrationResult{}, err
	}
	if !mf.cancel {
		return m.Wait(ctx)
	}
	// Halfway: a quarter of the RAM sent at least, the migration still
	// in flight; then cancel.
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := m.Info(ctx)
		if err != nil {
			m.Cancel(ctx)
			return guestvm.MigrationResult{Info: info}, err
		}
		if info.Done() {
			// Too fast to cancel: Wait settles it; the scenario fails.
			res, err := m.Wait(ctx)
			if err == nil {
				err = fmt.Errorf("the migration was %s before it could be cancelled (lower --bandwidth)", info.Status)
			}
			return res, err
		}
		if info.Status == qemu.MigrationActive && info.RAM.Total > 0 && info.RAM.Transferred >= info.RAM.Total/4 {
			fmt.Fprintf(stdout, "vrdma-vmtest: cancelling the migration at %d of %d bytes\n", info.RAM.Transferred, info.RAM.Total)
			res, err := m.Cancel(ctx)
			// QEMU reports no RAM or times for a cancelled migration:
			// the line tells what was sent when it was cancelled.
			if res.Info.RAM == (qemu.MigrationRAM{}) {
				res.Info.RAM = info.RAM
			}
			if res.Info.TotalTime == 0 {
				res.Info.TotalTime, res.Info.SetupTime = info.TotalTime, info.SetupTime
			}
			return res, err
		}
		select {
		case <-ctx.Done():
			m.Cancel(context.Background())
			return guestvm.MigrationResult{Info: info}, ctx.Err()
		case <-tick.C:
		}
	}
}

// waitStream waits until g's program published its endpoint (the stream
// starts as soon as the peer's reaches it), then for after more.
func waitStream(ctx context.Context, g *guestvm.Guest, after time.Duration) error {
	lines := g.Lines()
	for {
		select {
		case s, ok := <-lines:
			if !ok {
				return fmt.Errorf("guest %s: console closed before its stream began", g.Name())
			}
			if k, _ := guestvm.Classify(s); k == guestvm.KindExchange {
				go func() { // drain: the channel closes with the console
					for range lines {
					}
				}()
				select {
				case <-time.After(after):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// streamVerified reports whether both sides reported a verified stream
// of op.
func streamVerified(op string, res guestvm.PairResult) bool {
	return checkPair(pairFlags{op: op}, res) == nil
}

// fill copies the migration's numbers into l.
func (l *migrateLine) fill(r guestvm.MigrationResult) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	l.Status = r.Info.Status
	l.DowntimeMS, l.TotalMS, l.SetupMS, l.WallMS = ms(r.Info.Downtime), ms(r.Info.TotalTime), ms(r.Info.SetupTime), ms(r.Wall)
	l.RAMBytes, l.RAMTotalBytes = r.Info.RAM.Transferred, r.Info.RAM.Total
}

func printMigrateLine(w io.Writer, l migrateLine) {
	b, _ := json.Marshal(l)
	fmt.Fprintf(w, "VRDMA-MIGRATE %s\n", b)
}

// runMigrateBare migrates the same guest without a vrdma device: its
// program waits for a device that never comes (vrdma-guest hotplug), the
// guest idles as the migrant would without its stream.
func runMigrateBare(ctx context.Context, o options, mf migrateFlags, stdout, stderr io.Writer) error {
	cfg := guestvm.Config{Name: "migrant", QEMU: o.qemuBin, Kernel: o.kernel, Initrd: o.initrd,
		MemoryMiB: o.memory, HugePages: o.hugepages, Run: "hotplug", Args: []string{"--timeout", "1h"}}
	fmt.Fprintf(stdout, "vrdma-vmtest: booting one VM (%d MiB, TCG) without a vrdma device\n", o.memory)
	g, err := guestvm.Boot(ctx, cfg)
	if err != nil {
		return err
	}
	defer g.Close()
	line := migrateLine{Op: "none"}
	err = waitInit(ctx, g, mf.after)
	var res guestvm.MigrationResult
	if err == nil {
		res, err = g.Migrate(ctx, guestvm.MigrateConfig{Params: qemu.MigrationParams{MaxBandwidth: mf.bandwidth}})
	}
	line.fill(res)
	if err == nil {
		// The guest runs on in the destination: its program still waits.
		var st qemu.RunStatus
		if st, err = g.VM().Status(ctx); err == nil && !st.Running {
			err = fmt.Errorf("the destination is %s, not running", st.Status)
		}
	}
	if err != nil {
		line.Error = strings.ReplaceAll(err.Error(), "\n", " ")
	}
	printMigrateLine(stdout, line)
	if err != nil || o.verbose {
		fmt.Fprint(stderr, g.Log())
	}
	return err
}

// waitInit waits for g's VRDMA-INIT line, then for after more.
func waitInit(ctx context.Context, g *guestvm.Guest, after time.Duration) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for g.InitTime() == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-g.VM().Exited():
			return fmt.Errorf("guest %s: qemu exited before /init", g.Name())
		case <-tick.C:
		}
	}
	select {
	case <-time.After(after):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// migrateResultOK says whether the scenario passed: used for the exit
// status.
func migrateResultOK(mf migrateFlags, l migrateLine) bool {
	if mf.noDevice {
		return l.Status == qemu.MigrationCompleted && l.Error == ""
	}
	want := qemu.MigrationCompleted
	if mf.cancel {
		want = qemu.MigrationCancelled
	}
	return l.Verified && l.Status == want
}
