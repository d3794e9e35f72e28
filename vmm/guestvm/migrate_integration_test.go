package guestvm

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/vmm/qemu"
)

// TestMigrateNoDevice live-migrates a real guest without a vrdma device
// twice: first slowed down and cancelled halfway (the guest runs on in its
// QEMU), then to completion: the Guest switches to the destination QEMU,
// the source QEMU and its directory are gone, and the program's last lines
// (its timeout, VRDMA-EXIT) come from the destination through the same
// console log.
func TestMigrateNoDevice(t *testing.T) {
	qemuBin, kernel, initrd := image(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// hotplug waits for a device that never comes, then fails: the guest
	// lives long enough for both migrations and ends by itself.
	g, err := Boot(ctx, Config{Name: "mig", QEMU: qemuBin, Kernel: kernel, Initrd: initrd, Run: "hotplug",
		Args: []string{"--timeout", "25s"}, MemoryMiB: 256, HugePages: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if !g.waitFor(KindResult) { // hotplug's "waiting": the program runs
		t.Fatalf("no result line\n%s", g.Log())
	}
	src := g.VM()
	srcDir := g.dir

	m, err := g.StartMigration(ctx, MigrateConfig{Params: qemu.MigrationParams{MaxBandwidth: 4 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		info, err := m.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.Status == qemu.MigrationActive && info.RAM.Transferred > 0 {
			break
		}
		if info.Done() {
			t.Fatalf("migration %s before the cancel", info.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := m.Cancel(ctx)
	if err != nil || res.Info.Status != qemu.MigrationCancelled {
		t.Fatalf("cancel: got %+v, %v\n%s", res, err, g.Log())
	}
	if g.VM() != src {
		t.Fatal("a cancelled migration moved the guest")
	}
	if st, err := src.Status(ctx); err != nil || !st.Running {
		t.Fatalf("source after cancel: %+v, %v", st, err)
	}

	// QEMU keeps the slow bandwidth of the first try: lift it.
	res, err = g.Migrate(ctx, MigrateConfig{Params: qemu.MigrationParams{MaxBandwidth: 1 << 30}})
	if err != nil {
		t.Fatalf("migrate: %v\n%s", err, g.Log())
	}
	if res.Info.Status != qemu.MigrationCompleted || res.Info.Downtime <= 0 || res.Info.RAM.Transferred == 0 {
		t.Errorf("got %+v, want completed with a downtime and RAM sent", res.Info)
	}
	t.Logf("downtime %v, total %v, %d bytes of RAM", res.Info.Downtime, res.Info.TotalTime, res.Info.RAM.Transferred)
	dst := g.VM()
	if dst == src || dst.PID() == src.PID() {
		t.Fatal("the guest still runs in the source QEMU")
	}
	select {
	case <-src.Exited():
	default:
		t.Error("the source QEMU runs after the migration")
	}
	if _, err := os.Stat(srcDir); !os.IsNotExist(err) {
		t.Errorf("source directory %s still there (%v)", srcDir, err)
	}
	if _, err := g.StartMigration(ctx, MigrateConfig{Devices: []qemu.VhostUserDevice{{ID: "x", Socket: "/s"}}}); !errors.As(err, new(*ConfigError)) {
		t.Errorf("a device the guest lacks: got %v, want a *ConfigError", err)
	}

	// The program times out in the destination; its lines follow.
	_, err = g.WaitResult(ctx)
	var ge *GuestError
	if !errors.As(err, &ge) || ge.ExitCode != 1 {
		t.Fatalf("got %v, want the program's failure (exit 1) from the destination\n%s", err, g.Log())
	}
	if n := strings.Count(g.Console(), PrefixInit); n != 1 {
		t.Errorf("console shows %d VRDMA-INIT lines, want 1 (one boot)", n)
	}
	dstDir := g.dir
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dstDir); !os.IsNotExist(err) {
		t.Errorf("destination directory %s still there after Close (%v)", dstDir, err)
	}
}
