package tests

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// TestDaemonRestart: vrdmad dies and comes back while a driver is using
// the device; the front-end reconnects as QEMU does (reconnect-ms). The
// device tells the driver it lost its objects (DEVICE_FATAL on the event
// queue), old handles answer NOT_FOUND, and after a device reset the
// driver re-creates what it needs and works again.
func TestDaemonRestart(t *testing.T) {
	hygiene(t)
	sock := filepath.Join(t.TempDir(), "dev.sock")
	start := func() *daemon.Daemon {
		d := daemon.New(testLogger(t), daemon.Config{})
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: "dev0", Socket: sock}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d1 := start()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, sock, 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defer c.Close()
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf, _ := c.AllocBuffer(1 << 20)
	if _, err := pd.RegMR(buf, 0, 1<<20, abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}

	d1.Close() // the daemon dies: everything it held is released
	d2 := start()
	defer d2.Close()
	if err := f.Reconnect(ctx); err != nil {
		t.Fatalf("reconnect: %v", err)
	}
	ev, err := c.GetAsyncEvent(10 * time.Second)
	if err != nil {
		t.Fatalf("no event after the restart: %v", err)
	}
	if ev.Type != abi.EventDeviceFatal {
		t.Fatalf("event %+v, want DEVICE_FATAL (%d)", ev, abi.EventDeviceFatal)
	}
	err = pd.Dealloc()
	var ce *verbs.CommandError
	if !errors.As(err, &ce) || ce.Status != abi.StatusNotFound {
		t.Fatalf("old PD after the restart: %v, want NOT_FOUND", err)
	}
	// The driver resets the device and starts over.
	c.Close()
	c2, err := f.Reopen()
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	pd2, err := c2.AllocPD()
	if err != nil {
		t.Fatalf("after reset: %v", err)
	}
	if err := pd2.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if _, err := c2.GetAsyncEvent(100 * time.Millisecond); err == nil {
		t.Fatal("a second DEVICE_FATAL after the driver reset the device")
	}
}
