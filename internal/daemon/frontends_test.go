package daemon

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/vrdma/vrdma/vmm/frontend"
)

// TestSecondFrontendRefused connects two real virtio-user front-ends to
// one device: the first is served; the second gets frontend.ErrRefused,
// whose message says why, not a bare reset; the device shows the first as
// its peer and counts the refusal; the refusal is logged at warn level
// with both front-ends' pids.
func TestSecondFrontendRefused(t *testing.T) {
	l, hook := test.NewNullLogger()
	d := New(logrus.NewEntry(l), Config{})
	t.Cleanup(func() { d.Close() })
	h := d.Handler()
	sock := filepath.Join(t.TempDir(), "one.sock")
	if code, out := call(t, h, "POST", "/v1/devices", addBody("one", sock, "")); code != http.StatusCreated {
		t.Fatalf("POST: got %d %v", code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, first, err := frontend.OpenRDMA(ctx, sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	defer c.Close()

	second, err := frontend.Dial(ctx, frontend.Config{Socket: sock})
	if err == nil {
		second.Close()
		t.Fatal("second front-end served while the first is connected")
	}
	if !errors.Is(err, frontend.ErrRefused) || !strings.Contains(err.Error(), "connected to another front-end") {
		t.Errorf("second front-end: got %v, want ErrRefused saying the device is connected to another front-end", err)
	}
	// The first goes on working.
	if _, err := c.AllocPD(); err != nil {
		t.Errorf("first front-end after the refusal: %v", err)
	}

	code, out := call(t, h, "GET", "/v1/devices/one", "")
	peer, _ := out["peer"].(map[string]any)
	if code != http.StatusOK || out["connected"] != true || peer == nil {
		t.Fatalf("GET: %d connected=%v peer=%v, want the first front-end as peer", code, out["connected"], out["peer"])
	}
	if peer["pid"] != float64(os.Getpid()) || peer["uid"] != float64(os.Getuid()) {
		t.Errorf("peer %v, want pid %d uid %d (this process)", peer, os.Getpid(), os.Getuid())
	}
	if since, err := time.Parse(time.RFC3339, peer["connected_since"].(string)); err != nil || time.Since(since) > time.Minute {
		t.Errorf("connected_since %v (%v), want about now", peer["connected_since"], err)
	}
	if out["refused_front_ends"] != float64(1) {
		t.Errorf("refused_front_ends %v, want 1", out["refused_front_ends"])
	}
	var warned bool
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && strings.Contains(e.Message, "refused a second front-end") &&
			e.Data["holder_pid"] == int32(os.Getpid()) && e.Data["pid"] == int32(os.Getpid()) {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning naming both front-ends' pids; log: %v", hook.AllEntries())
	}

	// Once the first leaves, a new one is served and the peer is gone
	// while none is connected.
	c.Close()
	first.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, out = call(t, h, "GET", "/v1/devices/one", "")
		if out["connected"] == false {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still connected after the first front-end closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, ok := out["peer"]; ok {
		t.Errorf("peer %v while nothing is connected, want none", out["peer"])
	}
	third, err := frontend.Dial(ctx, frontend.Config{Socket: sock})
	if err != nil {
		t.Fatalf("front-end after the first left: %v", err)
	}
	third.Close()
}
