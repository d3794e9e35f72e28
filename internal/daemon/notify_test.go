package daemon

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestNotifyUnreadSocket: a service manager that stops reading its notify
// socket costs a message, never the daemon: with the socket's queue full
// NotifyWithFDs gives up after notifyTimeout, and sends again once there
// is room.
func TestNotifyUnreadSocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	mgr, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mgr)
	if err := unix.Bind(mgr, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	sent := 0
	for ; sent < 100_000; sent++ { // bounded: the queue holds net.unix.max_dgram_qlen datagrams
		start := time.Now()
		err := NotifyWithFDs("STATUS=filling")
		if err == nil {
			continue
		}
		if !strings.Contains(err.Error(), "stayed full") {
			t.Fatalf("message %d: got %v, want the queue reported full", sent, err)
		}
		if took := time.Since(start); took < notifyTimeout || took > notifyTimeout+5*time.Second {
			t.Errorf("a full queue held the message %v, want about %v", took, notifyTimeout)
		}
		break
	}
	if sent == 0 || sent == 100_000 {
		t.Fatalf("%d messages sent before the queue was full", sent)
	}
	// The queue found full once, the next messages do not wait: a burst
	// (a stop with --fdstore: one per descriptor) costs one timeout.
	start := time.Now()
	for i := range 20 {
		if err := NotifyWithFDs("FDSTORE=1"); err == nil || !strings.Contains(err.Error(), "still full") {
			t.Fatalf("message %d after the stall: got %v, want it dropped at once", i, err)
		}
	}
	if took := time.Since(start); took > notifyTimeout {
		t.Errorf("20 messages to a stalled manager took %v", took)
	}
	buf := make([]byte, 64)
	if n, _, err := unix.Recvfrom(mgr, buf, 0); err != nil || string(buf[:n]) != "STATUS=filling" {
		t.Fatalf("the manager read %q, %v", buf[:n], err)
	}
	if err := NotifyWithFDs("READY=1"); err != nil {
		t.Fatalf("with room again: %v", err)
	}
	if notifyStalled.Load() {
		t.Fatal("a message got through and the stall is still recorded")
	}
}
