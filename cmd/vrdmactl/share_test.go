package main

import (
	"encoding/json"
	"flag"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
)

// TestDeviceShare: device add takes a share, device set changes only the
// fields whose flags are given, device show and ls print it, and the
// daemon's device has it.
func TestDeviceShare(t *testing.T) {
	control, d := startControl(t)
	sock := filepath.Join(filepath.Dir(control), "vm1.sock")
	out, errs, code := ctl(control, "device", "add", "vm1", "--socket", sock, "--weight", "3", "--max-bytes-per-s", "1G", "--max-ops-per-s", "5000", "--json")
	if code != 0 {
		t.Fatalf("device add: exit %d: %s", code, errs)
	}
	var info daemon.DeviceInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("device add --json: %q: %v", out, err)
	}
	if want := (controlapi.Share{Weight: 3, MaxBytesPerSec: 1 << 30, MaxOpsPerSec: 5000}); info.Share != want {
		t.Errorf("device add: share %+v, want %+v", info.Share, want)
	}
	dv, _ := d.Device("vm1")
	for _, step := range []struct {
		args []string
		want rdma.Share
	}{
		{[]string{"--weight", "7"}, rdma.Share{Weight: 7, MaxBytesPerSec: 1 << 30, MaxOpsPerSec: 5000}},
		{[]string{"--max-bytes-per-s", "0"}, rdma.Share{Weight: 7, MaxOpsPerSec: 5000}},
		{[]string{"--max-ops-per-s=0", "--max-bytes-per-s", "64M"}, rdma.Share{Weight: 7, MaxBytesPerSec: 64 << 20}},
		{[]string{"--weight", "0"}, rdma.Share{MaxBytesPerSec: 64 << 20}},
	} {
		out, errs, code := ctl(control, append([]string{"device", "set", "vm1", "--json"}, step.args...)...)
		if code != 0 {
			t.Fatalf("device set %q: exit %d: %s", step.args, code, errs)
		}
		var got daemon.DeviceInfo
		if err := json.Unmarshal([]byte(out), &got); err != nil || got.ID != "vm1" {
			t.Fatalf("device set --json: %q: %v", out, err)
		}
		if s := dv.Dev.Share(); s != step.want {
			t.Errorf("device set %q: device's share %+v, want %+v", step.args, s, step.want)
		}
	}
	// Weight 0 is shown as the weight in effect, 1; a bound of 0 as none.
	out, _, code = ctl(control, "device", "show", "vm1")
	if code != 0 {
		t.Fatalf("device show: exit %d", code)
	}
	for key, want := range map[string]string{"share.weight": "1", "share.max_bytes_per_s": "64MiB/s", "share.max_ops_per_s": "none"} {
		if got := rowOf(out, key); got != want {
			t.Errorf("device show: %s row %q, want %q", key, got, want)
		}
	}
	out, _, code = ctl(control, "device", "ls")
	if code != 0 || !strings.Contains(out, "WEIGHT") || !strings.Contains(out, "MAX-BYTES") || !strings.Contains(out, "64MiB/s") {
		t.Errorf("device ls: got %q, exit %d; want the share columns", out, code)
	}
	out, _, code = ctl(control, "device", "ls", "--json")
	var list []daemon.DeviceInfo
	if err := json.Unmarshal([]byte(out), &list); err != nil || code != 0 || len(list) != 1 || list[0].Share != (controlapi.Share{Weight: 1, MaxBytesPerSec: 64 << 20}) {
		t.Errorf("device ls --json: got %q (%v), want vm1 with weight 1 and 64 MiB/s", out, err)
	}
}

// rowOf is the value of row key in device show's two-column output.
func rowOf(out, key string) string {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			return f[1]
		}
	}
	return ""
}

// TestDeviceShareErrors: the documented exit statuses for device set and
// the share flags of device add.
func TestDeviceShareErrors(t *testing.T) {
	control, d := startControl(t)
	dir := filepath.Dir(control)
	if _, errs, code := ctl(control, "device", "add", "vm1", "--weight", "2"); code != 0 {
		t.Fatalf("device add: exit %d: %s", code, errs)
	}
	missing := filepath.Join(dir, "nobody.sock")
	for _, tt := range []struct {
		control string
		args    []string
		code    int
		want    string
	}{
		{control, []string{"device", "set", "vm1"}, exitUsage, "at least one of --weight"},
		{control, []string{"device", "set"}, exitUsage, "needs ID"},
		{control, []string{"device", "set", "vm1", "vm2", "--weight", "1"}, exitUsage, "needs ID"},
		{control, []string{"device", "set", "nope", "--weight", "1"}, exitNotFound, "no such device: nope"},
		{control, []string{"device", "set", "vm1", "--weight", "1001"}, exitUsage, "share.weight"},
		{control, []string{"device", "set", "vm1", "--weight", "-1"}, exitUsage, "--weight: invalid value \"-1\""},
		{control, []string{"device", "set", "vm1", "--max-bytes-per-s", "100"}, exitUsage, "share.max_bytes_per_s"},
		{control, []string{"device", "set", "vm1", "--max-bytes-per-s", "lots"}, exitUsage, "--max-bytes-per-s"},
		{control, []string{"device", "set", "vm1", "--max-ops-per-s", "x"}, exitUsage, "--max-ops-per-s: invalid value \"x\""},
		{control, []string{"device", "add", "vm2", "--weight", "5000"}, exitUsage, "share.weight"},
		{missing, []string{"device", "set", "vm1", "--weight", "1"}, exitUnreachable, "nobody.sock"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, errs, code := ctl(tt.control, tt.args...)
			if code != tt.code || !strings.Contains(errs, tt.want) {
				t.Errorf("got exit %d, %q; want %d and an error with %q", code, errs, tt.code, tt.want)
			}
		})
	}
	dv, _ := d.Device("vm1")
	if s := dv.Dev.Share(); s != (rdma.Share{Weight: 2}) {
		t.Errorf("share after the failed commands: %+v, want weight 2 as added", s)
	}
	if _, ok := d.Device("vm2"); ok {
		t.Error("vm2 added despite its bad weight")
	}
}

// TestSharePatch: only the flags on the command line are in the patch.
func TestSharePatch(t *testing.T) {
	for _, tt := range []struct {
		args             []string
		weight, by, opsp string // "-" for absent
	}{
		{nil, "-", "-", "-"},
		{[]string{"--weight", "0"}, "0", "-", "-"},
		{[]string{"--max-bytes-per-s", "0"}, "-", "0", "-"},
		{[]string{"--max-bytes-per-s", "4K", "--max-ops-per-s", "9"}, "-", "4096", "9"},
		{[]string{"--weight", "1000", "--max-ops-per-s", "0"}, "1000", "-", "0"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		sf := defineShare(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		p, err := sf.patch()
		if err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		str := func(v any) string {
			switch x := v.(type) {
			case *uint32:
				if x != nil {
					return strconv.FormatUint(uint64(*x), 10)
				}
			case *uint64:
				if x != nil {
					return strconv.FormatUint(*x, 10)
				}
			}
			return "-"
		}
		if got := [3]string{str(p.Weight), str(p.MaxBytesPerSec), str(p.MaxOpsPerSec)}; got != [3]string{tt.weight, tt.by, tt.opsp} {
			t.Errorf("%q: got weight, bytes, ops %q, want %q", tt.args, got, [3]string{tt.weight, tt.by, tt.opsp})
		}
	}
}
