package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma/sched"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

const cmdTimeout = 5 * time.Second

// hygiene records fds and goroutines and checks, at cleanup, that the test
// gave back everything it took.
func hygiene(t *testing.T) {
	t.Helper()
	sched.Default() // the process-wide engine pool lives as long as the process
	fds, gs, maps, lck := countFds(t), runtime.NumGoroutine(), guestMaps(t), lockedKB(t)
	t.Cleanup(func() {
		deadline := time.Now().Add(5 * time.Second)
		for {
			nf, ng, nm, nl := countFds(t), runtime.NumGoroutine(), guestMaps(t), lockedKB(t)
			if nf <= fds && ng <= gs && nm <= maps && nl <= lck {
				return
			}
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("leak: fds %d -> %d, goroutines %d -> %d, guest-memory mappings %d -> %d, locked (pinned) kB %d -> %d\n%s\n%s",
					fds, nf, gs, ng, maps, nm, lck, nl, listFds(), buf)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// lockedKB is this process's locked memory (VmLck, kB): what the
// in-process daemons pinned, map caches included.
func lockedKB(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		var kb int
		if n, _ := fmt.Sscanf(l, "VmLck: %d kB", &kb); n == 1 {
			return kb
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return 0
}

// guestMaps counts this process's mappings of memfd files: guest memory,
// as the in-process daemon and the Go front-ends map it.
func guestMaps(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "/memfd:")
}

func countFds(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func listFds() string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		out = append(out, e.Name()+"->"+l)
	}
	return strings.Join(out, " ")
}

func testLogger(t *testing.T) *logrus.Entry {
	l := logrus.New()
	l.SetOutput(testWriter{t})
	l.SetLevel(logrus.WarnLevel)
	if os.Getenv("VRDMA_TEST_DEBUG") != "" {
		l.SetLevel(logrus.DebugLevel)
	}
	return logrus.NewEntry(l)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startDaemon runs an in-process daemon with n devices and returns their
// socket paths.
func startDaemon(t *testing.T, n int) (*daemon.Daemon, []string) {
	t.Helper()
	dir := t.TempDir()
	d := daemon.New(testLogger(t), daemon.Config{})
	var socks []string
	for i := range n {
		s := filepath.Join(dir, "dev"+string(rune('0'+i))+".sock")
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: "dev" + string(rune('0'+i)), Socket: s}); err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
	}
	t.Cleanup(func() { d.Close() })
	return d, socks
}

func dial(t *testing.T, sock string, cfg frontend.Config) *frontend.Frontend {
	t.Helper()
	cfg.Socket = sock
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f, err := frontend.Dial(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// queryDevice runs QUERY_DEVICE on the control queue.
func queryDevice(f *frontend.Frontend) (abi.DeviceAttr, abi.Status, error) {
	req := abi.Marshal(&abi.CmdHeader{Opcode: uint16(abi.CmdQueryDevice)})
	resp, err := f.Exec(abi.ControlQueue, req, abi.RespHeaderSize+abi.DeviceAttrSize, cmdTimeout)
	var attr abi.DeviceAttr
	if err != nil {
		return attr, 0, err
	}
	if len(resp) < abi.RespHeaderSize {
		return attr, 0, errShort
	}
	st := abi.Status(binary.LittleEndian.Uint32(resp))
	if st != abi.StatusOK {
		return attr, st, nil
	}
	err = abi.Unmarshal(resp[abi.RespHeaderSize:], &attr)
	return attr, st, err
}

var errShort = shortErr{}

type shortErr struct{}

func (shortErr) Error() string { return "response shorter than its header" }
