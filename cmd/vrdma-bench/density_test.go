package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/daemon"
)

// TestDensity runs the density measurement at 200 devices, from two
// front-end processes, and checks what it found, not how fast: every
// device answers its control queue, the daemon holds no more descriptors
// per device than backend/doc.go's breakdown counts, gives all of them
// back when the front-ends go, and exits cleanly.
func TestDensity(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		if _, err := os.Stat(filepath.Join(runtime.GOROOT(), "bin", "go")); err != nil {
			t.Skip("no go tool to build vrdmad with")
		}
	}
	const n = 200
	bin, err := buildVrdmad(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg := densityConfig{vrdmad: bin, self: self, perProc: n / 2, idle: 100 * time.Millisecond,
		settle: 100 * time.Millisecond, progress: t.Logf}

	base, err := measureEmpty(cfg)
	if err != nil {
		t.Fatalf("empty vrdmad: %v", err)
	}
	if base.stopErr != nil {
		t.Errorf("empty vrdmad did not exit cleanly: %v", base.stopErr)
	}
	r, err := measureDensity(cfg, n)
	if err != nil {
		t.Fatalf("measure %d devices: %v", n, err)
	}
	t.Logf("\n%s", densityTable(base, []densityRun{r}))
	if r.procs != 2 {
		t.Errorf("front-end processes: got %d, want 2", r.procs)
	}
	if r.connected != n || r.answered != n || r.firstErr != "" {
		t.Errorf("got %d connected and %d answering QUERY_DEVICE, want %d each (first failure: %q)",
			r.connected, r.answered, n, r.firstErr)
	}
	if got, want := r.fdsListen-base.fds, densityListenFds*n; got > want {
		t.Errorf("%d listening devices: got %d more daemon fds than the empty daemon, want at most %d", n, got, want)
	}
	if got, want := r.fdsConn-r.fdsListen, (densityDeviceFds-densityListenFds)*n; got > want {
		t.Errorf("%d connections: got %d more daemon fds, want at most %d (%d per device)",
			n, got, want, densityDeviceFds-densityListenFds)
	}
	if r.leakErr != nil {
		t.Errorf("fd leak after disconnect: %v", r.leakErr)
	}
	if r.fdsAfter > r.fdsListen {
		t.Errorf("after disconnect: got %d daemon fds, want at most %d (as before the front-ends came)", r.fdsAfter, r.fdsListen)
	}
	if r.stopErr != nil {
		t.Errorf("vrdmad did not exit cleanly after the front-ends left: %v", r.stopErr)
	}
	if t.Failed() {
		t.Logf("vrdmad log:\n%s", r.vrdmadLog)
	}
}

func TestDensityFit(t *testing.T) {
	tests := []struct {
		n     int
		limit uint64
		want  bool
	}{
		{1000, 20000, true},
		{1811, 20000, true},
		{1812, 20000, false},
		{10000, 20000, false},
		{10000, 1 << 20, true},
	}
	for _, tt := range tests {
		if got := fitsFds(tt.n, 11, 11, tt.limit); got != tt.want {
			t.Errorf("fitsFds(%d, limit %d): got %v, want %v", tt.n, tt.limit, got, tt.want)
		}
	}
	if got := largestFit(11, 11, 20000); got != 1811 {
		t.Errorf("largestFit(limit 20000): got %d, want 1811", got)
	}
	if got := largestFit(11, 11, 1<<20); got != daemon.MaxDevices {
		t.Errorf("largestFit(limit 1<<20): got %d, want daemon.MaxDevices (%d)", got, daemon.MaxDevices)
	}
}

func TestParseCounts(t *testing.T) {
	got, err := parseCounts("1000, 200,1000,,5")
	if err != nil || len(got) != 3 || got[0] != 5 || got[1] != 200 || got[2] != 1000 {
		t.Errorf("got %v, %v; want [5 200 1000]", got, err)
	}
	for _, bad := range []string{"0", "-3", "x", "10,y"} {
		if _, err := parseCounts(bad); err == nil {
			t.Errorf("parseCounts(%q): got no error", bad)
		}
	}
}
