package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

func testDaemon(t *testing.T) (*Daemon, http.Handler) {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := New(logrus.NewEntry(l), Config{})
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return d, d.Handler()
}

// call runs one request against h and decodes the JSON answer.
func call(t *testing.T, h http.Handler, method, path, body string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: got Content-Type %q, want application/json", method, path, ct)
	}
	var out map[string]any
	if b := bytes.TrimSpace(rec.Body.Bytes()); len(b) > 0 && b[0] == '{' {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Errorf("%s %s: body %q: %v", method, path, b, err)
		}
	}
	return rec.Code, out
}

func addBody(id, sock string, extra string) string {
	return fmt.Sprintf(`{"id":%q,"socket":%q%s}`, id, sock, extra)
}

func TestAddShowRemove(t *testing.T) {
	d, h := testDaemon(t)
	sock := filepath.Join(t.TempDir(), "vm1.sock")
	code, out := call(t, h, "POST", "/v1/devices", addBody("vm1", sock,
		`,"limits":{"max_qps":8,"max_cqs":9,"max_mrs":10,"max_pinned_bytes":4194304},"guid":"0211:2233:4455:6677"`))
	if code != http.StatusCreated {
		t.Fatalf("POST: got %d %v, want 201", code, out)
	}
	for k, want := range map[string]any{"id": "vm1", "socket": sock, "guid": "0211:2233:4455:6677", "gid": "fe80::211:2233:4455:6677"} {
		if out[k] != want {
			t.Errorf("POST: got %s=%v, want %v", k, out[k], want)
		}
	}
	lim, _ := out["limits"].(map[string]any)
	for k, want := range map[string]float64{"max_qps": 8, "max_cqs": 9, "max_mrs": 10, "max_pinned_bytes": 4194304} {
		if lim[k] != want {
			t.Errorf("limits.%s: got %v, want %v", k, lim[k], want)
		}
	}
	dv, ok := d.Device("vm1")
	if !ok {
		t.Fatal("device vm1 not in the daemon")
	}
	if cs := dv.Dev.ConfigSpace(); cs.MaxQP != 8 || cs.MaxCQ != 9 || cs.MaxMR != 10 || cs.NodeGUID != 0x0211223344556677 {
		t.Errorf("config space: got max_qp %d max_cq %d max_mr %d guid %#x, want 8 9 10 0x211223344556677", cs.MaxQP, cs.MaxCQ, cs.MaxMR, cs.NodeGUID)
	}
	if code, out := call(t, h, "GET", "/v1/devices/vm1", ""); code != http.StatusOK || out["uuid"] != dv.Dev.UUID().String() {
		t.Errorf("GET: got %d %v, want 200 with uuid %s", code, out, dv.Dev.UUID())
	} else if gids, _ := out["gids"].([]any); len(gids) != 1 ||
		gids[0].(map[string]any)["index"] != float64(0) || gids[0].(map[string]any)["gid"] != out["gid"] {
		t.Errorf("GET: gids %v, want entry 0 alone, the port GID %v", out["gids"], out["gid"])
	}
	if code, out := call(t, h, "GET", "/v1/health", ""); code != http.StatusOK || out["devices"] != float64(1) {
		t.Errorf("health: got %d %v, want 200 with 1 device", code, out)
	}
	if code, out := call(t, h, "DELETE", "/v1/devices/vm1", ""); code != http.StatusOK || out["removed"] != true {
		t.Errorf("DELETE: got %d %v, want 200 removed", code, out)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after DELETE: got %v, want it removed", err)
	}
	if code, _ := call(t, h, "GET", "/v1/devices/vm1", ""); code != http.StatusNotFound {
		t.Errorf("GET after DELETE: got %d, want 404", code)
	}
	// The same id and socket can be used again.
	if code, out := call(t, h, "POST", "/v1/devices", addBody("vm1", sock, "")); code != http.StatusCreated {
		t.Errorf("POST again: got %d %v, want 201", code, out)
	}
}

func TestBadRequests(t *testing.T) {
	d, h := testDaemon(t)
	dir := t.TempDir()
	used := filepath.Join(dir, "used.sock")
	if code, out := call(t, h, "POST", "/v1/devices", addBody("used", used, "")); code != http.StatusCreated {
		t.Fatalf("POST: got %d %v", code, out)
	}
	foreign := filepath.Join(dir, "foreign.sock")
	listenBusy(t, foreign)
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	free := filepath.Join(dir, "free.sock")
	tests := []struct {
		name, method, path, body string
		wantCode                 int
		wantErr                  string
	}{
		{"unknown id", "GET", "/v1/devices/nope", "", 404, "no such device"},
		{"delete unknown id", "DELETE", "/v1/devices/nope", "", 404, "no such device"},
		{"duplicate id", "POST", "/v1/devices", addBody("used", free, ""), 409, "device exists"},
		{"socket of another device", "POST", "/v1/devices", addBody("other", used, ""), 409, "socket path in use"},
		{"socket of another process", "POST", "/v1/devices", addBody("other", foreign, ""), 409, "another process"},
		{"path not a socket", "POST", "/v1/devices", addBody("other", plain, ""), 409, "not a socket"},
		{"socket directory missing", "POST", "/v1/devices", addBody("other", filepath.Join(dir, "no", "x.sock"), ""), 422, "listen"},
		{"malformed JSON", "POST", "/v1/devices", `{"id":"x",`, 400, "malformed JSON"},
		{"not an object", "POST", "/v1/devices", `[1,2]`, 400, "malformed JSON"},
		{"unknown field", "POST", "/v1/devices", addBody("x", free, `,"max_qps":3`), 400, "unknown field"},
		{"trailing data", "POST", "/v1/devices", addBody("x", free, "") + `{}`, 400, "trailing data"},
		{"empty body", "POST", "/v1/devices", ``, 400, "malformed JSON"},
		{"no id", "POST", "/v1/devices", `{"socket":"/tmp/x.sock"}`, 400, "id: required"},
		{"bad id", "POST", "/v1/devices", addBody("1abc", free, ""), 400, "start with a letter"},
		{"bad id char", "POST", "/v1/devices", addBody("a/b", free, ""), 400, "id:"},
		{"long id", "POST", "/v1/devices", addBody(strings.Repeat("a", 65), free, ""), 400, "longer than"},
		{"no socket", "POST", "/v1/devices", `{"id":"x"}`, 400, "socket: required"},
		{"relative socket", "POST", "/v1/devices", addBody("x", "x.sock", ""), 400, "absolute"},
		{"long socket", "POST", "/v1/devices", addBody("x", "/"+strings.Repeat("s", 107), ""), 400, "longer than"},
		{"max_qps too big", "POST", "/v1/devices", addBody("x", free, `,"limits":{"max_qps":65537}`), 400, "limits.max_qps"},
		{"max_cqs too big", "POST", "/v1/devices", addBody("x", free, `,"limits":{"max_cqs":4294967295}`), 400, "limits.max_cqs"},
		{"max_mrs too big", "POST", "/v1/devices", addBody("x", free, `,"limits":{"max_mrs":1048577}`), 400, "limits.max_mrs"},
		{"max_qps negative", "POST", "/v1/devices", addBody("x", free, `,"limits":{"max_qps":-1}`), 400, "malformed JSON"},
		{"max_qps overflows", "POST", "/v1/devices", addBody("x", free, `,"limits":{"max_qps":4294967296}`), 400, "malformed JSON"},
		{"pinned too small", "POST", "/v1/devices", addBody("x", free, `,"limits":{"max_pinned_bytes":4096}`), 400, "limits.max_pinned_bytes"},
		{"doorbells", "POST", "/v1/devices", addBody("x", free, `,"doorbell_queues":257`), 400, "doorbell_queues"},
		{"bad guid", "POST", "/v1/devices", addBody("x", free, `,"guid":"zz"`), 400, "guid"},
		{"multicast guid", "POST", "/v1/devices", addBody("x", free, `,"guid":"0300:0000:0000:0001"`), 400, "locally administered"},
		{"global guid", "POST", "/v1/devices", addBody("x", free, `,"guid":"0000000000000001"`), 400, "locally administered"},
		{"gid not link-local", "POST", "/v1/devices", addBody("x", free, `,"gid":"fe81::211:2233:4455:6677"`), 400, "fe80::/64"},
		{"gid not ipv6", "POST", "/v1/devices", addBody("x", free, `,"gid":"10.0.0.1"`), 400, "gid"},
		{"gid and guid disagree", "POST", "/v1/devices", addBody("x", free, `,"guid":"0211:2233:4455:6677","gid":"fe80::211:2233:4455:6678"`), 400, "does not match"},
		{"uuid and guid disagree", "POST", "/v1/devices", addBody("x", free, `,"guid":"0211:2233:4455:6677","uuid":"6ba7b810-9dad-11d1-80b4-00c04fd430c8"`), 400, "uuid"},
		{"nil uuid", "POST", "/v1/devices", addBody("x", free, `,"uuid":"00000000-0000-0000-0000-000000000000"`), 400, "uuid"},
		{"too large", "POST", "/v1/devices", `{"id":"` + strings.Repeat("a", 70000) + `"}`, 413, "larger than"},
		{"wrong method", "PUT", "/v1/devices", "", 405, "not allowed"},
		{"wrong method on id", "PUT", "/v1/devices/used", "", 405, "not allowed"},
		{"share weight too big", "POST", "/v1/devices", addBody("x", free, `,"share":{"weight":1001}`), 400, "share.weight"},
		{"roce_bind not an address", "POST", "/v1/devices", addBody("x", free, `,"roce_bind":["10.0.0"]`), 400, "roce_bind"},
		{"roce_bind multicast", "POST", "/v1/devices", addBody("x", free, `,"roce_bind":["224.0.0.1"]`), 400, "roce_bind"},
		{"roce_bind twice", "POST", "/v1/devices", addBody("x", free, `,"roce_bind":["10.0.0.1","::ffff:10.0.0.1"]`), 400, "roce_bind"},
		{"roce_bind without RoCE", "POST", "/v1/devices", addBody("x", free, `,"roce_bind":["10.0.0.1"]`), 422, "no RoCE network"},
		{"share bytes too small", "POST", "/v1/devices", addBody("x", free, `,"share":{"max_bytes_per_s":100}`), 400, "share.max_bytes_per_s"},
		{"share negative", "POST", "/v1/devices", addBody("x", free, `,"share":{"max_ops_per_s":-1}`), 400, "malformed JSON"},
		{"share unknown field", "POST", "/v1/devices", addBody("x", free, `,"share":{"quantum":1}`), 400, "unknown field"},
		{"unknown endpoint", "GET", "/v2/x", "", 404, "no such endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out := call(t, h, tt.method, tt.path, tt.body)
			msg, _ := out["error"].(string)
			if code != tt.wantCode || !strings.Contains(msg, tt.wantErr) {
				t.Errorf("got %d %q, want %d with %q", code, msg, tt.wantCode, tt.wantErr)
			}
		})
	}
	// Nothing half-created: only the first device exists, the free and
	// foreign sockets are untouched.
	if got := d.Devices(); len(got) != 1 || got[0].ID != "used" {
		t.Errorf("devices: got %d, want only \"used\"", len(got))
	}
	if _, err := os.Stat(free); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("free socket: got %v, want none", err)
	}
	if c, err := net.Dial("unix", foreign); err != nil {
		t.Errorf("foreign socket: %v, want it still served", err)
	} else {
		c.Close()
	}
}

// TestDeleteConnected removes a device a front-end is using: the front-end
// loses the device, and every pin is released.
func TestDeleteConnected(t *testing.T) {
	d, h := testDaemon(t)
	sock := filepath.Join(t.TempDir(), "c.sock")
	if code, out := call(t, h, "POST", "/v1/devices", addBody("c", sock, "")); code != http.StatusCreated {
		t.Fatalf("POST: got %d %v", code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	defer c.Close()
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf, err := c.AllocBuffer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.RegMR(buf, 0, 64<<10, abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if d.PinnedBytes() == 0 {
		t.Fatal("no pinned bytes after REG_MR")
	}
	if code, out := call(t, h, "GET", "/v1/devices/c", ""); code != 200 || out["connected"] != true || out["mrs"] != float64(1) {
		t.Errorf("GET: got %d connected=%v mrs=%v, want 200 true 1", code, out["connected"], out["mrs"])
	}
	if code, out := call(t, h, "DELETE", "/v1/devices/c", ""); code != http.StatusOK {
		t.Fatalf("DELETE: got %d %v, want 200", code, out)
	}
	if got := d.PinnedBytes(); got != 0 {
		t.Errorf("pinned bytes after DELETE: got %d, want 0", got)
	}
	// The back-end hung up: a message that wants a reply fails at once
	// (a command on the control queue would only time out).
	if _, err := f.ReadConfig(0, 8); err == nil {
		t.Error("GET_CONFIG after DELETE: got an answer, want an error")
	}
}

func TestParseGUID(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"0211:2233:4455:6677", 0x0211223344556677, true},
		{"fe00000000000001", 0xfe00000000000001, true},
		{"0211:2233:4455:667", 0, false},
		{"0211-2233-4455-6677", 0, false},
		{"0100:0000:0000:0000", 0, false},
		{"", 0, false},
	} {
		got, err := abi.ParseGUID(tt.in)
		if got != tt.want || (err == nil) != tt.ok {
			t.Errorf("vrdma.ParseGUID(%q): got %#x, %v, want %#x, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
		if err == nil && abi.FormatGUID(got) != tt.in && len(tt.in) == 19 {
			t.Errorf("vrdma.FormatGUID(%#x): got %s, want %s", got, abi.FormatGUID(got), tt.in)
		}
	}
}

func FuzzDecodeAddRequest(f *testing.F) {
	f.Add([]byte(`{"id":"vm1","socket":"/run/vrdma/vm1.sock","limits":{"max_qps":64,"max_cqs":64,"max_mrs":256,"max_pinned_bytes":1073741824},"guid":"0211:2233:4455:6677"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		spec, err := DecodeAddRequest(body)
		if err != nil {
			if spec.ID != "" || spec.Socket != "" || spec.MaxPinned != 0 || spec.Device.Limits != (rdma.Limits{}) || spec.Device.Share != (rdma.Share{}) {
				t.Fatalf("error %v with a non-zero spec %+v", err, spec)
			}
			if !errors.Is(err, ErrInvalidRequest) {
				t.Fatalf("got %v, want ErrInvalidRequest", err)
			}
			return
		}
		if checkID(spec.ID) != nil || checkSocket(spec.Socket) != nil {
			t.Fatalf("accepted id %q socket %q", spec.ID, spec.Socket)
		}
		l := spec.Device.Limits
		// Zero limits are the daemon's defaults, filled in by AddDevice.
		if l.MaxQP > maxQPs || l.MaxCQ > maxCQs || l.MaxMR > maxMRs {
			t.Fatalf("accepted limits %+v", l)
		}
		if p := spec.MaxPinned; p != 0 && (p < minPinnedBytes || p > maxPinnedBytes) {
			t.Fatalf("accepted max pinned %d", p)
		}
		if err := spec.Device.Share.Check(); err != nil {
			t.Fatalf("accepted share %+v: %v", spec.Device.Share, err)
		}
		if g := abi.GUIDOfUUID(spec.Device.UUID); abi.CheckGUID(g) != nil {
			t.Fatalf("accepted uuid %s", spec.Device.UUID)
		}
	})
}

// listenBusy makes path a unix socket another process serves: it accepts
// and closes every connection until the test ends.
func listenBusy(t *testing.T, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
}
