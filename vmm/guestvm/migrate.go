package guestvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vrdma/vrdma/vmm/qemu"
)

// Live migration of a guest to a second QEMU on this host. The destination
// is the source's machine (Boot's qemu.Config) with Incoming set, a
// console socket of its own and the devices MigrateConfig names (their
// back-ends ready to take the source's devices over); the stream goes
// over a unix socket in the destination's private directory. Once QEMU
// reports the migration completed and the destination runs, the Guest
// switches over: its VM, the console it writes to and, once the source
// QEMU has quit and its console ended, the console it reads (the line log
// goes on, so WaitResult and Lines readers never notice). A migration
// that fails or is cancelled leaves the guest running in the source and
// nothing of the destination behind.
//
// Lock order: Migration.mu, then Guest.vmMu, then Guest.wmu;
// consoleStream.mu is a leaf.

const (
	// switchTimeout bounds the destination's start once QEMU reported the
	// migration completed, and the source's quit after it.
	switchTimeout = 60 * time.Second
	// maxOldSerial bounds the kernel console kept of QEMUs the guest left.
	maxOldSerial = 4 << 20
)

// ErrMigrationInFlight means a Guest already migrates.
var ErrMigrationInFlight = errors.New("a migration of the guest is in flight")

// ErrCancelTooLate means a migration completed before its cancellation
// took effect: the guest runs in the destination.
var ErrCancelTooLate = errors.New("the migration completed before it was cancelled")

// MigrateConfig says where Guest.StartMigration moves a guest.
type MigrateConfig struct {
	// Devices are the destination's vrdma devices, one for each of the
	// source's, with the same IDs in the same order and the same queue
	// and config sizes, each on the socket of a back-end device ready to
	// load the source device's state (vrdmad: vrdmactl device add
	// --incoming --uuid <the source device's>).
	Devices []qemu.VhostUserDevice
	// Params tune the migration (bandwidth, downtime limit); zero fields
	// keep QEMU's.
	Params qemu.MigrationParams
}

// MigrationResult is how a migration went.
type MigrationResult struct {
	// Info is the source's last query-migrate answer: status, QEMU's
	// downtime, total time, RAM sent.
	Info qemu.MigrationInfo
	// Wall is the time from StartMigration to the destination running,
	// or to the cancellation taking effect.
	Wall time.Duration
}

// Migration is a migration in flight, from StartMigration until Wait or
// Cancel returns.
type Migration struct {
	g       *Guest    // immutable
	src     *qemu.VM  // immutable; the QEMU the guest left
	dst     *qemu.VM  // immutable; the destination QEMU
	dstConn net.Conn  // immutable; the destination's console
	dstDir  string    // immutable; the destination's private directory
	started time.Time // immutable

	mu    sync.Mutex
	ended bool // protected by mu; committed or aborted
}

// Migrate migrates the guest (StartMigration, then Wait).
func (g *Guest) Migrate(ctx context.Context, cfg MigrateConfig) (MigrationResult, error) {
	m, err := g.StartMigration(ctx, cfg)
	if err != nil {
		return MigrationResult{}, err
	}
	return m.Wait(ctx)
}

// StartMigration starts the destination QEMU and the migration to it, and
// returns once the source QEMU took the migrate command; Wait or Cancel
// must follow. One migration at a time (else ErrMigrationInFlight). On
// failure the guest runs on in the source and nothing of the destination
// stays behind. Lines written to the guest (WriteLine) while a migration
// switches over may be lost.
func (g *Guest) StartMigration(ctx context.Context, cfg MigrateConfig) (*Migration, error) {
	if err := g.checkMigrateConfig(cfg); err != nil {
		return nil, err
	}
	g.vmMu.Lock()
	select {
	case <-g.done:
		g.vmMu.Unlock()
		return nil, fmt.Errorf("guest %s: migrate: %w", g.name, errGuestClosed)
	default:
	}
	if g.mig != nil {
		g.vmMu.Unlock()
		return nil, fmt.Errorf("guest %s: %w", g.name, ErrMigrationInFlight)
	}
	src := g.vm
	// Claimed until the destination runs; a concurrent Close aborts it.
	m := &Migration{g: g, src: src, started: time.Now()}
	g.mig = m
	g.vmMu.Unlock()
	release := func() {
		g.vmMu.Lock()
		g.mig = nil
		g.vmMu.Unlock()
	}

	dcfg := g.qcfg
	dcfg.Devices = cfg.Devices
	dcfg.Incoming = true
	dcfg.QMPSocket, dcfg.SerialLog = "", ""
	dst, conn, dir, err := startQEMU(ctx, g.name, dcfg, g.log.WithField("migration", "destination"))
	if err != nil {
		release()
		return nil, fmt.Errorf("guest %s: migrate: destination: %w", g.name, err)
	}
	m.mu.Lock()
	if m.ended { // Close came meanwhile
		m.mu.Unlock()
		dst.Kill()
		conn.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("guest %s: migrate: %w", g.name, errGuestClosed)
	}
	m.dst, m.dstConn, m.dstDir = dst, conn, dir
	m.mu.Unlock()
	fail := func(err error) (*Migration, error) {
		m.abort()
		return nil, fmt.Errorf("guest %s: migrate: %w%s", g.name, err, stderrOf(dst))
	}
	uri := qemu.UnixURI(filepath.Join(dir, "migrate.sock"))
	if err := dst.MigrateIncoming(ctx, uri); err != nil {
		return fail(fmt.Errorf("destination: %w", err))
	}
	m.mu.Lock()
	if m.ended {
		m.mu.Unlock()
		return fail(errGuestClosed)
	}
	// From here the source's console ending is not the guest's until the
	// migration resolves (commit or abort).
	g.con.expect()
	m.mu.Unlock()
	if err := src.Migrate(ctx, uri, cfg.Params); err != nil {
		return fail(fmt.Errorf("source: %w", err))
	}
	g.log.WithFields(map[string]any{"source": src.PID(), "destination": dst.PID()}).Info("migration started")
	return m, nil
}

// checkMigrateConfig checks that cfg's devices match the guest's.
func (g *Guest) checkMigrateConfig(cfg MigrateConfig) error {
	src := g.qcfg.Devices
	if len(cfg.Devices) != len(src) {
		return configErr("MigrateConfig.Devices", fmt.Sprintf("%d devices, the guest has %d", len(cfg.Devices), len(src)))
	}
	for i, d := range cfg.Devices {
		s := src[i]
		if d.ID != s.ID || d.VirtioID != s.VirtioID || d.NumVQs != s.NumVQs || d.VQSize != s.VQSize || d.ConfigSize != s.ConfigSize {
			return configErr(fmt.Sprintf("MigrateConfig.Devices[%d]", i),
				fmt.Sprintf("device %q differs from the guest's %q in id, queues or config size", d.ID, s.ID))
		}
		if d.Socket == s.Socket {
			return configErr(fmt.Sprintf("MigrateConfig.Devices[%d].Socket", i), "the source device's socket: the destination needs a device of its own")
		}
	}
	return nil
}

// Info asks the source QEMU how the migration goes.
func (m *Migration) Info(ctx context.Context) (qemu.MigrationInfo, error) {
	return m.src.QueryMigrate(ctx)
}

// Wait waits until the migration is done. Completed, it waits for the
// destination to run, switches the Guest over to it and quits the source
// QEMU. Otherwise (failed, or ctx ended) it ends the migration: the
// destination is killed and the guest runs on in the source; the error
// holds QEMU's reason and what the destination QEMU said.
func (m *Migration) Wait(ctx context.Context) (MigrationResult, error) {
	info, err := m.src.WaitMigration(ctx)
	if err != nil {
		if ctx.Err() != nil && !info.Done() {
			// Leave no migration running behind an ended wait.
			cctx, cancel := context.WithTimeout(context.Background(), switchTimeout)
			m.src.CancelMigration(cctx)
			cancel()
		}
		m.abort()
		return MigrationResult{Info: info, Wall: time.Since(m.started)},
			fmt.Errorf("guest %s: migrate: %w%s", m.g.name, err, stderrOf(m.dst))
	}
	return m.commit(ctx, info)
}

// Cancel cancels the migration (migrate_cancel), waits until QEMU says
// it is cancelled, kills the destination and checks that the source runs
// again. A migration that completed first is committed as Wait would:
// the error is then ErrCancelTooLate and the guest runs in the
// destination.
func (m *Migration) Cancel(ctx context.Context) (MigrationResult, error) {
	info, err := m.src.CancelMigration(ctx)
	var me *qemu.MigrationError
	if errors.As(err, &me) && me.Status == qemu.MigrationCompleted {
		res, cerr := m.commit(ctx, info)
		if cerr != nil {
			return res, cerr
		}
		return res, fmt.Errorf("guest %s: %w", m.g.name, ErrCancelTooLate)
	}
	m.abort()
	res := MigrationResult{Info: info, Wall: time.Since(m.started)}
	if err != nil {
		return res, fmt.Errorf("guest %s: cancel migration: %w", m.g.name, err)
	}
	if err := m.src.WaitRunning(ctx); err != nil {
		return res, fmt.Errorf("guest %s: after the cancelled migration: %w", m.g.name, err)
	}
	return res, nil
}

// commit switches the guest over to the destination once QEMU reported
// the migration completed (see Wait).
func (m *Migration) commit(ctx context.Context, info qemu.MigrationInfo) (MigrationResult, error) {
	g := m.g
	sctx, cancel := context.WithTimeout(ctx, switchTimeout)
	defer cancel()
	if err := m.dst.WaitRunning(sctx); err != nil {
		m.abort()
		return MigrationResult{Info: info, Wall: time.Since(m.started)},
			fmt.Errorf("guest %s: migration completed, but the destination: %w%s", g.name, err, stderrOf(m.dst))
	}
	wall := time.Since(m.started)
	m.mu.Lock()
	if m.ended {
		m.mu.Unlock()
		return MigrationResult{Info: info, Wall: wall}, fmt.Errorf("guest %s: migrate: %w", g.name, errGuestClosed)
	}
	m.ended = true
	g.vmMu.Lock()
	old, oldDir := g.vm, g.dir
	g.vm, g.dir, g.mig = m.dst, m.dstDir, nil
	serial := g.oldSerial + old.Serial()
	if len(serial) > maxOldSerial {
		serial = serial[len(serial)-maxOldSerial:]
	}
	g.oldSerial = serial
	g.wmu.Lock()
	g.conn = m.dstConn
	g.wmu.Unlock()
	g.vmMu.Unlock()
	g.con.handover(m.dstConn)
	m.mu.Unlock()

	// The source is done ("postmigrate"): quitting it ends its console,
	// and the console reader goes on with the destination's.
	qctx, qcancel := context.WithTimeout(context.Background(), switchTimeout)
	err := old.Shutdown(qctx)
	qcancel()
	os.RemoveAll(oldDir)
	g.log.WithFields(map[string]any{"downtime_ms": info.Downtime.Milliseconds(), "pid": m.dst.PID()}).Info("migration completed")
	if err != nil {
		return MigrationResult{Info: info, Wall: wall}, fmt.Errorf("guest %s: quit the migration's source: %w", g.name, err)
	}
	return MigrationResult{Info: info, Wall: wall}, nil
}

// abort ends a migration that did not complete: it kills the destination
// and removes its directory, and the console's end is the source's again.
// Idempotent; a no-op after commit.
func (m *Migration) abort() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended {
		return
	}
	m.ended = true
	if m.dst != nil {
		m.dst.Kill()
		m.dstConn.Close()
		os.RemoveAll(m.dstDir)
	}
	m.g.con.abandon()
	m.g.vmMu.Lock()
	if m.g.mig == m {
		m.g.mig = nil
	}
	m.g.vmMu.Unlock()
}

// stderrOf is what the destination QEMU said, as an error suffix.
func stderrOf(vm *qemu.VM) string {
	if vm == nil {
		return ""
	}
	if s := vm.Stderr(); s != "" {
		return ": destination qemu said: " + truncate(s, 2000)
	}
	return ""
}
