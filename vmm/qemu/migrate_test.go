package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// completedReply is query-migrate's answer after a migration completed,
// as QEMU 10.0 writes it (trimmed).
const completedReply = `{"status":"completed","setup-time":2,"downtime":342,"total-time":3038,
 "ram":{"transferred":88389292,"remaining":0,"total":268967936,"duplicate":44000,"normal":21000,
        "normal-bytes":86016000,"mbps":232.5,"dirty-sync-count":4,"pages-per-second":7000}}`

func TestDecodeMigrationInfo(t *testing.T) {
	info, err := decodeMigrationInfo(json.RawMessage(completedReply))
	if err != nil {
		t.Fatal(err)
	}
	want := MigrationInfo{Status: MigrationCompleted, SetupTime: 2 * time.Millisecond, Downtime: 342 * time.Millisecond,
		TotalTime: 3038 * time.Millisecond, RAM: MigrationRAM{Transferred: 88389292, Total: 268967936, Mbps: 232.5, DirtySyncCount: 4}}
	if info != want {
		t.Errorf("got %+v, want %+v", info, want)
	}
	if !info.Done() {
		t.Error("a completed migration is not Done")
	}
	if info, err := decodeMigrationInfo(json.RawMessage(`{}`)); err != nil || info.Status != MigrationNone || info.Done() {
		t.Errorf("empty reply: got %+v, %v; want status none, not done", info, err)
	}
	for _, bad := range []string{`[]`, `{"status":"bogus"}`, `{"status":"active","downtime":-1}`,
		`{"status":"active","ram":{"transferred":-5}}`, `{"status":"active","total-time":1e30}`, `{"status":1}`} {
		if info, err := decodeMigrationInfo(json.RawMessage(bad)); err == nil || info != (MigrationInfo{}) {
			t.Errorf("%s: got %+v, %v; want an error and zero", bad, info, err)
		}
	}
}

// scriptedMigration answers query-migrate with replies in turn (the last
// one for ever after) and records every command.
func scriptedMigration(replies ...string) *fakeMonitor {
	var mu sync.Mutex
	i := 0
	return &fakeMonitor{handle: func(execute string, args map[string]any) (any, error) {
		switch execute {
		case "query-migrate":
			mu.Lock()
			defer mu.Unlock()
			r := replies[min(i, len(replies)-1)]
			i++
			return json.RawMessage(r), nil
		case "query-status":
			return map[string]any{"running": true, "status": "running"}, nil
		}
		return map[string]any{}, nil
	}}
}

func TestWaitMigrationQMP(t *testing.T) {
	ctx := context.Background()
	mon := scriptedMigration(`{"status":"setup"}`, `{"status":"active","ram":{"transferred":10,"total":100}}`, completedReply)
	info, err := WaitMigrationQMP(ctx, mon)
	if err != nil || info.Status != MigrationCompleted || info.Downtime != 342*time.Millisecond {
		t.Fatalf("got %+v, %v; want completed with 342 ms of downtime", info, err)
	}
	if got := mon.executed(); !slices.Equal(got, []string{"query-migrate", "query-migrate", "query-migrate"}) {
		t.Errorf("commands %q, want query-migrate until completed", got)
	}

	mon = scriptedMigration(`{"status":"active"}`, `{"status":"failed","error-desc":"Unable to write to socket"}`)
	info, err = WaitMigrationQMP(ctx, mon)
	var me *MigrationError
	if !errors.Is(err, ErrMigration) || !errors.As(err, &me) || me.Status != MigrationFailed || me.Desc != "Unable to write to socket" {
		t.Fatalf("got %+v, %v; want a *MigrationError failed with QEMU's reason", info, err)
	}

	// No migration started: an error, not a wait for ever.
	if _, err := WaitMigrationQMP(ctx, scriptedMigration(`{}`)); !errors.Is(err, ErrMigration) {
		t.Errorf("status none: got %v, want ErrMigration", err)
	}

	// A migration that never ends: ctx bounds the wait.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	info, err = WaitMigrationQMP(cctx, scriptedMigration(`{"status":"active"}`))
	if !errors.Is(err, context.DeadlineExceeded) || info.Status != MigrationActive {
		t.Errorf("got %+v, %v; want the deadline and the last status", info, err)
	}
}

func TestMigrateQMP(t *testing.T) {
	ctx := context.Background()
	mon := scriptedMigration(`{}`)
	p := MigrationParams{MaxBandwidth: 8 << 20, DowntimeLimit: 500 * time.Millisecond}
	if err := MigrateQMP(ctx, mon, UnixURI("/tmp/x/migrate.sock"), p); err != nil {
		t.Fatal(err)
	}
	if got := mon.executed(); !slices.Equal(got, []string{"migrate-set-capabilities", "migrate-set-parameters", "migrate"}) {
		t.Fatalf("commands %q", got)
	}
	c, _ := mon.find("migrate-set-parameters")
	if c.Args["max-bandwidth"] != float64(8<<20) || c.Args["downtime-limit"] != float64(500) {
		t.Errorf("migrate-set-parameters %v", c.Args)
	}
	c, _ = mon.find("migrate")
	if c.Args["uri"] != "unix:/tmp/x/migrate.sock" {
		t.Errorf("migrate %v", c.Args)
	}
	c, _ = mon.find("migrate-set-capabilities")
	if b, _ := json.Marshal(c.Args); string(b) != `{"capabilities":[{"capability":"events","state":true}]}` {
		t.Errorf("migrate-set-capabilities %s", b)
	}

	// Zero parameters leave QEMU's: no migrate-set-parameters.
	mon = scriptedMigration(`{}`)
	if err := MigrateQMP(ctx, mon, UnixURI("/s"), MigrationParams{}); err != nil {
		t.Fatal(err)
	}
	if got := mon.executed(); !slices.Equal(got, []string{"migrate-set-capabilities", "migrate"}) {
		t.Errorf("commands %q", got)
	}

	// Refused before QEMU hears anything.
	long := "/" + string(make([]byte, 200))
	for _, tc := range []struct {
		uri string
		p   MigrationParams
	}{
		{"tcp:1.2.3.4:5", MigrationParams{}}, {"unix:relative", MigrationParams{}}, {"unix:" + long, MigrationParams{}},
		{"unix:/s\n", MigrationParams{}}, {"unix:/s", MigrationParams{MaxBandwidth: -1}},
		{"unix:/s", MigrationParams{DowntimeLimit: time.Hour}}, {"unix:/s", MigrationParams{DowntimeLimit: time.Microsecond}},
	} {
		mon := scriptedMigration(`{}`)
		if err := MigrateQMP(ctx, mon, tc.uri, tc.p); !errors.Is(err, ErrInvalidConfig) || len(mon.executed()) > 0 {
			t.Errorf("%q %+v: got %v after %q, want ErrInvalidConfig before any command", tc.uri, tc.p, err, mon.executed())
		}
	}
}

func TestMigrateIncomingQMP(t *testing.T) {
	mon := scriptedMigration(`{}`)
	if err := MigrateIncomingQMP(context.Background(), mon, UnixURI("/d/migrate.sock")); err != nil {
		t.Fatal(err)
	}
	if got := mon.executed(); !slices.Equal(got, []string{"migrate-set-capabilities", "migrate-incoming"}) {
		t.Fatalf("commands %q", got)
	}
	if c, _ := mon.find("migrate-incoming"); c.Args["uri"] != "unix:/d/migrate.sock" {
		t.Errorf("migrate-incoming %v", c.Args)
	}
}

func TestCancelMigrationQMP(t *testing.T) {
	ctx := context.Background()
	mon := scriptedMigration(`{"status":"cancelling"}`, `{"status":"cancelled","total-time":900,"ram":{"transferred":1000,"total":4000}}`)
	info, err := CancelMigrationQMP(ctx, mon)
	if err != nil || info.Status != MigrationCancelled || info.RAM.Transferred != 1000 {
		t.Fatalf("got %+v, %v; want cancelled", info, err)
	}
	if got := mon.executed(); got[0] != "migrate_cancel" {
		t.Errorf("commands %q, want migrate_cancel first", got)
	}
	// Completed before the cancel took: the caller must know.
	_, err = CancelMigrationQMP(ctx, scriptedMigration(completedReply))
	var me *MigrationError
	if !errors.As(err, &me) || me.Status != MigrationCompleted {
		t.Errorf("got %v, want a *MigrationError with status completed", err)
	}
}

func TestQueryStatus(t *testing.T) {
	for _, tc := range []struct {
		reply   any
		want    RunStatus
		wantErr bool
	}{
		{map[string]any{"running": true, "status": "running"}, RunStatus{true, "running"}, false},
		{map[string]any{"running": false, "status": "postmigrate"}, RunStatus{false, "postmigrate"}, false},
		{map[string]any{"running": false}, RunStatus{}, true},
		{[]int{1}, RunStatus{}, true},
	} {
		mon := &fakeMonitor{handle: func(string, map[string]any) (any, error) { return tc.reply, nil }}
		got, err := QueryStatus(context.Background(), mon)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("%v: got %+v, %v; want %+v (error %v)", tc.reply, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestArgsIncoming(t *testing.T) {
	args, err := Config{Incoming: true}.Args("")
	if err != nil {
		t.Fatal(err)
	}
	i := slices.Index(args, "-incoming")
	if i < 0 || i+1 >= len(args) || args[i+1] != "defer" {
		t.Errorf("args %q lack -incoming defer", args)
	}
	args, _ = Config{}.Args("")
	if slices.Contains(args, "-incoming") {
		t.Errorf("args %q: -incoming without Incoming", args)
	}
}

// TestVMMigrationExited: a VM whose QEMU is gone answers ErrExited, and
// WaitMigration stops when QEMU exits during the wait.
func TestVMMigrationExited(t *testing.T) {
	mon := scriptedMigration(`{"status":"active"}`)
	vm, _ := newFakeVM(t, mon, 10, 0)
	errc := make(chan error, 1)
	go func() {
		_, err := vm.WaitMigration(context.Background())
		errc <- err
	}()
	time.Sleep(3 * migratePoll) // let the wait poll (not a timing assertion)
	close(vm.done)
	if err := <-errc; !errors.Is(err, ErrExited) {
		t.Errorf("WaitMigration: got %v, want ErrExited", err)
	}
	if _, err := vm.QueryMigrate(context.Background()); !errors.Is(err, ErrExited) {
		t.Errorf("QueryMigrate: got %v, want ErrExited", err)
	}
	if err := vm.Migrate(context.Background(), UnixURI("/s"), MigrationParams{}); !errors.Is(err, ErrExited) {
		t.Errorf("Migrate: got %v, want ErrExited", err)
	}
}
