package guestresult

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
)

// Prefix starts a result line; a space and the JSON object follow.
const Prefix = "VRDMA-RESULT"

// Roles of the step programs.
const (
	RoleHotplug = "hotplug"
	RoleRestart = "restart"
)

// ErrNotObject means a payload is not one JSON object.
var ErrNotObject = errors.New("result is not a JSON object")

// Result is a result line as the host reads it: the keys vrdma-guest's
// server, client and selftest roles, vrdma-perf and perftest-jobs share.
// Keys a role does not use are zero.
type Result struct {
	Role       string  `json:"role"`
	Op         string  `json:"op"`
	Size       uint64  `json:"size"`
	Iters      int     `json:"iters"`
	GBytesPerS float64 `json:"gbytes_per_s"`
	Mops       float64 `json:"mops"`
	LatP50     float64 `json:"lat_us_p50"`
	LatP99     float64 `json:"lat_us_p99"`
	Verified   bool    `json:"verified"`
	// MaxGapMS is the longest time between two completions of a stream
	// (perftest.Result's max_gap_ms): its longest pause. Bytes is the
	// data it moved. Zero when the role does not report them.
	MaxGapMS float64 `json:"max_gap_ms"`
	Bytes    uint64  `json:"bytes"`
	// Raw is the JSON object exactly as the guest printed it, every key
	// included.
	Raw json.RawMessage `json:"-"`
}

// Line is r's line as the guest printed it (Prefix, a space, Raw),
// without the newline.
func (r Result) Line() string { return Prefix + " " + string(r.Raw) }

// Step is the key every report of a step program (hotplug, restart)
// starts with: which program, which round, which event.
type Step struct {
	Role  string `json:"role"`
	Round int    `json:"round"`
	Event string `json:"event"`
}

// Hotplug is one line of vrdma-guest hotplug. Per round, Event is in
// order "waiting" (rescanning starts), "usable" (the device probed),
// "attached" (its selftest passed), "detached" (it left the bus).
type Hotplug struct {
	Step // Role is RoleHotplug
	// Device is the device's PCI address.
	Device string `json:"device"`
	// ProbeS is the time from the round's first rescan to a successful
	// probe; AttachS to a passed selftest.
	ProbeS  float64 `json:"probe_s,omitempty"`
	AttachS float64 `json:"attach_s,omitempty"`
	// FoundS is the time from the first rescan until the device showed up.
	FoundS float64 `json:"found_s,omitempty"`
	// DetachS is the time from the guest first seeing the unplug request
	// (or, without one, from the end of the selftest) until the device was
	// gone.
	DetachS float64 `json:"detach_s,omitempty"`
	// Released says whether the guest powered the slot off itself.
	Released bool `json:"released,omitempty"`
}

// Restart is one line of vrdma-guest restart. Event is, in order:
// "ready" (round 0: objects created and traffic verified; the host may now
// restart vrdmad), then per round "device_fatal" (the event arrived),
// "not_found" (an old handle answered NOT_FOUND), "reset" (the device was
// closed: virtio-pci writes status 0 and waits to read 0 back before it
// releases the DMA memory; the next open resets and checks once more),
// "recovered" (initialised again, objects created again, traffic
// verified, no second DEVICE_FATAL).
type Restart struct {
	Step // Role is RoleRestart
	// Device is the device's PCI address.
	Device string `json:"device,omitempty"`
	// Status is the virtio device_status the driver read when the event
	// arrived (hex), when the transport can tell.
	Status string `json:"status,omitempty"`
	// Command and Answer name the old-handle command and its status.
	Command string `json:"command,omitempty"`
	Answer  string `json:"answer,omitempty"`
	// WaitS is how long the guest idled until DEVICE_FATAL; RecoverS the
	// time from DEVICE_FATAL to verified traffic.
	WaitS    float64  `json:"wait_s,omitempty"`
	RecoverS float64  `json:"recover_s,omitempty"`
	QPs      []uint32 `json:"qps,omitempty"`
	Verified bool     `json:"verified,omitempty"`
}

// Write prints v as one result line on w: Prefix, a space, v as compact
// JSON and a newline, in one Write (a console shared with other writers
// never splits it).
func Write(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("result: %w", err)
	}
	line := make([]byte, 0, len(Prefix)+len(b)+2)
	line = append(line, Prefix+" "...)
	line = append(line, b...)
	line = append(line, '\n')
	_, err = w.Write(line)
	return err
}

// Parse decodes the payload of a result line (the text after Prefix). It
// must be one JSON object; a known key of the wrong type is an error. On
// error the Result is zero.
func Parse(payload string) (Result, error) {
	var r Result
	b, err := decode(payload, &r)
	if err != nil {
		return Result{}, err
	}
	r.Raw = json.RawMessage(b)
	return r, nil
}

// Decode decodes the payload of a result line into v (a *Hotplug, a
// *Restart, ...) as Parse does: one JSON object, keys of the right type.
// *v is set to zero first (keys the payload lacks are zero), and left
// zero on error.
func Decode(payload string, v any) error {
	zero(v)
	if _, err := decode(payload, v); err != nil {
		zero(v)
		return err
	}
	return nil
}

// DecodeStep is how a harness follows a step program: it decodes payload,
// a result line's, and when it is a step of role (ok), checks that it is
// event of round and decodes it into v (nil: only the check). A result of
// another role is not an error (ok false): the step programs print probe
// and selftest results between their steps. A payload that does not
// decode, or a step of role other than the one wanted, is an error. v is
// touched only for the wanted step (and zero if that fails to decode).
func DecodeStep(payload, role, event string, round int, v any) (ok bool, err error) {
	var s Step
	if err := Decode(payload, &s); err != nil {
		return false, fmt.Errorf("result %q: %w", payload, err)
	}
	if s.Role != role {
		return false, nil
	}
	if s.Event != event || s.Round != round {
		return false, fmt.Errorf("got %s of round %d, want %s of round %d", s.Event, s.Round, event, round)
	}
	if v != nil {
		if err := Decode(payload, v); err != nil {
			return false, fmt.Errorf("result %q: %w", payload, err)
		}
	}
	return true, nil
}

// zero sets *v to its zero value when v is a non-nil pointer.
func zero(v any) {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv.Elem().SetZero()
	}
}

// decode checks that payload is one JSON object, decodes it into v and
// returns it trimmed.
func decode(payload string, v any) ([]byte, error) {
	b := bytes.TrimSpace([]byte(payload))
	if len(b) == 0 || b[0] != '{' || !json.Valid(b) {
		return nil, ErrNotObject
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, ErrNotObject
	}
	return b, nil
}
