package frontend_test

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// serve runs a vrdma device with u on its own fabric (its own daemon) at
// a socket in dir.
func serve(t *testing.T, dir, name string, u uuid.UUID) *rdma.Device {
	t.Helper()
	d, err := rdma.New(rdma.Config{ID: name, UUID: u})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := backend.Listen(backend.Config{Socket: filepath.Join(dir, name+".sock"), Device: d})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ctx) }()
	t.Cleanup(func() { cancel(); srv.Close(); <-done; d.Close() })
	return d
}

// TestDeviceStateOverVhostUser: the Go front-end saves a device's state
// (a PD made by the driver) from one vrdmad's device through
// SET_DEVICE_STATE_FD and CHECK_DEVICE_STATE, and loads it into a device
// with the same UUID on another, after sending it the memory table, as
// QEMU's patched vhost-user-rdma does; a garbage state is refused there.
func TestDeviceStateOverVhostUser(t *testing.T) {
	dir := t.TempDir()
	u := uuid.New()
	src := serve(t, dir, "src", u)
	dst := serve(t, dir, "dst", u)
	ctx := context.Background()
	fs, err := frontend.Dial(ctx, frontend.Config{Socket: filepath.Join(dir, "src.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	if fs.ProtocolFeatures&(1<<19) == 0 {
		t.Fatalf("protocol features %#x without DEVICE_STATE", fs.ProtocolFeatures)
	}
	if err := fs.Start(abi.ControlQueue, abi.EventQueue, abi.FirstDoorbellQueue); err != nil {
		t.Fatal(err)
	}
	resp, err := fs.Exec(abi.ControlQueue, abi.Marshal(&abi.CmdHeader{Opcode: uint16(abi.CmdCreatePD)}), 64, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if st := abi.Status(binary.LittleEndian.Uint32(resp)); st != abi.StatusOK {
		t.Fatalf("CREATE_PD: %v", st)
	}
	if _, err := fs.SaveDeviceState(); err == nil {
		t.Fatal("a save with the rings running succeeded")
	}
	if _, err := fs.Stop(); err != nil {
		t.Fatal(err)
	}
	state, err := fs.SaveDeviceState()
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	fd, err := frontend.Dial(ctx, frontend.Config{Socket: filepath.Join(dir, "dst.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if err := fd.SetMemTable(); err != nil {
		t.Fatal(err)
	}
	if err := fd.LoadDeviceState([]byte(`{"format":"vrdma-device-state","version":2}`)); !errors.Is(err, frontend.ErrDeviceState) {
		t.Fatalf("load of a version 2 state: got %v, want ErrDeviceState", err)
	}
	if s := dst.Stats(); s.PDs != 0 {
		t.Fatalf("%d PDs after a refused load", s.PDs)
	}
	if err := fd.LoadDeviceState(state); err != nil {
		t.Fatalf("load: %v", err)
	}
	if got, want := dst.Stats().PDs, src.Stats().PDs; got != 1 || want != 1 {
		t.Fatalf("PDs: destination %d, source %d, want 1 and 1", got, want)
	}
}
