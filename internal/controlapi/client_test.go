package controlapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
)

// shortDir is a directory for unix sockets: sun_path holds 107 bytes and
// t.TempDir is long.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ctlapi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startDaemon serves the real control API on a socket in a short
// directory and returns the socket's path.
func startDaemon(t *testing.T) string {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	control := filepath.Join(shortDir(t), "control.sock")
	if err := d.ServeControl(control); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return control
}

// serve serves h on a unix socket and returns its path.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	path := filepath.Join(shortDir(t), "api.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return path
}

// TestClient runs every operation against the daemon's own handler.
func TestClient(t *testing.T) {
	control := startDaemon(t)
	c := controlapi.New(control)
	ctx := context.Background()
	if c.Socket() != control {
		t.Errorf("Socket() = %q, want %q", c.Socket(), control)
	}

	devs, err := c.Devices(ctx)
	if err != nil || devs == nil || len(devs) != 0 {
		t.Fatalf("Devices on an empty daemon: got %#v, %v; want an empty list", devs, err)
	}
	sock := filepath.Join(filepath.Dir(control), "vm1.sock")
	info, err := c.AddDevice(ctx, controlapi.AddRequest{ID: "vm1", Socket: sock, GUID: "0211:2233:4455:6677",
		Limits: &controlapi.Limits{MaxQPs: 32}})
	if err != nil {
		t.Fatal(err)
	}
	if info.ID != "vm1" || info.Socket != sock || info.GUID != "0211:2233:4455:6677" || info.Limits.MaxQPs != 32 {
		t.Errorf("AddDevice: got %+v", info)
	}
	if got, err := c.Device(ctx, "vm1"); err != nil || got.UUID != info.UUID {
		t.Errorf("Device: got %+v, %v; want %+v", got, err, info)
	}
	if devs, err := c.Devices(ctx); err != nil || len(devs) != 1 || devs[0].ID != "vm1" {
		t.Errorf("Devices: got %+v, %v; want vm1", devs, err)
	}
	if h, err := c.Health(ctx); err != nil || h.Status != "ok" || h.Devices != 1 || h.PinnedBytes != 0 || h.EngineThreads < 1 {
		t.Errorf("Health: got %+v, %v; want ok with 1 device and at least one engine thread", h, err)
	}

	// SetShare sends only the fields it is given.
	w, ops := uint32(3), uint64(500)
	if info, err := c.SetShare(ctx, "vm1", controlapi.SharePatch{Weight: &w, MaxOpsPerSec: &ops}); err != nil ||
		info.ID != "vm1" || info.Share != (controlapi.Share{Weight: 3, MaxOpsPerSec: 500}) {
		t.Errorf("SetShare: got %+v, %v; want vm1 with weight 3, 500 ops/s", info, err)
	}
	bytes := uint64(1 << 30)
	if info, err := c.SetShare(ctx, "vm1", controlapi.SharePatch{MaxBytesPerSec: &bytes}); err != nil ||
		info.Share != (controlapi.Share{Weight: 3, MaxBytesPerSec: 1 << 30, MaxOpsPerSec: 500}) {
		t.Errorf("SetShare of one field: got %+v, %v; want the others kept", info.Share, err)
	}
	if got, err := c.Device(ctx, "vm1"); err != nil || got.Share.Weight != 3 {
		t.Errorf("Device after SetShare: got %+v, %v", got.Share, err)
	}

	t.Run("errors", func(t *testing.T) {
		tests := []struct {
			name    string
			call    func() error
			want    error
			code    int
			message string
		}{
			{"unknown id", func() error { _, err := c.Device(ctx, "nope"); return err }, controlapi.ErrNotFound, 404, "no such device: nope"},
			{"remove unknown id", func() error { _, err := c.RemoveDevice(ctx, "nope"); return err }, controlapi.ErrNotFound, 404, "no such device: nope"},
			{"duplicate id", func() error {
				_, err := c.AddDevice(ctx, controlapi.AddRequest{ID: "vm1", Socket: sock + "2"})
				return err
			}, controlapi.ErrConflict, 409, "device exists"},
			{"bad id", func() error {
				_, err := c.AddDevice(ctx, controlapi.AddRequest{ID: "1x", Socket: sock + "3"})
				return err
			}, controlapi.ErrBadRequest, 400, "start with a letter"},
			{"set share of unknown id", func() error {
				_, err := c.SetShare(ctx, "nope", controlapi.SharePatch{Weight: &w})
				return err
			}, controlapi.ErrNotFound, 404, "no such device: nope"},
			{"bad weight", func() error {
				big := uint32(1001)
				_, err := c.SetShare(ctx, "vm1", controlapi.SharePatch{Weight: &big})
				return err
			}, controlapi.ErrBadRequest, 400, "share.weight"},
			{"bad share at creation", func() error {
				_, err := c.AddDevice(ctx, controlapi.AddRequest{ID: "vm9", Socket: sock + "9", Share: &controlapi.Share{MaxBytesPerSec: 1}})
				return err
			}, controlapi.ErrBadRequest, 400, "share.max_bytes_per_s"},
			// Escaped: "vm1?x" is not vm1 with a query, "vm1/../vm1" not vm1.
			{"query in id", func() error { _, err := c.RemoveDevice(ctx, "vm1?x"); return err }, controlapi.ErrNotFound, 404, "no such device: vm1?x"},
			{"slashes in id", func() error { _, err := c.Device(ctx, "vm1/../vm1"); return err }, controlapi.ErrNotFound, 404, "no such device: vm1/../vm1"},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				err := tt.call()
				var se *controlapi.StatusError
				if !errors.As(err, &se) || !errors.Is(err, tt.want) {
					t.Fatalf("got %v, want a *StatusError matching %v", err, tt.want)
				}
				if se.Code != tt.code || !strings.Contains(se.Message, tt.message) {
					t.Errorf("got %d %q, want %d and a message with %q", se.Code, se.Message, tt.code, tt.message)
				}
				if want := se.Method + " " + se.Path + ": " + se.Status + ": " + se.Message; err.Error() != want {
					t.Errorf("got message %q, want %q", err, want)
				}
				for _, other := range []error{controlapi.ErrNotFound, controlapi.ErrConflict, controlapi.ErrBadRequest, controlapi.ErrUnreachable} {
					if other != tt.want && errors.Is(err, other) {
						t.Errorf("%v also matches %v", err, other)
					}
				}
			})
		}
	})

	if res, err := c.RemoveDevice(ctx, "vm1"); err != nil || res != (controlapi.Removed{ID: "vm1", Removed: true}) {
		t.Fatalf("RemoveDevice: got %+v, %v", res, err)
	}
	if _, err := c.Device(ctx, "vm1"); !errors.Is(err, controlapi.ErrNotFound) {
		t.Errorf("Device after RemoveDevice: got %v, want ErrNotFound", err)
	}
	c.CloseIdleConnections()
}

func TestUnreachable(t *testing.T) {
	missing := filepath.Join(shortDir(t), "nobody.sock")
	// A socket that accepts and never answers.
	silent := filepath.Join(shortDir(t), "silent.sock")
	ln, err := net.Listen("unix", silent)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for _, tt := range []struct {
		name, socket string
	}{{"no socket", missing}, {"no answer", silent}} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := controlapi.New(tt.socket, controlapi.WithTimeout(100*time.Millisecond)).Devices(context.Background())
			var ue *controlapi.UnreachableError
			if !errors.As(err, &ue) || !errors.Is(err, controlapi.ErrUnreachable) || ue.Socket != tt.socket {
				t.Fatalf("got %v, want an *UnreachableError for %s", err, tt.socket)
			}
			if !strings.HasPrefix(err.Error(), "control API at "+tt.socket+": ") {
				t.Errorf("got message %q, want it to name the socket", err)
			}
		})
	}
}

// TestAnswers checks answers the daemon does not give: an error that is
// not JSON, and a 2xx answer that does not decode.
func TestAnswers(t *testing.T) {
	path := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case controlapi.PathHealth:
			io.WriteString(w, "not JSON")
		default:
			http.Error(w, "gateway says no", http.StatusBadGateway)
		}
	}))
	c := controlapi.New(path)
	_, err := c.Devices(context.Background())
	var se *controlapi.StatusError
	if !errors.As(err, &se) || se.Code != http.StatusBadGateway || se.Message != "gateway says no" {
		t.Errorf("got %v, want a 502 with the body's text", err)
	}
	if h, err := c.Health(context.Background()); err == nil || errors.As(err, &se) || !reflect.DeepEqual(h, controlapi.Health{}) {
		t.Errorf("got %+v, %v; want a decode error and a zero Health", h, err)
	}
}

// TestWireFormat checks that the answers that were maps read as they did:
// their fields are in key order.
func TestWireFormat(t *testing.T) {
	for _, tt := range []struct {
		typed any
		asMap any
	}{
		{controlapi.Removed{ID: "vm1", Removed: true}, map[string]any{"id": "vm1", "removed": true}},
		{controlapi.Removed{ID: "vm1", Removed: true, StillListed: true, Warning: "w"}, map[string]any{"id": "vm1", "removed": true, "still_listed": true, "warning": "w"}},
		{controlapi.Health{Status: "ok", Devices: 2, EngineThreads: 4, PinnedBytes: 1 << 21, Problems: []controlapi.Problem{},
			Revision: "abc", Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), UptimeSeconds: 7, Version: "1.2"},
			map[string]any{"status": "ok", "devices": 2, "engine_threads": 4, "pinned_bytes": 1 << 21, "problems": []any{},
				"revision": "abc", "started": "2026-01-02T03:04:05Z", "uptime_seconds": 7, "version": "1.2"}},
		// A field set to 0 is sent (weight 0 means 1), an absent one is not.
		{controlapi.PatchRequest{Share: &controlapi.SharePatch{Weight: new(uint32)}}, map[string]any{"share": map[string]int{"weight": 0}}},
		{controlapi.ErrorAnswer{Error: "no such device: x"}, map[string]string{"error": "no such device: x"}},
	} {
		a, _ := json.Marshal(tt.typed)
		b, _ := json.Marshal(tt.asMap)
		if string(a) != string(b) {
			t.Errorf("got %s, want %s", a, b)
		}
	}
	if got, want := controlapi.DevicePath("vm1"), "/v1/devices/vm1"; got != want {
		t.Errorf("DevicePath: got %q, want %q", got, want)
	}
}
