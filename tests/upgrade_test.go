package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// Live upgrade of vrdmad (issue 29, docs/state.md): a verified RDMA
// stream between two devices of a vrdmad process goes on while the daemon
// hands its devices over to a new process, twice; and a take-over the new
// process refuses leaves the old one serving.

// upgStream is verified traffic from a to b: each round b posts a receive,
// a sends a 64-byte message stamped with the round and writes 64 bytes of
// the round's pattern into b's buffer, and both are checked when they
// complete. It records the longest pause between two rounds.
type upgStream struct {
	a, b   *peer
	rounds atomic.Uint64
	maxGap atomic.Int64 // ns
	stop   chan struct{}
	done   chan struct{}
	err    error // written before done is closed
}

const (
	streamMsg      = 64
	streamRecvOff  = 4096  // b's receive slots: 8 of streamMsg bytes
	streamWriteOff = 32768 // b's WRITE slots: 64 of streamMsg bytes
	// streamPoll bounds the wait for one completion: longer than any
	// handover takes (a new process starts and maps every guest memory).
	streamPoll = 60 * time.Second
)

func startStream(a, b *peer) *upgStream {
	s := &upgStream{a: a, b: b, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = s.run()
	}()
	return s
}

// pattern fills p with round r's bytes.
func pattern(p []byte, r uint64) {
	for i := range p {
		p[i] = byte(r*131 + uint64(i)*7 + 1)
	}
}

func (s *upgStream) run() error {
	a, b := s.a, s.b
	want := make([]byte, streamMsg)
	last := time.Now()
	for r := uint64(0); ; r++ {
		select {
		case <-s.stop:
			return nil
		default:
		}
		slot := int(r % 8)
		recvOff := streamRecvOff + slot*streamMsg
		writeOff := streamWriteOff + int(r%64)*streamMsg
		if err := b.qp.PostRecv(verbs.RecvWR{WRID: r, SGL: []abi.SGE{b.mr.SGE(recvOff, streamMsg)}}); err != nil {
			return fmt.Errorf("round %d: post recv: %w", r, err)
		}
		src := a.mr.Bytes()[slot*streamMsg : (slot+1)*streamMsg]
		pattern(src, r)
		copy(want, src)
		if err := a.qp.PostSend(
			verbs.SendWR{WRID: 2 * r, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{a.mr.SGE(slot*streamMsg, streamMsg)}},
			verbs.SendWR{WRID: 2*r + 1, Opcode: abi.WROpRDMAWrite, Flags: abi.WRFlagSignaled, SGL: []abi.SGE{a.mr.SGE(slot*streamMsg, streamMsg)},
				RemoteAddr: b.mr.Addr + uint64(writeOff), RKey: b.mr.RKey}); err != nil {
			return fmt.Errorf("round %d: post send: %w", r, err)
		}
		for _, id := range []uint64{2 * r, 2*r + 1} {
			wc, err := pollWC(a.cq, streamPoll)
			if err != nil {
				return fmt.Errorf("round %d: sender: %w", r, err)
			}
			if wc.Status != abi.WCSuccess || wc.WRID != id {
				return fmt.Errorf("round %d: sender completion %+v, want wr %d successful", r, wc, id)
			}
		}
		wc, err := pollWC(b.cq, streamPoll)
		if err != nil {
			return fmt.Errorf("round %d: receiver: %w", r, err)
		}
		if wc.Status != abi.WCSuccess || wc.WRID != r || wc.ByteLen != streamMsg {
			return fmt.Errorf("round %d: receive completion %+v", r, wc)
		}
		if got := b.mr.Bytes()[recvOff : recvOff+streamMsg]; !bytes.Equal(got, want) {
			return fmt.Errorf("round %d: received bytes differ from the sent ones", r)
		}
		if got := b.mr.Bytes()[writeOff : writeOff+streamMsg]; !bytes.Equal(got, want) {
			return fmt.Errorf("round %d: written bytes differ from the source", r)
		}
		now := time.Now()
		if g := now.Sub(last); int64(g) > s.maxGap.Load() {
			s.maxGap.Store(int64(g))
		}
		last = now
		s.rounds.Add(1)
	}
}

// waitRounds waits until the stream has done n more rounds than now.
func (s *upgStream) waitRounds(t *testing.T, n uint64) {
	t.Helper()
	target := s.rounds.Load() + n
	deadline := time.Now().Add(2 * streamPoll)
	for s.rounds.Load() < target {
		select {
		case <-s.done:
			t.Fatalf("the stream ended after %d rounds: %v", s.rounds.Load(), s.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream is stuck at round %d", s.rounds.Load())
		}
		time.Sleep(time.Millisecond)
	}
}

// end stops the stream and returns its error.
func (s *upgStream) end() error {
	close(s.stop)
	<-s.done
	return s.err
}

// pollWC waits up to timeout for one completion on cq.
func pollWC(cq *verbs.CQ, timeout time.Duration) (verbs.WC, error) {
	var wc [1]verbs.WC
	deadline := time.Now().Add(timeout)
	for {
		n, err := cq.Poll(wc[:])
		if err != nil {
			return verbs.WC{}, err
		}
		if n == 1 {
			return wc[0], nil
		}
		if time.Now().After(deadline) {
			return verbs.WC{}, fmt.Errorf("no completion within %v", timeout)
		}
		time.Sleep(10 * time.Microsecond)
	}
}

// noAsyncEvent fails if the device sent p's driver an async event.
func noAsyncEvent(t *testing.T, name string, p *peer) {
	t.Helper()
	if ev, err := p.ctx.GetAsyncEvent(50 * time.Millisecond); err == nil {
		t.Errorf("%s: async event %+v: the guest noticed", name, ev)
	}
}

// procLevels are what a vrdmad process holds: eventfds, guest memory
// files, sockets (the control API's connections come and go with its
// clients), locked (pinned) memory and resident memory.
type procLevels struct{ eventfds, memfds, sockets, lockedKB, rssKB int }

func levelsOf(t *testing.T, pid int) procLevels {
	t.Helper()
	dir := "/proc/" + strconv.Itoa(pid)
	ents, err := os.ReadDir(dir + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile(dir + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var l procLevels
	for _, e := range ents {
		target, _ := os.Readlink(filepath.Join(dir, "fd", e.Name()))
		switch {
		case target == "anon_inode:[eventfd]":
			l.eventfds++
		case strings.HasPrefix(target, "/memfd:"):
			l.memfds++
		case strings.HasPrefix(target, "socket:"):
			l.sockets++
		}
	}
	for _, line := range strings.Split(string(st), "\n") {
		fmt.Sscanf(line, "VmLck: %d kB", &l.lockedKB)
		fmt.Sscanf(line, "VmRSS: %d kB", &l.rssKB)
	}
	return l
}

// upgradeRig is a vrdmad process with devices a and b, a peer on each
// connected by RC, and a stream between them.
type upgradeRig struct {
	p    *vrdmadproc.Proc
	a, b *peer
	s    *upgStream
}

func startUpgradeRig(t *testing.T, env ...string) *upgradeRig {
	t.Helper()
	bin := needBinary(t, "vrdmad")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := vrdmadproc.Start(ctx, vrdmadproc.Config{Binary: bin, Devices: []string{"a", "b"}, Env: env,
		Args: []string{"--metrics", "unix:" + filepath.Join(t.TempDir(), "metrics.sock")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stop vrdmad: %v", err)
		}
		if t.Failed() {
			t.Logf("vrdmad's log:\n%s", p.Log())
		}
	})
	r := &upgradeRig{p: p}
	r.a, r.b = openPeer(t, p.Socket("a"), 0), openPeer(t, p.Socket("b"), 0)
	if err := r.a.qp.ConnectRC(r.b.gid, r.b.qp.Num(), r.b.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := r.b.qp.ConnectRC(r.a.gid, r.a.qp.Num(), r.a.qp.PSN(), abi.AccessAll&^abi.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	r.s = startStream(r.a, r.b)
	r.s.waitRounds(t, 50)
	return r
}

// finish stops the stream, checks it and that no guest noticed, and
// tears the peers down (every object destroyed by the daemon that serves
// them now).
func (r *upgradeRig) finish(t *testing.T) {
	t.Helper()
	if err := r.s.end(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	noAsyncEvent(t, "a", r.a)
	noAsyncEvent(t, "b", r.b)
	r.a.teardown(t)
	r.b.teardown(t)
}

func TestDaemonUpgrade(t *testing.T) {
	r := startUpgradeRig(t)
	// The binary handed over to first is another file, as a package
	// upgrade puts one in place; the second upgrade takes the file at the
	// running daemon's own path (that copy) by default.
	newBin := filepath.Join(t.TempDir(), "vrdmad-new")
	b, err := os.ReadFile(needBinary(t, "vrdmad"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newBin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	base := levelsOf(t, r.p.Pid())
	if base.eventfds == 0 || base.memfds == 0 || base.lockedKB == 0 {
		t.Fatalf("vrdmad holds %+v: no guest's descriptors or pins to compare", base)
	}
	qpA, qpB := r.a.qp.Num(), r.b.qp.Num()
	for i, bin := range []string{newBin, ""} {
		old := r.p.Pid()
		ctx, cancel := context.WithTimeout(context.Background(), controlapi.UpgradeTimeout)
		ans, err := r.p.Upgrade(ctx, bin)
		cancel()
		if err != nil {
			t.Fatalf("upgrade %d: %v", i+1, err)
		}
		if ans.PID == old || ans.PID != r.p.Pid() || ans.Binary != newBin || ans.Devices != 2 || ans.Connected != 2 {
			t.Fatalf("upgrade %d: answer %+v (old pid %d, binary %s)", i+1, ans, old, newBin)
		}
		t.Logf("upgrade %d: pid %d -> %d, data paths paused %.1f ms, state %d bytes", i+1, old, ans.PID, ans.PauseMS, ans.StateBytes)
		r.s.waitRounds(t, 50)
		// What the new process holds is what the old one did: the same
		// descriptors, the same pinned memory (nothing unpinned, nothing
		// pinned twice).
		lv := levelsOf(t, r.p.Pid())
		if lv.eventfds != base.eventfds || lv.memfds != base.memfds || lv.sockets > base.sockets || lv.lockedKB != base.lockedKB {
			t.Errorf("upgrade %d: %+v; before the first upgrade %+v", i+1, lv, base)
		}
		if lv.rssKB > 2*base.rssKB+16<<10 {
			t.Errorf("upgrade %d: RSS %d kB, %d kB before the first upgrade", i+1, lv.rssKB, base.rssKB)
		}
	}
	if r.a.qp.Num() != qpA || r.b.qp.Num() != qpB {
		t.Fatal("QP numbers changed")
	}
	// The control API is the new process's, with both devices connected.
	infos, err := r.p.Client().Devices(context.Background())
	if err != nil || len(infos) != 2 {
		t.Fatalf("devices after the upgrades: %v, %v", infos, err)
	}
	for _, in := range infos {
		if !in.Connected {
			t.Errorf("device %s is not connected after the upgrades", in.ID)
		}
	}
	t.Logf("stream: %d rounds, longest pause %v", r.s.rounds.Load(), time.Duration(r.s.maxGap.Load()))
	r.finish(t)
}

// TestDaemonUpgradeRefused: the new process cannot read the state (its
// version is newer than it knows), refuses, and the old daemon goes on
// serving the same stream; vrdmactl says so with exit status 4.
func TestDaemonUpgradeRefused(t *testing.T) {
	r := startUpgradeRig(t, "VRDMAD_TEST_HANDOVER_VERSION=99")
	old := r.p.Pid()
	var stderr bytes.Buffer
	cmd := exec.Command(needBinary(t, "vrdmactl"), "--control", r.p.Control(), "daemon", "upgrade")
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 4 {
		t.Fatalf("vrdmactl daemon upgrade: %v, want exit status 4; stderr: %s", err, stderr.String())
	}
	if msg := stderr.String(); !strings.Contains(msg, "version 99") {
		t.Errorf("vrdmactl's error does not say why: %s", msg)
	}
	if r.p.Pid() != old {
		t.Fatal("the daemon changed")
	}
	r.s.waitRounds(t, 50)
	if _, err := r.p.Client().Devices(context.Background()); err != nil {
		t.Errorf("control API after a refused upgrade: %v", err)
	}
	r.finish(t)
}
