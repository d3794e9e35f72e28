package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
)

// This file holds live migration over QMP. The destination QEMU is started
// with Config.Incoming (-incoming defer: it waits, paused, for
// migrate-incoming), with the same machine as the source and back-ends of
// its own; MigrateIncoming makes it listen on a unix socket, Migrate makes
// the source send its state there, WaitMigration follows query-migrate to
// the end (bounded) and CancelMigration stops a migration in flight, after
// which the source runs on. The functions take any qmp.Monitor, so they
// are tested against a fake; the VM methods use the VM's own.

// Migration statuses as QMP's MigrationStatus names them (query-migrate).
const (
	MigrationNone       = "none"
	MigrationSetup      = "setup"
	MigrationActive     = "active"
	MigrationDevice     = "device"
	MigrationCompleted  = "completed"
	MigrationFailed     = "failed"
	MigrationCancelling = "cancelling"
	MigrationCancelled  = "cancelled"
)

// Run states as query-status names them (QMP RunState), those migration
// passes through.
const (
	RunStateRunning     = "running"
	RunStateInMigrate   = "inmigrate"
	RunStatePostMigrate = "postmigrate"
	RunStateFinishMig   = "finish-migrate"
	RunStatePaused      = "paused"
)

const (
	// migratePoll is how often WaitMigration asks query-migrate.
	migratePoll = 50 * time.Millisecond
	// migrateTimeout bounds WaitMigration and CancelMigration when ctx
	// has no earlier deadline.
	migrateTimeout = 10 * time.Minute
	// maxMigrateURI bounds a migration URI ("unix:" and a socket path).
	maxMigrateURI = len("unix:") + maxUnixPath
	// maxBandwidth bounds MigrationParams.MaxBandwidth (QEMU takes up to
	// SIZE_MAX; 1 TiB/s is more than any link).
	maxBandwidth = 1 << 40
	// maxDowntimeLimit is QEMU's bound on downtime-limit (2000 s).
	maxDowntimeLimit = 2000 * time.Second
	// maxReportedMs bounds the times query-migrate reports (34 years:
	// far above any, far below time.Duration's range).
	maxReportedMs = int64(1) << 40
)

// ErrMigration means a migration failed or was cancelled where it should
// have completed. Returned as *MigrationError.
var ErrMigration = errors.New("migration failed")

// MigrationError is a migration that ended in a state other than the one
// asked for.
type MigrationError struct {
	// Status is the migration's last status ("failed", "cancelled").
	Status string
	// Desc is QEMU's error-desc, if it gave one.
	Desc string
}

func (e *MigrationError) Error() string {
	if e.Desc != "" {
		return fmt.Sprintf("migration %s: %s", e.Status, e.Desc)
	}
	return "migration " + e.Status
}

// Is reports whether target is ErrMigration.
func (e *MigrationError) Is(target error) bool { return target == ErrMigration }

// MigrationRAM is query-migrate's "ram": the guest RAM sent so far.
type MigrationRAM struct {
	// Transferred is the bytes sent, Total the guest RAM, Remaining what
	// is left of the current pass.
	Transferred, Total, Remaining uint64
	// Mbps is the last measured throughput in megabits per second.
	Mbps float64
	// DirtySyncCount is the number of dirty-bitmap passes (1 is the
	// first, whole-RAM pass).
	DirtySyncCount uint64
}

// MigrationInfo is query-migrate's answer, trimmed to what the harness
// uses. Durations QEMU has not reported yet are zero.
type MigrationInfo struct {
	// Status is a MigrationStatus ("active", "completed", ...); "none"
	// before any migration.
	Status string
	// TotalTime is the time since the migration started (its total once
	// it completed); SetupTime the setup phase.
	TotalTime, SetupTime time.Duration
	// Downtime is how long the VM was stopped at switch-over, as QEMU
	// measured it (set once completed); ExpectedDowntime QEMU's estimate
	// while active.
	Downtime, ExpectedDowntime time.Duration
	RAM                        MigrationRAM
	// ErrorDesc is QEMU's reason for a failed migration.
	ErrorDesc string
}

// Done reports whether the status is final: completed, failed or
// cancelled.
func (i MigrationInfo) Done() bool {
	switch i.Status {
	case MigrationCompleted, MigrationFailed, MigrationCancelled:
		return true
	}
	return false
}

// queryMigrateReply is query-migrate's MigrationInfo as QEMU writes it.
type queryMigrateReply struct {
	Status           string `json:"status"`
	TotalTime        *int64 `json:"total-time"`
	SetupTime        *int64 `json:"setup-time"`
	Downtime         *int64 `json:"downtime"`
	ExpectedDowntime *int64 `json:"expected-downtime"`
	RAM              *struct {
		Transferred    int64   `json:"transferred"`
		Total          int64   `json:"total"`
		Remaining      int64   `json:"remaining"`
		Mbps           float64 `json:"mbps"`
		DirtySyncCount int64   `json:"dirty-sync-count"`
	} `json:"ram"`
	ErrorDesc string `json:"error-desc"`
}

// knownStatus lists QMP's MigrationStatus values (QEMU 10).
var knownStatus = map[string]bool{
	MigrationNone: true, MigrationSetup: true, MigrationCancelling: true, MigrationCancelled: true,
	MigrationActive: true, "postcopy-device": true, "postcopy-active": true, "postcopy-paused": true,
	"postcopy-recover-setup": true, "postcopy-recover": true, MigrationCompleted: true, MigrationFailed: true,
	"colo": true, "pre-switchover": true, MigrationDevice: true, "wait-unplug": true,
}

// decodeMigrationInfo decodes and checks a query-migrate reply: an unknown
// status or a negative count is an error (QEMU is trusted, but a reply is
// still input).
func decodeMigrationInfo(raw json.RawMessage) (MigrationInfo, error) {
	var r queryMigrateReply
	if err := json.Unmarshal(raw, &r); err != nil {
		return MigrationInfo{}, fmt.Errorf("decode reply: %w", err)
	}
	if r.Status == "" {
		r.Status = MigrationNone
	}
	if !knownStatus[r.Status] {
		return MigrationInfo{}, fmt.Errorf("unknown migration status %q", truncateStr(r.Status, 40))
	}
	info := MigrationInfo{Status: r.Status, ErrorDesc: truncateStr(r.ErrorDesc, 1024)}
	ms := func(field string, v *int64, d *time.Duration) error {
		if v == nil {
			return nil
		}
		if *v < 0 || *v > maxReportedMs {
			return fmt.Errorf("%s %d ms out of range", field, *v)
		}
		*d = time.Duration(*v) * time.Millisecond
		return nil
	}
	for _, f := range []struct {
		name string
		v    *int64
		d    *time.Duration
	}{{"total-time", r.TotalTime, &info.TotalTime}, {"setup-time", r.SetupTime, &info.SetupTime},
		{"downtime", r.Downtime, &info.Downtime}, {"expected-downtime", r.ExpectedDowntime, &info.ExpectedDowntime}} {
		if err := ms(f.name, f.v, f.d); err != nil {
			return MigrationInfo{}, err
		}
	}
	if r.RAM != nil {
		if r.RAM.Transferred < 0 || r.RAM.Total < 0 || r.RAM.Remaining < 0 || r.RAM.DirtySyncCount < 0 || r.RAM.Mbps < 0 {
			return MigrationInfo{}, errors.New("ram: negative count")
		}
		info.RAM = MigrationRAM{Transferred: uint64(r.RAM.Transferred), Total: uint64(r.RAM.Total),
			Remaining: uint64(r.RAM.Remaining), Mbps: r.RAM.Mbps, DirtySyncCount: uint64(r.RAM.DirtySyncCount)}
	}
	return info, nil
}

func truncateStr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// QueryMigrate asks the QEMU behind mon how its migration goes
// (query-migrate). A QEMU that never migrated answers status "none".
func QueryMigrate(ctx context.Context, mon qmp.Monitor) (MigrationInfo, error) {
	raw, err := runQMP(ctx, mon, "query-migrate", nil)
	if err != nil {
		return MigrationInfo{}, err
	}
	info, err := decodeMigrationInfo(raw)
	if err != nil {
		return MigrationInfo{}, &QMPError{Command: "query-migrate", Err: err}
	}
	return info, nil
}

// RunStatus is query-status's answer.
type RunStatus struct {
	// Running is whether the vCPUs run.
	Running bool `json:"running"`
	// Status is the RunState ("running", "inmigrate", "postmigrate",
	// "paused", ...).
	Status string `json:"status"`
}

// QueryStatus asks the QEMU behind mon whether its VM runs (query-status).
func QueryStatus(ctx context.Context, mon qmp.Monitor) (RunStatus, error) {
	raw, err := runQMP(ctx, mon, "query-status", nil)
	if err != nil {
		return RunStatus{}, err
	}
	var s RunStatus
	if err := json.Unmarshal(raw, &s); err != nil {
		return RunStatus{}, &QMPError{Command: "query-status", Err: fmt.Errorf("decode reply: %w", err)}
	}
	if s.Status == "" || len(s.Status) > 64 {
		return RunStatus{}, &QMPError{Command: "query-status", Err: fmt.Errorf("run state %q", truncateStr(s.Status, 64))}
	}
	return s, nil
}

// MigrationParams tune a migration. Zero fields leave QEMU's setting
// (QEMU 10: 128 MiB/s, 300 ms).
type MigrationParams struct {
	// MaxBandwidth bounds the migration stream in bytes per second
	// (max-bandwidth): a small one keeps a migration in flight long
	// enough to cancel it halfway.
	MaxBandwidth int64
	// DowntimeLimit is the longest switch-over QEMU aims for
	// (downtime-limit, whole milliseconds).
	DowntimeLimit time.Duration
}

func (p MigrationParams) validate() error {
	if p.MaxBandwidth < 0 || p.MaxBandwidth > maxBandwidth {
		return configErr("MigrationParams.MaxBandwidth", "%d out of range [0, %d] bytes/s", p.MaxBandwidth, int64(maxBandwidth))
	}
	if p.DowntimeLimit < 0 || p.DowntimeLimit > maxDowntimeLimit {
		return configErr("MigrationParams.DowntimeLimit", "%v out of range [0, %v]", p.DowntimeLimit, maxDowntimeLimit)
	}
	if p.DowntimeLimit > 0 && p.DowntimeLimit < time.Millisecond {
		return configErr("MigrationParams.DowntimeLimit", "%v is under a millisecond", p.DowntimeLimit)
	}
	return nil
}

// SetMigrationParams sets p's non-zero fields on the QEMU behind mon
// (migrate-set-parameters); all zero sends nothing.
func SetMigrationParams(ctx context.Context, mon qmp.Monitor, p MigrationParams) error {
	if err := p.validate(); err != nil {
		return err
	}
	args := map[string]any{}
	if p.MaxBandwidth > 0 {
		args["max-bandwidth"] = p.MaxBandwidth
	}
	if p.DowntimeLimit > 0 {
		args["downtime-limit"] = p.DowntimeLimit.Milliseconds()
	}
	if len(args) == 0 {
		return nil
	}
	_, err := runQMP(ctx, mon, "migrate-set-parameters", args)
	return err
}

// setMigrationEvents turns on the "events" capability (MIGRATION events
// for every status change; the harness logs them, and a QEMU that follows
// the migration through them may).
func setMigrationEvents(ctx context.Context, mon qmp.Monitor) error {
	_, err := runQMP(ctx, mon, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "events", "state": true}},
	})
	return err
}

// UnixURI is the migration URI of a unix socket path.
func UnixURI(path string) string { return "unix:" + path }

// checkURI accepts the URIs this package makes: "unix:" and an absolute
// socket path that fits sun_path.
func checkURI(uri string) error {
	path, ok := strings.CutPrefix(uri, "unix:")
	if !ok || !strings.HasPrefix(path, "/") {
		return configErr("migration URI", "%q: want unix:/path", truncateStr(uri, 64))
	}
	if len(uri) > maxMigrateURI {
		return configErr("migration URI", "%d bytes, a unix socket path holds at most %d", len(path), maxUnixPath)
	}
	return validatePath("migration URI", path)
}

// MigrateIncomingQMP makes the QEMU behind mon, started with
// Config.Incoming, listen for the migration stream on uri
// ("unix:/path"): the events capability, then migrate-incoming.
func MigrateIncomingQMP(ctx context.Context, mon qmp.Monitor, uri string) error {
	if err := checkURI(uri); err != nil {
		return err
	}
	if err := setMigrationEvents(ctx, mon); err != nil {
		return err
	}
	_, err := runQMP(ctx, mon, "migrate-incoming", map[string]any{"uri": uri})
	return err
}

// MigrateQMP starts migrating the QEMU behind mon to uri: the events
// capability, p, then migrate. It returns once QEMU took the command; the
// migration goes on in QEMU (WaitMigrationQMP, CancelMigrationQMP).
func MigrateQMP(ctx context.Context, mon qmp.Monitor, uri string, p MigrationParams) error {
	if err := checkURI(uri); err != nil {
		return err
	}
	if err := p.validate(); err != nil {
		return err
	}
	if err := setMigrationEvents(ctx, mon); err != nil {
		return err
	}
	if err := SetMigrationParams(ctx, mon, p); err != nil {
		return err
	}
	_, err := runQMP(ctx, mon, "migrate", map[string]any{"uri": uri})
	return err
}

// WaitMigrationQMP polls query-migrate on mon until the migration is done
// (completed, failed or cancelled) and returns its last answer; a status
// other than completed is a *MigrationError (errors.Is ErrMigration), with
// the info. ctx (at most 10 minutes) bounds the wait; when it ends the
// migration goes on in QEMU and the last info is returned with ctx's
// error.
func WaitMigrationQMP(ctx context.Context, mon qmp.Monitor) (MigrationInfo, error) {
	return waitMigration(ctx, mon, MigrationCompleted, nil)
}

// waitMigration polls until the migration is done; a final status other
// than want is a *MigrationError. exited, when not nil, ends the wait
// with ErrExited (the QEMU is gone).
func waitMigration(ctx context.Context, mon qmp.Monitor, want string, exited <-chan struct{}) (MigrationInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	tick := time.NewTicker(migratePoll)
	defer tick.Stop()
	var last MigrationInfo
	for {
		info, err := QueryMigrate(ctx, mon)
		if err != nil {
			return last, err
		}
		last = info
		if info.Done() {
			if info.Status != want {
				return info, &MigrationError{Status: info.Status, Desc: info.ErrorDesc}
			}
			return info, nil
		}
		if info.Status == MigrationNone {
			return info, &MigrationError{Status: info.Status, Desc: "no migration was started"}
		}
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("wait for migration (%s): %w", last.Status, ctx.Err())
		case <-exited:
			return last, fmt.Errorf("wait for migration (%s): %w", last.Status, ErrExited)
		case <-tick.C:
		}
	}
}

// CancelMigrationQMP cancels the migration of the QEMU behind mon
// (migrate_cancel) and waits (bounded by ctx, at most 10 minutes) until
// it is cancelled. A migration that completed or failed first is a
// *MigrationError with that status. The source VM runs on as before the
// migration.
func CancelMigrationQMP(ctx context.Context, mon qmp.Monitor) (MigrationInfo, error) {
	if _, err := runQMP(ctx, mon, "migrate_cancel", nil); err != nil {
		return MigrationInfo{}, err
	}
	return waitMigration(ctx, mon, MigrationCancelled, nil)
}

// MigrateIncoming makes the VM, started with Config.Incoming, listen for
// the migration stream on uri (see MigrateIncomingQMP).
func (vm *VM) MigrateIncoming(ctx context.Context, uri string) error {
	if err := vm.alive("migrate-incoming"); err != nil {
		return err
	}
	return MigrateIncomingQMP(ctx, vm.QMP(), uri)
}

// Migrate starts migrating the VM to uri (see MigrateQMP).
func (vm *VM) Migrate(ctx context.Context, uri string, p MigrationParams) error {
	if err := vm.alive("migrate"); err != nil {
		return err
	}
	return MigrateQMP(ctx, vm.QMP(), uri, p)
}

// QueryMigrate asks the VM how its migration goes (see QueryMigrate).
func (vm *VM) QueryMigrate(ctx context.Context) (MigrationInfo, error) {
	if err := vm.alive("query-migrate"); err != nil {
		return MigrationInfo{}, err
	}
	return QueryMigrate(ctx, vm.QMP())
}

// WaitMigration waits until the VM's migration is done (see
// WaitMigrationQMP); a QEMU that exits first ends the wait with ErrExited.
func (vm *VM) WaitMigration(ctx context.Context) (MigrationInfo, error) {
	if err := vm.alive("query-migrate"); err != nil {
		return MigrationInfo{}, err
	}
	return waitMigration(ctx, vm.QMP(), MigrationCompleted, vm.done)
}

// CancelMigration cancels the VM's migration and waits until it is
// cancelled (see CancelMigrationQMP).
func (vm *VM) CancelMigration(ctx context.Context) (MigrationInfo, error) {
	if err := vm.alive("migrate_cancel"); err != nil {
		return MigrationInfo{}, err
	}
	if _, err := vm.run(ctx, "migrate_cancel", nil); err != nil {
		return MigrationInfo{}, err
	}
	return waitMigration(ctx, vm.QMP(), MigrationCancelled, vm.done)
}

// Status asks whether the VM runs (see QueryStatus).
func (vm *VM) Status(ctx context.Context) (RunStatus, error) {
	if err := vm.alive("query-status"); err != nil {
		return RunStatus{}, err
	}
	return QueryStatus(ctx, vm.QMP())
}

// WaitRunning polls query-status until the VM runs (a migration's
// destination starts its vCPUs once it loaded the state), bounded by
// ctx. A destination that gave up (its run state no longer "inmigrate"
// or "paused"/"finish-migrate" on the way) is an error naming the state.
func (vm *VM) WaitRunning(ctx context.Context) error {
	tick := time.NewTicker(migratePoll)
	defer tick.Stop()
	for {
		s, err := vm.Status(ctx)
		if err != nil {
			return err
		}
		if s.Running {
			return nil
		}
		switch s.Status {
		case RunStateInMigrate, RunStatePaused, RunStateFinishMig, "prelaunch", "restore-vm":
		default:
			return fmt.Errorf("qemu %d is %s, not running", vm.PID(), s.Status)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for qemu %d to run (%s): %w", vm.PID(), s.Status, ctx.Err())
		case <-vm.done:
			return vm.exitedErr("before it ran")
		case <-tick.C:
		}
	}
}

// alive returns a *QMPError for command when QEMU has exited.
func (vm *VM) alive(command string) error {
	select {
	case <-vm.done:
		return &QMPError{Command: command, Err: ErrExited}
	default:
		return nil
	}
}
