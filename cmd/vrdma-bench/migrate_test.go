package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunMigrateScenario runs a fake vrdma-vmtest: the line is decoded,
// a failed run with a line returns both, a run without one is an error.
func TestRunMigrateScenario(t *testing.T) {
	dir := t.TempDir()
	fake := func(body string) string {
		p := filepath.Join(dir, "vmtest")
		os.Remove(p)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ok := `{"op":"write","device":true,"status":"completed","downtime_ms":40,"total_ms":3000,"ram_bytes":9000,"gap_ms":450.5,"bytes":123,"verified":true}`
	r, err := runMigrateScenario(fake("echo booting; echo 'VRDMA-MIGRATE "+ok+"'"), "--op", "write")
	if err != nil || !r.Verified || r.DowntimeMS != 40 || r.GapMS != 450.5 || r.line != ok {
		t.Fatalf("got %+v, %v", r, err)
	}
	bad := `{"status":"failed","verified":false,"error":"migration failed"}`
	r, err = runMigrateScenario(fake("echo 'VRDMA-MIGRATE " + bad + "'; exit 1"))
	if err == nil || r.Status != "failed" {
		t.Errorf("failed run: got %+v, %v; want the line and an error", r, err)
	}
	if _, err := runMigrateScenario(fake("echo no such line; exit 1")); err == nil || !strings.Contains(err.Error(), "no such line") {
		t.Errorf("no line: got %v, want an error with the output's tail", err)
	}
	rows := migrateRows(migrateRun{DowntimeMS: 20, TotalMS: 3000}, r, migrateRun{DowntimeMS: 60, GapMS: 1100})
	if len(rows) != 5 || rows[0].baseline != 20 || rows[3].figure != 60 || rows[3].met == nil || !*rows[3].met || rows[4].figure != 1100 {
		t.Errorf("rows %+v", rows)
	}
}
