package rdma

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/vrdma/vrdma/backend"
)

// Live migration (docs/state.md, "Through QEMU's device-state protocol"):
// the device is a backend.StateSaver. The source's session calls
// SaveState when QEMU stops the VM (every ring stopped) and asks for the
// state (SET_DEVICE_STATE_FD, save); the destination's calls LoadState
// with what QEMU carried over (load), after QEMU sent the guest memory
// table and before the rings start. The state is DeviceState, the same
// objects a live upgrade hands over, in a versioned document of its own.

// MigrationFormat and MigrationVersion head a migration document.
const (
	MigrationFormat  = "vrdma-device-state"
	MigrationVersion = 1
)

// MaxMigrationState bounds a migration document: backend.MaxDeviceState.
const MaxMigrationState = backend.MaxDeviceState

// ErrMigrationVersion is a migration document of a version this vrdmad
// cannot read.
var ErrMigrationVersion = errors.New("unknown device state version")

// MigrationState is the migration document.
type MigrationState struct {
	Format  string `json:"format"`  // MigrationFormat
	Version int    `json:"version"` // MigrationVersion
	// Device is the device's objects (ExportState).
	Device *DeviceState `json:"device"`
}

var _ backend.StateSaver = (*Device)(nil)

// SaveState implements backend.StateSaver: it writes the device's objects
// as a MigrationState. Precondition: every ring stopped (the session
// checks), so no engine pass of the device runs; a quiesce makes that so
// for a visit in progress and publishes the lazily published indices,
// and the device runs again afterwards — if the migration fails, the
// source's rings start again and it goes on. A device holding what cannot
// migrate fails with ErrNotTransferable (wrapped with what): host NIC
// devices, memory windows, ALLOC_MR MRs, multipath (spray) QPs
// (ExportState). A QP connected over plain RoCEv2 is carried with its
// transport's state when Suspend held it (the VM stopped while QEMU logs
// dirty pages: engine.RNIC.HoldNet); otherwise the save fails (a pause's
// suspension: its packets would go on changing it).
func (d *Device) SaveState(w io.Writer) error {
	if err := d.Quiesce(); err != nil {
		d.Unquiesce()
		return fmt.Errorf("rdma: save: %w", err)
	}
	st, err := d.ExportState()
	d.Unquiesce()
	if err != nil {
		return fmt.Errorf("rdma: save: %w", err)
	}
	b, err := json.Marshal(&MigrationState{Format: MigrationFormat, Version: MigrationVersion, Device: st})
	if err != nil {
		return fmt.Errorf("rdma: save: %w", err)
	}
	if len(b) > MaxMigrationState {
		return fmt.Errorf("rdma: save: %w: %d bytes of state, the bound is %d", ErrNotTransferable, len(b), MaxMigrationState)
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("rdma: save: %w", err)
	}
	return nil
}

// DecodeMigrationState reads a migration document from r (at most
// MaxMigrationState bytes) as hostile input: the format and version
// first and alone, then the whole document with unknown keys refused and
// nothing after it. ImportState checks the objects.
func DecodeMigrationState(r io.Reader) (*DeviceState, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxMigrationState+1))
	if err != nil {
		return nil, fmt.Errorf("device state: %w", err)
	}
	if len(data) > MaxMigrationState {
		return nil, fmt.Errorf("device state: more than %d bytes", MaxMigrationState)
	}
	var head struct {
		Format  string `json:"format"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("device state: malformed JSON: %w", err)
	}
	if head.Format != MigrationFormat {
		return nil, fmt.Errorf("device state: format %q, want %q", head.Format, MigrationFormat)
	}
	if head.Version != MigrationVersion {
		return nil, fmt.Errorf("%w: version %d; this vrdmad reads version %d", ErrMigrationVersion, head.Version, MigrationVersion)
	}
	var m MigrationState
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("device state: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("device state: trailing data after the JSON object")
	}
	if m.Device == nil {
		return nil, errors.New("device state: no device")
	}
	return m.Device, nil
}

// LoadState implements backend.StateSaver: it decodes a migration
// document (DecodeMigrationState), rebuilds the objects (ImportState:
// every one checked as the guest's command that made it, its pages pinned
// here) and resolves their same-host peers (FinishImport). The device
// must have no objects (a fresh destination) and a guest memory table
// (QEMU sends it before the state: vmm/qemu/patches/0004). Peers on this
// daemon that were connected to the source device are found again by
// their QPs' destination GID (the source's, which this device now holds:
// it has the source's UUID). On any error the device is left empty.
//
// An incoming device (Config.Incoming: the source runs on this vrdmad)
// takes the identity first (identity.go): the source's GIDs and QP
// numbers move to it, and the source is migrated out; a load that fails
// gives them back, and the source owns everything as before. Then the
// peers that were the source's are the device's, and the requests the
// source's fence held go on into this device.
func (d *Device) LoadState(r io.Reader) error {
	st, err := DecodeMigrationState(r)
	if err != nil {
		return fmt.Errorf("rdma: load: %w: %v", ErrInvalidState, err)
	}
	d.mu.Lock()
	c, err := d.claimForLoad()
	d.mu.Unlock()
	if err != nil {
		return fmt.Errorf("rdma: load: %w", err)
	}
	// undo gives back what claimForLoad took (nothing for a nil claim).
	undo := func() {
		d.mu.Lock()
		c.undo(d)
		d.mu.Unlock()
	}
	sameDaemon := c != nil && c.handoff != nil // the source runs on this daemon
	if sameDaemon {
		// The source holds its network QPs' connections (frozen,
		// claimed on the fabric and at their endpoints) until its
		// front-end goes.
		for i := range st.QPs {
			if n := st.QPs[i].State.Net; n != nil && !n.Closed {
				undo()
				return fmt.Errorf("rdma: load: %w: QP %#x is connected over the network: a migration between two "+
					"devices of one vrdmad does not carry it (migrate to another vrdmad)", ErrNotTransferable, st.QPs[i].Num)
			}
		}
	}
	if err := d.ImportState(st); err != nil {
		undo()
		return err
	}
	if err := FinishImport([]*Device{d}); err != nil {
		d.Reset()
		undo()
		return fmt.Errorf("rdma: load: %w", err)
	}
	if !sameDaemon {
		// The source ran on another daemon: a QP connected to a peer
		// that stayed there on that host's memory path has nothing to
		// reach it by here (a QP connected over RoCEv2 does: its
		// connection was restored). Refused (QEMU fails the migration
		// and the source runs on) rather than loaded into a QP that
		// would time out under the guest.
		if qs := d.eng.Unresolved(); len(qs) > 0 {
			d.Reset()
			undo()
			return fmt.Errorf("rdma: load: %w: QP %#x (and %d more) is connected to a peer that is not on this host: "+
				"a migration between daemons carries no same-host connection (connect such QPs from a network GID "+
				"to carry them over RoCEv2)", ErrNotTransferable, qs[0], len(qs)-1)
		}
	}
	d.mu.Lock()
	if c != nil {
		c.commit(d)
	} else {
		d.eng.RepointPeers()
	}
	d.mu.Unlock()
	if c != nil && d.cfg.OnMigratedIn != nil {
		d.cfg.OnMigratedIn()
	}
	return nil
}
