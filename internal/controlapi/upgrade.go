package controlapi

import (
	"context"
	"net/http"
	"time"
)

// PathUpgrade is POST /v1/daemon/upgrade: the running vrdmad hands every
// device over to a new vrdmad process (docs/state.md).
const PathUpgrade = "/v1/daemon/upgrade"

// UpgradeTimeout bounds the wait for an upgrade's answer: the new process
// starts, re-pins every registered page and maps every guest's memory
// before it answers, which takes longer than any other request.
const UpgradeTimeout = 2 * time.Minute

// UpgradeRequest is POST /v1/daemon/upgrade's body.
type UpgradeRequest struct {
	// Binary is the absolute path of the vrdmad to hand over to; empty:
	// the file at the running daemon's own path (the one a package
	// upgrade has just replaced).
	Binary string `json:"binary,omitempty"`
}

// UpgradeAnswer is the answer once the new process serves every device.
// The process that answers exits right after: the next request reaches
// the new one.
type UpgradeAnswer struct {
	// PID is the new vrdmad's process id; Binary the file it runs;
	// Version and Revision its build, as it reported them.
	PID      int    `json:"pid"`
	Binary   string `json:"binary"`
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	// Devices were handed over, Connected of them with a front-end (a
	// guest's state carried with it).
	Devices   int `json:"devices"`
	Connected int `json:"connected"`
	// PauseMS is how long the devices' data paths were stopped: from the
	// freeze in the old process to the new one serving.
	PauseMS float64 `json:"pause_ms"`
	// StateBytes is the size of the handover document.
	StateBytes int `json:"state_bytes"`
}

// Upgrade asks vrdmad to hand over to binary ("": its own path's file).
// ErrConflict: the new process refused to take over (the answer says why)
// or another upgrade runs; the old daemon goes on serving either way.
func (c *Client) Upgrade(ctx context.Context, binary string) (UpgradeAnswer, error) {
	var out UpgradeAnswer
	if err := c.do(ctx, http.MethodPost, PathUpgrade, UpgradeRequest{Binary: binary}, &out); err != nil {
		return UpgradeAnswer{}, err
	}
	return out, nil
}
