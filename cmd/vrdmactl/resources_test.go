package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// openDevice adds device id and opens it through a Go virtio-user
// front-end with a PD, a CQ, an RC QP and a 64 KiB MR.
func openDevice(t *testing.T, control, id string) (*verbs.QP, *verbs.MR) {
	t.Helper()
	if _, errs, code := ctl(control, "device", "add", id); code != 0 {
		t.Fatalf("device add %s: %s", id, errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, filepath.Join(filepath.Dir(control), id+".sock"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		f.Close()
	})
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.Fatal(err)
	}
	buf, err := c.AllocBuffer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.RegMR(buf, 0, 64<<10, abi.AccessLocalWrite|abi.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	return qp, mr
}

// pairsOf parses a line of `key value` pairs.
func pairsOf(t *testing.T, line string) map[string]string {
	t.Helper()
	f := strings.Fields(line)
	if len(f)%2 != 0 {
		t.Fatalf("line %q: an odd number of words, want key value pairs", line)
	}
	m := map[string]string{}
	for i := 0; i < len(f); i += 2 {
		m[f[i]] = f[i+1]
	}
	return m
}

// TestResourceCommands lists a device's objects one line each, every
// device's with resource show, and the raw API JSON with --json.
func TestResourceCommands(t *testing.T) {
	control, _ := startControl(t)
	qp, mr := openDevice(t, control, "vm1")
	openDevice(t, control, "vm2")

	out, errs, code := ctl(control, "device", "qps", "vm1")
	if code != 0 {
		t.Fatalf("device qps: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 1 {
		t.Fatalf("device qps: got %q, want one line", out)
	}
	got := pairsOf(t, lines[0])
	for k, want := range map[string]string{"device": "vm1", "qpn": fmt.Sprint(qp.Num()), "type": "RC", "state": "RESET"} {
		if got[k] != want {
			t.Errorf("device qps: %s %q, want %q in %q", k, got[k], want, lines[0])
		}
	}
	out, _, code = ctl(control, "device", "mrs", "vm1")
	got = pairsOf(t, strings.TrimSpace(out))
	if code != 0 || got["lkey"] != fmt.Sprintf("0x%x", mr.LKey) || got["length"] != "64KiB" || got["pinned_bytes"] != "64KiB" ||
		got["access"] != "local_write,remote_read" || got["type"] != "user" {
		t.Errorf("device mrs: got %q, exit %d; want lkey %#x, 64KiB pinned, local_write,remote_read", out, code, mr.LKey)
	}
	for _, kind := range []string{"cqs", "pds", "srqs", "mws"} {
		if _, errs, code := ctl(control, "device", kind, "vm1"); code != 0 {
			t.Errorf("device %s: exit %d: %s", kind, code, errs)
		}
	}

	out, _, code = ctl(control, "resource", "show")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 2 {
		t.Fatalf("resource show: got %q, exit %d; want a line per device", out, code)
	}
	if got := pairsOf(t, lines[0]); got["device"] != "vm1" || got["qps"] != "1" || got["mrs"] != "1" || got["connected"] != "true" {
		t.Errorf("resource show: got %q, want vm1 with 1 QP and 1 MR", lines[0])
	}
	out, _, code = ctl(control, "resource", "show", "qp")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(lines) != 2 ||
		pairsOf(t, lines[0])["device"] != "vm1" || pairsOf(t, lines[1])["device"] != "vm2" {
		t.Errorf("resource show qp: got %q, exit %d; want vm1's QP, then vm2's", out, code)
	}
	out, _, code = ctl(control, "resource", "show", "mrs", "--json")
	var mrs []controlapi.MRInfo
	if err := json.Unmarshal([]byte(out), &mrs); err != nil || code != 0 || len(mrs) != 2 || mrs[0].LKey != mr.LKey {
		t.Errorf("resource show mrs --json: got %q (%v), exit %d; want both MRs, vm1's first", out, err, code)
	}
	out, _, code = ctl(control, "--json", "device", "pds", "vm2")
	var pds []controlapi.PDInfo
	if err := json.Unmarshal([]byte(out), &pds); err != nil || code != 0 || len(pds) != 1 || pds[0].QPs != 1 {
		t.Errorf("device pds --json: got %q (%v), exit %d", out, err, code)
	}

	for _, tt := range []struct {
		args []string
		code int
	}{
		{[]string{"resource", "show", "bogus"}, exitUsage},
		{[]string{"resource", "show", "qp", "cq"}, exitUsage},
		{[]string{"device", "qps"}, exitUsage},
		{[]string{"device", "qps", "nope"}, exitNotFound},
		{[]string{"resource"}, exitUsage},
	} {
		if _, _, code := ctl(control, tt.args...); code != tt.code {
			t.Errorf("%q: exit %d, want %d", tt.args, code, tt.code)
		}
	}
}

// jsonKeys returns the key paths of a decoded JSON document as showInfo
// names them: parent.key for nested objects, key for a list.
func jsonKeys(prefix string, v any, out *[]string) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			if _, isList := e.([]any); isList {
				*out = append(*out, p)
				continue
			}
			if _, isObj := e.(map[string]any); !isObj {
				*out = append(*out, p)
			}
			jsonKeys(p, e, out)
		}
	}
}

// TestDeviceShowEveryField walks the JSON keys of a real device (one
// with a front-end, objects and an assigned address) and checks that
// device show names every one of them, and prints sizes in binary units.
func TestDeviceShowEveryField(t *testing.T) {
	control, _ := startControl(t)
	if _, errs, code := ctl(control, "device", "add", "vm1", "--address", "10.11.0.5", "--max-pinned", "64M", "--weight", "2"); code != 0 {
		t.Fatalf("device add: %s", errs)
	}
	out, _, code := ctl(control, "device", "show", "vm1", "--json")
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != 0 {
		t.Fatalf("device show --json: %q: %v", out, err)
	}
	var keys []string
	jsonKeys("", doc, &keys)
	sort.Strings(keys)
	if len(keys) < 30 {
		t.Fatalf("device JSON: %d keys %q, want the whole device", len(keys), keys)
	}
	text, _, code := ctl(control, "device", "show", "vm1")
	if code != 0 {
		t.Fatalf("device show: exit %d", code)
	}
	rows := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		k, v, _ := strings.Cut(line, " ")
		rows[k] = strings.TrimSpace(v)
	}
	for _, k := range keys {
		found := rows[k] != ""
		for r := range rows {
			found = found || strings.HasPrefix(r, k+"[")
		}
		if !found {
			t.Errorf("device show: no row for JSON key %q in\n%s", k, text)
		}
	}
	for k, want := range map[string]string{
		"limits.max_pinned_bytes": "64MiB", "pinned_bytes": "0B", "share.weight": "2", "share.max_bytes_per_s": "none",
		"persisted": "false", "rnic": "soft", "addresses": "10.11.0.5/32", "connected": "false",
	} {
		if rows[k] != want {
			t.Errorf("device show: %s row %q, want %q", k, rows[k], want)
		}
	}
	if !strings.HasPrefix(rows["gids[0]"], "fe80::") {
		t.Errorf("device show: gids[0] row %q, want the port GID", rows["gids[0]"])
	}
}
