package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/daemon"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		args    string
		ok      bool
		size    uint64
		iters   int
		guest   uint64
		comment string
	}{
		{"--sockets a,b --op write --size 4096 --iters 10", true, 4096, 10, 0, "plain"},
		{"--sockets a,b --op read --size 4K", true, 4096, defaultIters, 0, "K"},
		{"--sockets a,b --op send --size 64KiB --duration 1s", true, 64 << 10, 0, 0, "KiB"},
		{"--sockets a,b --op write --size 1M --guest-mem 1G", true, 1 << 20, defaultIters, 1 << 30, "M and G"},
		{"--sockets a,b --op atomic --size 1M", true, 8, defaultIters, 0, "atomic is 8 bytes"},
		{"--sockets a --op write", false, 0, 0, 0, "one socket"},
		{"--sockets a,b,c --op write", false, 0, 0, 0, "three sockets"},
		{"--sockets a,b --op frob", false, 0, 0, 0, "bad op"},
		{"--sockets a,b --size 0", false, 0, 0, 0, "zero size"},
		{"--sockets a,b --size 3G", false, 0, 0, 0, "above 2 GiB"},
		{"--sockets a,b --size 12Q", false, 0, 0, 0, "bad unit"},
		{"--sockets a,b --iters 5 --duration 1s", false, 0, 0, 0, "both"},
		{"--sockets a,b --iters -1", false, 0, 0, 0, "negative"},
		{"--sockets a,b extra", false, 0, 0, 0, "stray argument"},
	}
	for _, tt := range tests {
		t.Run(tt.comment, func(t *testing.T) {
			o, err := parseFlags(strings.Fields(tt.args), io.Discard)
			if (err == nil) != tt.ok {
				t.Fatalf("got error %v, want ok %v", err, tt.ok)
			}
			if !tt.ok {
				return
			}
			if o.size != tt.size || o.iters != tt.iters || o.guestMem != tt.guest {
				t.Errorf("got size %d iters %d guest %d, want %d %d %d", o.size, o.iters, o.guestMem, tt.size, tt.iters, tt.guest)
			}
		})
	}
}

func TestPlan(t *testing.T) {
	tests := []struct {
		size, guest uint64
		slots       int
		ok          bool
	}{
		{4096, 0, 64, true},
		{1 << 30, 0, 1, true},
		{1 << 20, 40 << 20, 8, true},
		{1 << 20, 16 << 20, 0, false},
	}
	for _, tt := range tests {
		slots, mem, err := plan(options{size: tt.size, guestMem: tt.guest, txDepth: 64})
		if (err == nil) != tt.ok || slots != tt.slots {
			t.Errorf("plan(%d, %d): got %d, %v, want %d, ok %v", tt.size, tt.guest, slots, err, tt.slots, tt.ok)
		}
		if err == nil && mem < uint64(slots)*tt.size+memOverhead {
			t.Errorf("plan(%d, %d): %d bytes of guest memory for %d buffers", tt.size, tt.guest, mem, slots)
		}
	}
}

func startDaemon(t *testing.T) []string {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	dir := t.TempDir()
	var socks []string
	for _, id := range []string{"a", "b"} {
		s := filepath.Join(dir, id+".sock")
		if _, err := d.AddDevice(daemon.DeviceSpec{ID: id, Socket: s}); err != nil {
			t.Fatal(err)
		}
		socks = append(socks, s)
	}
	t.Cleanup(func() { d.Close() })
	return socks
}

// TestRun runs every operation end to end against an in-process daemon,
// with --verify, and checks the JSON contract.
func TestRun(t *testing.T) {
	socks := startDaemon(t)
	for _, tc := range []struct{ op, size string }{
		{"write", "4K"}, {"write", "100000"}, {"read", "64KiB"}, {"send", "1000"}, {"atomic", "8"},
	} {
		t.Run(tc.op+"/"+tc.size, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out bytes.Buffer
			args := []string{"--sockets", strings.Join(socks, ","), "--op", tc.op, "--size", tc.size,
				"--iters", "300", "--lat-iters", "50", "--verify", "--json", "--tx-depth", "16"}
			if err := run(ctx, args, &out); err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(out.Bytes(), &m); err != nil {
				t.Fatalf("output %q: %v", out.String(), err)
			}
			for _, k := range []string{"op", "size", "iters", "gbytes_per_s", "mops", "lat_us_p50", "lat_us_p99", "verified"} {
				if _, ok := m[k]; !ok {
					t.Errorf("JSON lacks %q: %s", k, out.String())
				}
			}
			if m["op"] != tc.op || m["iters"] != float64(300) || m["verified"] != true {
				t.Errorf("got %s", out.String())
			}
			if m["gbytes_per_s"].(float64) <= 0 || m["lat_us_p50"].(float64) <= 0 || m["lat_us_p99"].(float64) < m["lat_us_p50"].(float64) {
				t.Errorf("implausible numbers: %s", out.String())
			}
		})
	}
	t.Run("duration/table", func(t *testing.T) {
		var out bytes.Buffer
		args := []string{"--sockets", strings.Join(socks, ","), "--op", "write", "--size", "4K", "--duration", "200ms", "--lat-iters", "20"}
		if err := run(context.Background(), args, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "BW average[GB/s]") || !strings.Contains(out.String(), "RDMA_Write") {
			t.Errorf("table output:\n%s", out.String())
		}
	})
	t.Run("bad socket", func(t *testing.T) {
		args := []string{"--sockets", socks[0] + ",/nonexistent.sock", "--iters", "1"}
		if err := run(context.Background(), args, io.Discard); err == nil {
			t.Error("a missing socket succeeded")
		}
	})
}

// TestResultJSON pins the JSON contract: these keys, no role (vrdma-perf
// leaves it empty), one line.
func TestResultJSON(t *testing.T) {
	var out bytes.Buffer
	if err := json.NewEncoder(&out).Encode(result{Op: "write", Size: 8}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(out.String(), "\n"); n != 1 || !strings.HasSuffix(out.String(), "}\n") {
		t.Errorf("got %q, want one line", out.String())
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	want := []string{"buffers", "gbytes_per_s", "iters", "lat_iters", "lat_us_avg", "lat_us_p50", "lat_us_p99",
		"mops", "op", "seconds", "size", "tx_depth", "verified"}
	if !slices.Equal(keys, want) {
		t.Errorf("got keys %q, want %q", keys, want)
	}
}
