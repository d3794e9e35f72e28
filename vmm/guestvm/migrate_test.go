package guestvm

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vrdma/vrdma/vmm/qemu"
)

// unixPair is two connected unix sockets, as QEMU's console chardev and
// the harness are.
func unixPair(t *testing.T) (qemuEnd, hostEnd net.Conn) {
	t.Helper()
	dir := shortTempDir(t)
	ln, err := net.Listen("unix", dir+"/c.sock")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hostEnd, err = net.Dial("unix", dir+"/c.sock")
	if err != nil {
		t.Fatal(err)
	}
	qemuEnd, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qemuEnd.Close(); hostEnd.Close() })
	return qemuEnd, hostEnd
}

// TestConsoleStreamHandover: a line cut by the switch-over is whole in
// the log, the source's bytes come before the destination's (which
// waited in its socket), and the log ends with the destination's console.
func TestConsoleStreamHandover(t *testing.T) {
	srcQEMU, srcHost := unixPair(t)
	dstQEMU, dstHost := unixPair(t)
	l := newLineLog()
	s := newConsoleStream(srcHost)
	done := make(chan struct{})
	go func() { defer close(done); readLines(s, l) }()

	io.WriteString(srcQEMU, "VRDMA-INIT 6.1\nVRDMA-RES")
	s.expect()
	io.WriteString(dstQEMU, "ULT {\"role\":\"server\"}\n") // before the source quit
	s.handover(dstHost)
	srcQEMU.Close() // the source QEMU quits
	io.WriteString(dstQEMU, "VRDMA-EXIT 0\n")
	dstQEMU.Close()
	<-done
	want := []string{"VRDMA-INIT 6.1", `VRDMA-RESULT {"role":"server"}`, "VRDMA-EXIT 0"}
	if len(l.lines) != len(want) {
		t.Fatalf("got lines %q, want %q", l.lines, want)
	}
	for i := range want {
		if l.lines[i] != want[i] {
			t.Errorf("line %d: got %q, want %q", i, l.lines[i], want[i])
		}
	}
}

// TestConsoleStreamAbandon: while a migration is in flight the source's
// end is not the console's; once it is abandoned it is.
func TestConsoleStreamAbandon(t *testing.T) {
	srcQEMU, srcHost := unixPair(t)
	l := newLineLog()
	s := newConsoleStream(srcHost)
	done := make(chan struct{})
	go func() { defer close(done); readLines(s, l) }()
	s.expect()
	io.WriteString(srcQEMU, "VRDMA-EXIT 1\n")
	srcQEMU.Close()
	if _, _, err := l.next(context.Background(), nil, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		t.Fatal("the console ended while a migration was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	s.abandon()
	<-done
	if _, _, err := l.next(context.Background(), nil, 1); !errors.Is(err, errLogClosed) {
		t.Errorf("got %v, want the log closed", err)
	}
}

// TestConsoleStreamClose: close ends a Read that waits for a migration.
func TestConsoleStreamClose(t *testing.T) {
	srcQEMU, srcHost := unixPair(t)
	s := newConsoleStream(srcHost)
	s.expect()
	srcQEMU.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Read(make([]byte, 16))
		errc <- err
	}()
	s.close()
	if err := <-errc; err == nil {
		t.Error("Read after close: no error")
	}
}

func TestMigrateConfigChecked(t *testing.T) {
	dev := qemu.VhostUserDevice{ID: "migrant", Socket: "/run/a.sock", NumVQs: 3, VQSize: 256, ConfigSize: 96}
	g := &Guest{name: "g", qcfg: qemu.Config{Devices: []qemu.VhostUserDevice{dev}}, done: make(chan struct{})}
	other := dev
	other.Socket = "/run/b.sock"
	renamed := other
	renamed.ID = "x"
	resized := other
	resized.VQSize = 128
	for _, tc := range []struct {
		name string
		devs []qemu.VhostUserDevice
	}{
		{"none", nil}, {"two", []qemu.VhostUserDevice{other, other}}, {"same socket", []qemu.VhostUserDevice{dev}},
		{"other id", []qemu.VhostUserDevice{renamed}}, {"other queues", []qemu.VhostUserDevice{resized}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := g.StartMigration(context.Background(), MigrateConfig{Devices: tc.devs}); !errors.As(err, new(*ConfigError)) {
				t.Errorf("got %v, want a *ConfigError", err)
			}
		})
	}
	if err := g.checkMigrateConfig(MigrateConfig{Devices: []qemu.VhostUserDevice{other}}); err != nil {
		t.Errorf("a device of its own: %v", err)
	}
}

// shortTempDir is a directory whose socket paths fit sun_path (t.TempDir's
// may not).
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gvm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
