package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// soakPeer is one front-end of the soak: a device opened over
// virtio-user with a PD, CQ, QP and a registered buffer.
type soakPeer struct {
	ctx *verbs.Context
	f   *frontend.Frontend
	gid [16]byte
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	buf *verbs.Buffer
	mr  *verbs.MR
}

const soakBuf = 256 << 10

func openSoakPeer(sock string) (*soakPeer, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, sock, 32<<20)
	if err != nil {
		return nil, err
	}
	p := &soakPeer{ctx: c, f: f}
	fail := func(err error) (*soakPeer, error) { p.close(); return nil, err }
	if p.gid, err = c.QueryGID(); err != nil {
		return fail(err)
	}
	if p.pd, err = c.AllocPD(); err != nil {
		return fail(err)
	}
	if p.cq, err = c.CreateCQ(64); err != nil {
		return fail(err)
	}
	if p.qp, err = p.pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 2}}); err != nil {
		return fail(err)
	}
	if p.buf, err = c.AllocBuffer(soakBuf); err != nil {
		return fail(err)
	}
	if p.mr, err = p.pd.RegMR(p.buf, 0, soakBuf, abi.AccessAll); err != nil {
		return fail(err)
	}
	return p, nil
}

func (p *soakPeer) close() {
	if p.ctx != nil {
		p.ctx.Close()
	}
	p.f.Close()
}

// wait polls one completion of p, bounded.
func (p *soakPeer) wait() (verbs.WC, error) {
	wc := make([]verbs.WC, 1)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		n, err := p.cq.Poll(wc)
		if err != nil {
			return verbs.WC{}, err
		}
		if n == 1 {
			return wc[0], nil
		}
	}
	return verbs.WC{}, errors.New("no completion in 10 s")
}

// soakDuration is how long TestSoak runs: $VRDMA_SOAK (make soak: 10m;
// make test: 60s). Without it the test is skipped: it is a soak, not a
// unit test, and make test runs it on its own.
func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv("VRDMA_SOAK")
	if v == "" {
		t.Skip("VRDMA_SOAK not set (make soak, or make test's soak step)")
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("VRDMA_SOAK=%q: want a duration", v)
	}
	return d
}

// TestSoak runs a bounded random mix of verified RDMA operations, object
// churn and faults (a front-end dropped mid-operation, then reconnected)
// across 4 devices (two pairs) of one daemon, and reports operations done,
// faults injected and anything lost — an operation between two live
// front-ends that failed or delivered wrong bytes — which must be 0.
func TestSoak(t *testing.T) {
	dur := soakDuration(t)
	hygiene(t)
	d, socks := startDaemon(t, 4)
	seed := time.Now().UnixNano()
	rng := rand.New(rand.NewSource(seed))
	t.Logf("soak: %v, seed %d", dur, seed)

	peers := make([]*soakPeer, 4)
	connectPair := func(i int) {
		a, b := peers[2*i], peers[2*i+1]
		if err := a.qp.ConnectRC(b.gid, b.qp.Num(), b.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
			t.Fatalf("connect: %v", err)
		}
		if err := b.qp.ConnectRC(a.gid, a.qp.Num(), a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
			t.Fatalf("connect: %v", err)
		}
	}
	openPair := func(i int) {
		for k := 2 * i; k < 2*i+2; k++ {
			if peers[k] != nil {
				peers[k].close()
			}
			p, err := openSoakPeer(socks[k])
			if err != nil {
				t.Fatalf("open device %d: %v", k, err)
			}
			peers[k] = p
		}
		connectPair(i)
	}
	openPair(0)
	openPair(1)
	defer func() {
		for _, p := range peers {
			p.close()
		}
	}()

	var ops, faults, churn, lost uint64
	ops0 := map[int]string{abi.WROpRDMAWrite: "write", abi.WROpRDMARead: "read", abi.WROpSend: "send", abi.WROpAtomicFetchAdd: "fetch_add"}
	opcodes := []int{abi.WROpRDMAWrite, abi.WROpRDMARead, abi.WROpSend, abi.WROpAtomicFetchAdd}
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		pi := rng.Intn(2)
		a, b := peers[2*pi], peers[2*pi+1]
		if rng.Intn(2) == 1 {
			a, b = b, a
		}
		switch x := rng.Intn(100); {
		case x < 5: // fault: drop b's front-end while a's write is in flight
			faults++
			err := a.qp.PostSend(verbs.SendWR{WRID: 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled,
				SGL: []abi.SGE{a.mr.SGE(0, soakBuf)}, RemoteAddr: b.mr.Addr, RKey: b.mr.RKey})
			b.close()
			if err == nil {
				if _, err := a.wait(); err != nil {
					lost++ // a request must complete (in error, here), never hang
					t.Errorf("fault %d: %s: %v", faults, ops0[abi.WROpRDMAWrite], err)
				}
			}
			openPair(pi)
		case x < 10: // churn: an extra MR registered and deregistered
			churn++
			mr, err := a.pd.RegMR(a.buf, 4096, 8192, abi.AccessLocalWrite)
			if err == nil {
				err = mr.Dereg()
			}
			if err != nil {
				lost++
				t.Errorf("churn: %v", err)
			}
		default:
			op := opcodes[rng.Intn(len(opcodes))]
			ops++
			if err := soakOp(rng, a, b, op); err != nil {
				lost++
				t.Errorf("op %d (%s): %v", ops, ops0[op], err)
				openPair(pi) // start the pair afresh and go on
			}
		}
		if lost > 10 {
			t.Fatal("too many losses; stopping")
		}
	}
	in := fmt.Sprintf("soak: %d operations verified, %d faults injected, %d object churns, %d lost (seed %d)", ops, faults, churn, lost, seed)
	t.Log(in)
	fmt.Println(in)
	os.WriteFile(filepath.Join(repoRoot(t), "bin", "soak-summary.txt"), []byte(in+"\n"), 0o644)
	for _, p := range peers {
		p.close()
	}
	for i := range socks {
		waitReleased(t, d, fmt.Sprintf("dev%d", i))
	}
	if lost != 0 {
		t.Fatalf("%d operations lost", lost)
	}
}

// soakOp runs one operation of random size from a to b and verifies it.
func soakOp(rng *rand.Rand, a, b *soakPeer, op int) error {
	n := 1 + rng.Intn(soakBuf/2)
	src, dst := a.buf.Bytes, b.buf.Bytes
	seed := byte(rng.Intn(256))
	wr := verbs.SendWR{WRID: 7, Opcode: op, Flags: abi.WRFlagSignaled}
	switch op {
	case abi.WROpRDMAWrite:
		fillSeed(src[:n], seed)
		wr.SGL, wr.RemoteAddr, wr.RKey = []abi.SGE{a.mr.SGE(0, n)}, b.mr.Addr, b.mr.RKey
	case abi.WROpRDMARead:
		fillSeed(dst[:n], seed)
		wr.SGL, wr.RemoteAddr, wr.RKey = []abi.SGE{a.mr.SGE(0, n)}, b.mr.Addr, b.mr.RKey
	case abi.WROpSend:
		fillSeed(src[:n], seed)
		if err := b.qp.PostRecv(verbs.RecvWR{WRID: 9, SGL: []abi.SGE{b.mr.SGE(0, soakBuf)}}); err != nil {
			return err
		}
		wr.SGL = []abi.SGE{a.mr.SGE(0, n)}
	case abi.WROpAtomicFetchAdd:
		binary.LittleEndian.PutUint64(dst[:8], 1000)
		wr.SGL, wr.RemoteAddr, wr.RKey, wr.CompareAdd = []abi.SGE{a.mr.SGE(0, 8)}, b.mr.Addr, b.mr.RKey, 5
	}
	if err := a.qp.PostSend(wr); err != nil {
		return err
	}
	wc, err := a.wait()
	if err != nil {
		return err
	}
	if wc.Status != abi.WCSuccess {
		return fmt.Errorf("completion status %d", wc.Status)
	}
	if op == abi.WROpSend {
		rwc, err := b.wait()
		if err != nil {
			return err
		}
		if rwc.Status != abi.WCSuccess || int(rwc.ByteLen) != n {
			return fmt.Errorf("receive completion %+v, want %d bytes", rwc, n)
		}
	}
	want := make([]byte, n)
	fillSeed(want, seed)
	switch op {
	case abi.WROpRDMAWrite, abi.WROpSend:
		if !bytes.Equal(dst[:n], want) {
			return errors.New("bytes at the responder differ from what was sent")
		}
	case abi.WROpRDMARead:
		if !bytes.Equal(src[:n], want) {
			return errors.New("bytes read differ from the responder's")
		}
	case abi.WROpAtomicFetchAdd:
		if got := binary.LittleEndian.Uint64(src[:8]); got != 1000 {
			return fmt.Errorf("fetch-add returned %d, want 1000", got)
		}
		if got := binary.LittleEndian.Uint64(dst[:8]); got != 1005 {
			return fmt.Errorf("fetch-add left %d, want 1005", got)
		}
	}
	return nil
}

func fillSeed(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}
