package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// A live migration between two QEMUs served by one vrdmad (docs/state.md,
// "Through QEMU's device-state protocol"), with Go front-ends doing what
// QEMU does: the source's driver (vm-a) talks to a peer (vm-c) on the same
// vrdmad; the source stops (GET_VRING_BASE on every ring: vrdmad fences
// the device), the peer's RDMA WRITE into it is held, QEMU takes the
// state (SET_DEVICE_STATE_FD save), copies the guest memory to the
// destination, whose device (vm-b) was added incoming with the source's
// UUID, and loads the state there (SET_MEM_TABLE, SET_DEVICE_STATE_FD
// load, CHECK_DEVICE_STATE). The identity moves to vm-b, the held WRITE
// lands in vm-b's memory (not in vm-a's), the source QEMU quits without
// breaking the peer, and the state file lists vm-b in place of vm-a.

// migrateAPI runs one control API request against h and decodes the
// answer into out (if not nil); it returns the status code.
func migrateAPI(t *testing.T, h http.Handler, method, path, body string, out any) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	if out != nil && rec.Code < 300 {
		if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
			t.Fatalf("%s %s: %v\n%s", method, path, err, rec.Body.String())
		}
	}
	return rec.Code
}

// migratePeer is a driver on a device: its verbs context over a Go
// front-end, with a PD, a CQ, an RC QP and a registered buffer.
type migratePeer struct {
	f   *frontend.Frontend
	ctx *verbs.Context
	gid [16]byte
	cq  *verbs.CQ
	qp  *verbs.QP
	buf *verbs.Buffer
	mr  *verbs.MR
}

func openMigratePeer(t *testing.T, sock string) *migratePeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, sock, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	p := &migratePeer{f: f, ctx: c}
	t.Cleanup(func() { c.Close(); f.Close() })
	if p.gid, err = c.QueryGID(); err != nil {
		t.Fatal(err)
	}
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if p.cq, err = c.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if p.qp, err = pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeRC, SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	if p.buf, err = c.AllocBuffer(64 << 10); err != nil {
		t.Fatal(err)
	}
	if p.mr, err = pd.RegMR(p.buf, 0, 64<<10, abi.AccessLocalWrite|abi.AccessRemoteWrite|abi.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	return p
}

// write posts an RDMA WRITE of n bytes of p's buffer at 0 to addr, rkey.
func (p *migratePeer) write(t *testing.T, id, addr uint64, rkey uint32, n int) {
	t.Helper()
	if err := p.qp.PostSend(verbs.SendWR{WRID: id, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
		SGL: []abi.SGE{p.mr.SGE(0, n)}, RemoteAddr: addr, RKey: rkey}); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond until it holds, failing after 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMigrateSameHost is the whole sequence above.
func TestMigrateSameHost(t *testing.T) {
	hygiene(t)
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	d := daemon.New(testLogger(t), daemon.Config{})
	t.Cleanup(func() { d.Close() })
	if _, err := d.OpenState(state); err != nil {
		t.Fatal(err)
	}
	h := d.Handler()
	u := uuid.New()
	add := func(id, extra string) (int, controlapi.DeviceInfo) {
		var info controlapi.DeviceInfo
		body := `{"id":"` + id + `","socket":"` + filepath.Join(dir, id+".sock") + `"` + extra + `}`
		return migrateAPI(t, h, "POST", "/v1/devices", body, &info), info
	}
	if code, _ := add("vm-a", `,"uuid":"`+u.String()+`"`); code != http.StatusCreated {
		t.Fatalf("POST vm-a: %d", code)
	}
	if code, _ := add("vm-c", ""); code != http.StatusCreated {
		t.Fatalf("POST vm-c: %d", code)
	}
	a := openMigratePeer(t, filepath.Join(dir, "vm-a.sock"))
	c := openMigratePeer(t, filepath.Join(dir, "vm-c.sock"))
	all := abi.AccessLocalWrite | abi.AccessRemoteWrite | abi.AccessRemoteRead
	if err := a.qp.ConnectRC(c.gid, c.qp.Num(), c.qp.PSN(), all); err != nil {
		t.Fatal(err)
	}
	if err := c.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), all); err != nil {
		t.Fatal(err)
	}
	// Traffic both ways before.
	copy(a.buf.Bytes, bytes.Repeat([]byte{0x11}, 64))
	a.write(t, 1, c.mr.Addr+4096, c.mr.RKey, 64)
	if wc := pollOne(t, a.cq); wc.Status != abi.WCSuccess {
		t.Fatalf("a's WRITE before: %+v", wc)
	}
	copy(c.buf.Bytes, bytes.Repeat([]byte{0x22}, 64))
	c.write(t, 2, a.mr.Addr+4096, a.mr.RKey, 64)
	if wc := pollOne(t, c.cq); wc.Status != abi.WCSuccess {
		t.Fatalf("c's WRITE before: %+v", wc)
	}

	// The source QEMU stops the VM: every ring stops, the device is
	// fenced. c's WRITE into it is held, not failed.
	if _, err := a.f.Stop(); err != nil {
		t.Fatal(err)
	}
	dvC, _ := d.Device("vm-c")
	held := dvC.Dev.Stats().Engine.FenceHeld
	const off = 8192
	copy(c.buf.Bytes, bytes.Repeat([]byte{0x33}, 64))
	c.write(t, 3, a.mr.Addr+off, a.mr.RKey, 64)
	waitFor(t, "c's WRITE held by the fence", func() bool { return dvC.Dev.Stats().Engine.FenceHeld > held })
	gpa := a.buf.Addr + off
	if !bytes.Equal(a.f.Memory()[gpa:gpa+64], make([]byte, 64)) {
		t.Fatal("c's WRITE landed in the stopped source's memory")
	}
	var wc [1]verbs.WC
	if n, err := c.cq.Poll(wc[:]); err != nil || n != 0 {
		t.Fatalf("c's held WRITE completed: %d %+v %v", n, wc, err)
	}
	saved, err := a.f.SaveDeviceState()
	if err != nil {
		t.Fatalf("save: %v", err)
	}

	// The destination: a device added incoming with the source's UUID,
	// a QEMU with a copy of the guest memory.
	if code, _ := add("vm-b", `,"uuid":"`+u.String()+`"`); code != http.StatusUnprocessableEntity {
		t.Fatalf("POST vm-b with vm-a's uuid, not incoming: got %d, want 422 (refused as before)", code)
	}
	code, info := add("vm-b", `,"uuid":"`+u.String()+`","incoming":true`)
	if code != http.StatusCreated || info.Migration != controlapi.MigrationIncoming || info.Persisted || len(info.GIDs) != 0 {
		t.Fatalf("POST vm-b incoming: %d %+v", code, info)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := frontend.Dial(ctx, frontend.Config{Socket: filepath.Join(dir, "vm-b.sock"), MemorySize: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	copy(b.Memory(), a.f.Memory()) // QEMU's last RAM pass
	if err := b.SetMemTable(); err != nil {
		t.Fatal(err)
	}
	select { // drained: the next signal is the migration's save
	case <-d.Changed():
	default:
	}
	if err := b.LoadDeviceState(saved); err != nil {
		t.Fatalf("load: %v", err)
	}
	var infoA, infoB controlapi.DeviceInfo
	migrateAPI(t, h, "GET", "/v1/devices/vm-a", "", &infoA)
	migrateAPI(t, h, "GET", "/v1/devices/vm-b", "", &infoB)
	if infoA.Migration != controlapi.MigrationOut || infoA.Persisted || len(infoA.GIDs) != 0 {
		t.Fatalf("vm-a after the load: migration %q, persisted %v, gids %v", infoA.Migration, infoA.Persisted, infoA.GIDs)
	}
	if infoB.Migration != controlapi.MigrationIn || !infoB.Persisted || len(infoB.GIDs) == 0 || infoB.GIDs[0].GID != infoA.GID {
		t.Fatalf("vm-b after the load: %+v", infoB)
	}

	// The held WRITE lands, in the destination's memory only.
	if wc := pollOne(t, c.cq); wc.WRID != 3 || wc.Status != abi.WCSuccess {
		t.Fatalf("the held WRITE after the load: %+v", wc)
	}
	if !bytes.Equal(b.Memory()[gpa:gpa+64], bytes.Repeat([]byte{0x33}, 64)) {
		t.Fatal("the held WRITE is not in the destination's memory")
	}
	if !bytes.Equal(a.f.Memory()[gpa:gpa+64], make([]byte, 64)) {
		t.Fatal("the held WRITE landed in the source's memory")
	}

	// The source QEMU quits: its teardown leaves c connected, and c's
	// next WRITE, with the same rkey, lands in the destination.
	a.ctx.Close()
	a.f.Close()
	waitFor(t, "vm-a's front-end gone", func() bool {
		dv, _ := d.Device("vm-a")
		return !dv.Dev.Connected()
	})
	attr, err := c.qp.Query()
	if err != nil || attr.QPState != abi.QPSRTS {
		t.Fatalf("c's QP after the source's teardown: %+v %v, want RTS", attr, err)
	}
	copy(c.buf.Bytes, bytes.Repeat([]byte{0x44}, 64))
	c.write(t, 4, a.mr.Addr+off+64, a.mr.RKey, 64)
	if wc := pollOne(t, c.cq); wc.WRID != 4 || wc.Status != abi.WCSuccess {
		t.Fatalf("c's WRITE after the source's teardown: %+v", wc)
	}
	if !bytes.Equal(b.Memory()[gpa+64:gpa+128], bytes.Repeat([]byte{0x44}, 64)) {
		t.Fatal("c's WRITE after the teardown is not in the destination's memory")
	}

	// The state file lists the destination in place of the source.
	waitChanged(t, d)
	ids := stateIDs(t, state)
	if ids["vm-a"] != "" || ids["vm-b"] != u.String() || ids["vm-c"] == "" {
		t.Fatalf("state file devices (id → uuid) after the migration: %v, want vm-b (%s) and vm-c", ids, u)
	}
	if code := migrateAPI(t, h, "DELETE", "/v1/devices/vm-a", "", nil); code != http.StatusOK {
		t.Fatalf("DELETE vm-a: %d", code)
	}
	migrateAPI(t, h, "GET", "/v1/devices/vm-b", "", &infoB)
	if len(infoB.GIDs) == 0 || infoB.GIDs[0].GID != infoA.GID {
		t.Fatalf("vm-b's GIDs after vm-a's removal: %+v", infoB.GIDs)
	}
}

// waitChanged waits for d to signal a change (Daemon.Changed).
func waitChanged(t *testing.T, d *daemon.Daemon) {
	t.Helper()
	select {
	case <-d.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("no change signalled within 5 s")
	}
}

// stateIDs reads the state file in dir: device id → uuid.
func stateIDs(t *testing.T, dir string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, daemon.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Devices []controlapi.AddRequest `json:"devices"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("state file: %v\n%s", err, b)
	}
	ids := map[string]string{}
	for _, r := range doc.Devices {
		ids[r.ID] = r.UUID
	}
	return ids
}
