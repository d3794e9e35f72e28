package main

import (
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/internal/cli/clitest"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// TestMigrateCommandLine: streams the scenario cannot run are refused
// (exit 2, before anything is looked for); --help lists the flags.
func TestMigrateCommandLine(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing")
	clitest.Run(t, []clitest.Case{
		{Name: "across no-device", Args: []string{"migrate", "--across", "--no-device"}, Code: 2, Stderr: "--no-device and --across do not go together"},
		{Name: "op", Args: []string{"migrate", "--op", "atomic"}, Code: 2, Stderr: "want write or send"},
		{Name: "send size", Args: []string{"migrate", "--op", "send", "--size", "64"}, Code: 2, Stderr: "at least 128"},
		{Name: "after", Args: []string{"migrate", "--after", "10s", "--duration", "5s"}, Code: 2, Stderr: "shorter than --duration"},
		{Name: "no-device cancel", Args: []string{"migrate", "--no-device", "--cancel"}, Code: 2, Stderr: "do not go together"},
		{Name: "extra", Args: []string{"migrate", "now"}, Code: 2, Stderr: "unexpected arguments"},
		{Name: "help", Args: []string{"migrate", "--help"}, Stdout: "  --cancel\n"},
		{Name: "binaries looked for after the flags", Args: []string{"migrate", "--qemu", missing, "--vrdmad", missing}, Code: 1, Stderr: "vrdmad: stat " + missing},
	}, run)
}

func TestParseMigrate(t *testing.T) {
	m, err := parseMigrate(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if m.op != "write" || m.bandwidth != fastBandwidth || m.cancel || m.duration <= m.after {
		t.Errorf("defaults %+v", m)
	}
	m, err = parseMigrate([]string{"--cancel", "--op", "send", "--duration", "20s"}, io.Discard)
	if err != nil || m.bandwidth != cancelBandwidth || m.duration != 20*time.Second {
		t.Errorf("--cancel: %+v, %v; want the slow bandwidth", m, err)
	}
	want := []string{"--op", "send", "--size", "4096", "--iters", "1", "--lat-iters", "100", "--duration", "20s"}
	if got := m.args(); len(got) != len(want) {
		t.Errorf("args %q, want %q", got, want)
	} else {
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("args %q, want %q", got, want)
				break
			}
		}
	}
}

func TestMigrateResultOK(t *testing.T) {
	for _, tc := range []struct {
		mf   migrateFlags
		l    migrateLine
		want bool
	}{
		{migrateFlags{}, migrateLine{Verified: true, Status: qemu.MigrationCompleted}, true},
		{migrateFlags{}, migrateLine{Verified: false, Status: qemu.MigrationCompleted}, false},
		{migrateFlags{}, migrateLine{Verified: true, Status: qemu.MigrationCancelled}, false},
		{migrateFlags{cancel: true}, migrateLine{Verified: true, Status: qemu.MigrationCancelled}, true},
		{migrateFlags{cancel: true}, migrateLine{Verified: true, Status: qemu.MigrationCompleted}, false},
		{migrateFlags{noDevice: true}, migrateLine{Status: qemu.MigrationCompleted}, true},
		{migrateFlags{noDevice: true}, migrateLine{Status: qemu.MigrationCompleted, Error: "x"}, false},
	} {
		if got := migrateResultOK(tc.mf, tc.l); got != tc.want {
			t.Errorf("%+v %+v: got %v, want %v", tc.mf, tc.l, got, tc.want)
		}
	}
}
