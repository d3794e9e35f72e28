package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// rdmaPeer is one device's front-end with a PD, a CQ, an RC QP and an MR.
type rdmaPeer struct {
	ctx *verbs.Context
	gid [16]byte
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
}

// openPeer adds device id to h's daemon and opens it through a Go
// virtio-user front-end.
func openPeer(t *testing.T, h http.Handler, id string) *rdmaPeer {
	t.Helper()
	sock := filepath.Join(t.TempDir(), id+".sock")
	if code, out := call(t, h, "POST", "/v1/devices", addBody(id, sock, "")); code != http.StatusCreated {
		t.Fatalf("POST %s: got %d %v", id, code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, sock, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		f.Close()
	})
	p := &rdmaPeer{ctx: c}
	if p.gid, err = c.QueryGID(); err != nil {
		t.Fatal(err)
	}
	if p.pd, err = c.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if p.cq, err = c.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if p.qp, err = p.pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		t.Fatal(err)
	}
	buf, err := c.AllocBuffer(64 << 10)
	if err != nil {
		t.Fatal(err)
	}
	if p.mr, err = p.pd.RegMR(buf, 0, 64<<10, abi.AccessAll); err != nil {
		t.Fatal(err)
	}
	return p
}

// pollWC waits for one completion on cq.
func pollWC(t *testing.T, cq *verbs.CQ) verbs.WC {
	t.Helper()
	var wc [1]verbs.WC
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Microsecond) {
		n, err := cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return wc[0]
		}
	}
	t.Fatal("no completion within 5 s")
	return verbs.WC{}
}

// getList runs a GET whose answer is a JSON array, decoded into out.
func getList(t *testing.T, h http.Handler, path string, out any) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: got %d %s, want 200", path, rec.Code, rec.Body)
	}
	if err := json.Unmarshal(rec.Body.Bytes(), out); err != nil {
		t.Fatalf("GET %s: %v in %s", path, err, rec.Body)
	}
	return rec
}

// TestResourceViews connects two devices' QPs, moves data, provokes a
// remote access error with a bad rkey, and reads every view: objects,
// peers, keys, pinned bytes, and the error counted on both QPs.
func TestResourceViews(t *testing.T) {
	d, h := testDaemon(t)
	a, b := openPeer(t, h, "a"), openPeer(t, h, "b")
	rw := abi.AccessRemoteWrite | abi.AccessRemoteRead
	if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), rw); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), rw); err != nil {
		t.Fatal(err)
	}
	write := func(wrid uint64, rkey uint32) verbs.WC {
		if err := a.qp.PostSend(verbs.SendWR{WRID: wrid, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{a.mr.SGE(0, 4096)}, RemoteAddr: b.mr.Addr, RKey: rkey}); err != nil {
			t.Fatal(err)
		}
		return pollWC(t, a.cq)
	}
	if wc := write(1, b.mr.RKey); wc.Status != abi.WCSuccess {
		t.Fatalf("good WRITE: got %v, want success", wc.Status)
	}
	var before []controlapi.QPInfo
	getList(t, h, "/v1/devices/a/qps", &before)
	if len(before) != 1 || len(before[0].Errors.Completions) != 0 || before[0].State != "RTS" {
		t.Fatalf("a's QPs before the error: got %+v, want one in RTS without errors", before)
	}
	if wc := write(2, b.mr.RKey^0x100); wc.Status != abi.WCRemAccessErr {
		t.Fatalf("bad-rkey WRITE: got %v, want REM_ACCESS_ERR", wc.Status)
	}

	var qa, qb []controlapi.QPInfo
	getList(t, h, "/v1/devices/a/qps", &qa)
	getList(t, h, "/v1/devices/b/qps", &qb)
	if len(qa) != 1 || len(qb) != 1 {
		t.Fatalf("QPs: got %d and %d, want 1 each", len(qa), len(qb))
	}
	q := qa[0]
	bgid := strings.TrimSpace(controlapiGID(b.gid))
	if q.Device != "a" || q.QPN != a.qp.Num() || q.Type != "RC" || q.State != "ERR" || q.PD != a.pd.Num() ||
		q.SendCQ != a.cq.Num() || q.RecvCQ != a.cq.Num() || q.Transport != "local" || q.DestGID != bgid ||
		q.DestQPN != b.qp.Num() || q.SQPSN == nil || *q.SQPSN != a.qp.PSN() || q.PathMTU == 0 {
		t.Errorf("a's QP: got %+v, want RC in ERR on PD %d CQ %d, peer %s QP %d, sq_psn %d", q, a.pd.Num(), a.cq.Num(), bgid, b.qp.Num(), a.qp.PSN())
	}
	if n := q.Errors.Completions["rem_access_err"]; n != 1 {
		t.Errorf("a's QP: completions %v, want rem_access_err 1", q.Errors.Completions)
	}
	if n := qb[0].Errors.Responder["rem_access_err"]; n != 1 || qb[0].State != "ERR" {
		t.Errorf("b's QP: state %s responder errors %v, want ERR, rem_access_err 1", qb[0].State, qb[0].Errors.Responder)
	}

	var mrs []controlapi.MRInfo
	getList(t, h, "/v1/devices/b/mrs", &mrs)
	if len(mrs) != 1 {
		t.Fatalf("b's MRs: got %d, want 1", len(mrs))
	}
	if m := mrs[0]; m.LKey != b.mr.LKey || m.RKey != b.mr.RKey || m.Length != 64<<10 || m.IOVA != b.mr.Addr || m.PD != b.pd.Num() ||
		m.PinnedBytes < 64<<10 || m.Type != "user" || m.State != "valid" || strings.Join(m.Access, ",") != "local_write,remote_write,remote_read,remote_atomic" {
		t.Errorf("b's MR: got %+v, want keys %#x/%#x, 64 KiB at %#x pinned, every access", m, b.mr.LKey, b.mr.RKey, b.mr.Addr)
	}
	var cqs []controlapi.CQInfo
	getList(t, h, "/v1/devices/a/cqs", &cqs)
	if len(cqs) != 1 || cqs[0].CQN != a.cq.Num() || cqs[0].CQE < 64 || cqs[0].Completions != 2 || cqs[0].ErrorCompletions != 1 ||
		cqs[0].Pending != 0 || cqs[0].QPs != 1 || cqs[0].Overrun {
		t.Errorf("a's CQs: got %+v, want CQ %d with 2 completions, 1 in error, none pending", cqs, a.cq.Num())
	}
	var pds []controlapi.PDInfo
	getList(t, h, "/v1/devices/a/pds", &pds)
	if len(pds) != 1 || pds[0] != (controlapi.PDInfo{Device: "a", PDN: a.pd.Num(), MRs: 1, QPs: 1}) {
		t.Errorf("a's PDs: got %+v, want PD %d with 1 MR and 1 QP", pds, a.pd.Num())
	}
	for _, k := range []string{"srqs", "mws"} {
		var none []any
		if getList(t, h, "/v1/devices/a/"+k, &none); none == nil || len(none) != 0 {
			t.Errorf("a's %s: got %v, want []", k, none)
		}
	}

	var counts []controlapi.ResourceCount
	getList(t, h, "/v1/resources", &counts)
	want := controlapi.ResourceCount{Device: "a", Connected: true, PDs: 1, MRs: 1, CQs: 1, QPs: 1}
	if len(counts) != 2 || counts[0] != want || counts[1].Device != "b" {
		t.Errorf("resources: got %+v, want a (%+v) and b", counts, want)
	}
	var all []controlapi.QPInfo
	getList(t, h, "/v1/resources/qps", &all)
	if len(all) != 2 || all[0].Device != "a" || all[1].Device != "b" || all[1].QPN != b.qp.Num() {
		t.Errorf("every QP: got %+v, want a's then b's", all)
	}

	// Pages of one across devices: a Link to the next, none after the last.
	var p1, p2 []controlapi.QPInfo
	rec := getList(t, h, "/v1/resources/qps?limit=1", &p1)
	next, err := controlapi.NextPage(rec.Header())
	if err != nil || next == "" || len(p1) != 1 || p1[0].Device != "a" {
		t.Fatalf("first page: got %+v, next %q, %v; want a's QP and a next page", p1, next, err)
	}
	rec = getList(t, h, next, &p2)
	if n, _ := controlapi.NextPage(rec.Header()); n != "" || len(p2) != 1 || p2[0].Device != "b" {
		t.Errorf("second page: got %+v, next %q; want b's QP and no next page", p2, n)
	}

	// The client follows the pages over the control socket.
	sock := filepath.Join(t.TempDir(), "control.sock")
	if err := d.ServeControl(sock); err != nil {
		t.Fatal(err)
	}
	got, err := controlapi.New(sock).QPs(context.Background(), "")
	if err != nil || len(got) != 2 {
		t.Errorf("Client.QPs: got %d QPs, %v; want 2", len(got), err)
	}
}

// controlapiGID is a GID as the control API writes it.
func controlapiGID(g [16]byte) string { return gidString(g) }

// TestResourceRequests: what the views refuse.
func TestResourceRequests(t *testing.T) {
	_, h := testDaemon(t)
	if code, out := call(t, h, "POST", "/v1/devices", addBody("a", filepath.Join(t.TempDir(), "a.sock"), "")); code != http.StatusCreated {
		t.Fatalf("POST: got %d %v", code, out)
	}
	for _, tt := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/v1/devices/a/qps", 200},
		{"HEAD", "/v1/devices/a/qps", 200},
		{"GET", "/v1/devices/a/qps?limit=5000&after=0x10", 200},
		{"GET", "/v1/devices/nope/qps", 404},
		{"GET", "/v1/devices/a/things", 404},
		{"GET", "/v1/resources/things", 404},
		{"GET", "/v1/devices/a/qps?limit=0", 400},
		{"GET", "/v1/devices/a/qps?limit=5001", 400},
		{"GET", "/v1/devices/a/qps?limit=x", 400},
		{"GET", "/v1/devices/a/qps?after=4294967296", 400},
		{"GET", "/v1/devices/a/qps?after=1&after=2", 400},
		{"GET", "/v1/devices/a/qps?offset=3", 400},
		{"GET", "/v1/resources/qps?after=17", 400},
		{"GET", "/v1/resources/qps?after=a:17", 200},
		{"GET", "/v1/resources/qps?after=%2F:17", 400},
		{"GET", "/v1/resources?limit=1", 400},
		{"POST", "/v1/devices/a/qps", 405},
		{"DELETE", "/v1/resources", 405},
		{"PUT", "/v1/resources/qps", 405},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.path, nil))
		if rec.Code != tt.code {
			t.Errorf("%s %s: got %d %s, want %d", tt.method, tt.path, rec.Code, rec.Body, tt.code)
		}
		if tt.code == 405 && rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s %s: Allow %q, want GET, HEAD", tt.method, tt.path, rec.Header().Get("Allow"))
		}
	}
}

func FuzzPageQuery(f *testing.F) {
	f.Add("limit=10&after=0x20", true)
	f.Add("after=vm1:17", true)
	f.Fuzz(func(t *testing.T, query string, cross bool) {
		r := httptest.NewRequest("GET", "/v1/resources/qps", nil)
		r.URL.RawQuery = query
		id, after, limit, err := pageQuery(r, cross)
		if err != nil {
			if id != "" || after != 0 || limit != 0 {
				t.Fatalf("error %v with %q %d %d", err, id, after, limit)
			}
			return
		}
		if limit < 1 || limit > controlapi.MaxPageLimit || (id != "" && (!cross || checkID(id) != nil)) {
			t.Fatalf("accepted %q: %q %d %d", query, id, after, limit)
		}
	})
}
