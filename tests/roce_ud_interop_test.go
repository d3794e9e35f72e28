package tests

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/hostniclab"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/guestvm"
)

// UD ping-pong with rxe: ibv_ud_pingpong's parameters on both sides.
const (
	udppQKey  = 0x11111111 // ud_pingpong's Q_Key
	udppSize  = 1024       // ≤ rxe's active MTU on a 1500-byte link
	udppIters = 100
)

// udppJob is /extra/job.sh in the rxe guest: ibv_ud_pingpong -c as the
// server (the vrdma side connects), then as the client of HostIP. Its
// own check ("invalid data in page") fails the job.
const udppJob = `#!/bin/sh
run() {
	out=$(/extra/ibv_ud_pingpong -d rxe0 -g 1 -s %[1]d -n %[2]d -c "$@" 2>&1)
	rc=$?
	echo "$out"
	[ $rc = 0 ] || { echo "VRDMA-ERROR ibv_ud_pingpong $*: exit $rc"; exit 1; }
	case "$out" in
	*"invalid data"*) echo "VRDMA-ERROR ibv_ud_pingpong $*: invalid data"; exit 1 ;;
	*"%[2]d iters in"*) ;;
	*) echo "VRDMA-ERROR ibv_ud_pingpong $*: no summary"; exit 1 ;;
	esac
}
echo "UD-PINGPONG rxe server"
run
echo "UD-PINGPONG rxe client"
run %[3]s
exit 0
`

// TestRoCEUDInterop is UD over RoCEv2 against Linux rxe (docs/wire.md §
// 12): vrdmad in namespace h serves a device opened with guest/verbs
// (internal/roceinterop), and the rxe guest in g runs Debian's
// ibv_ud_pingpong -c twice: as the server, answering our UD QP's pings,
// then as the client, pinging ours. The vrdma side speaks ud_pingpong's
// TCP exchange (LID:QPN:PSN:GID), uses its Q_Key and sizes, and checks
// more than ud_pingpong does: every datagram it receives carries the GRH
// of the packet rxe sent (the rxe GID as source, ours as destination),
// src_qp rxe's QP and the payload expected (as client: the bytes it sent,
// echoed by rxe; as server: rxe's fill, which it echoes back for rxe's -c
// check). QEMU's capture of the guest's link holds exactly the 4 ×
// iterations UD SEND_ONLY packets, each with a good ICRC, the DETH's
// Q_Key and the source QPs of the exchange; tshark finds nothing
// malformed.
func TestRoCEUDInterop(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a TCG guest")
	}
	vrdmad := needBinary(t, "vrdmad")
	lab := newInteropLab(t)
	pingpong := stackBinary(t, lab.root, "usr/bin/ibv_ud_pingpong")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	d, err := lab.StartVrdmad(ctx, vrdmadproc.Config{Binary: vrdmad, Devices: []string{"interop"}, StateDir: vrdmadproc.NoState})
	if errors.Is(err, roceinterop.ErrNoRoCEBind) && os.Getenv("CI") == "" {
		t.Skipf("%v (make build)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("%v", err)
		}
	})
	dev, err := roceinterop.OpenDevice(ctx, d.Socket("interop"), interopGoIP, 0)
	if err != nil {
		t.Fatalf("%v\n%s", err, d.Log())
	}
	defer dev.Close()
	ln, err := lab.Listen() // before the guest's client phase can start
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	dir := t.TempDir()
	initrd := filepath.Join(dir, "initramfs.img")
	job := fmt.Sprintf(udppJob, udppSize, udppIters, roceinterop.HostIP)
	if err := appendInitrd(initrd, lab.initrd, []hostniclab.File{
		{Name: "extra/job.sh", Mode: 0o755, Data: []byte(job)},
		{Name: "extra/ibv_ud_pingpong", Mode: 0o755, Data: pingpong},
	}); err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(dir, "ud.pcap")
	gcfg := guestvm.Config{
		Name: "rxe-ud-interop", QEMU: lab.qemu, Kernel: lab.kernel, Initrd: initrd,
		SMP: 1, HugePages: 1, Run: "exec", Append: "rxe.ip=" + roceinterop.GuestIP.String() + " rxe.gid=1",
		ExtraQEMUArgs: []string{
			"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=n0,romfile=,mac=52:54:00:77:00:02",
			"-object", "filter-dump,id=dump0,netdev=n0,file=" + dump + ",maxlen=65536",
		},
	}
	type guestOut struct {
		log string
		err error
	}
	done := make(chan guestOut, 1)
	// The guest's end ends our waits for it: the dial of its server and
	// the accept of its client.
	ended := make(chan struct{})
	gctx, gcancel := context.WithCancel(ctx)
	defer gcancel()
	go func() {
		<-ended
		gcancel()
		ln.Close()
	}()
	go func() {
		defer close(ended)
		var o guestOut
		o.err = lab.g.Do(func() error {
			ctx, cancel := context.WithTimeout(ctx, roceinterop.GuestTimeout)
			defer cancel()
			g, err := guestvm.Boot(ctx, gcfg)
			if err != nil {
				return err
			}
			defer g.Close()
			_, err = g.WaitResult(ctx)
			o.log = g.Log()
			return err
		})
		done <- o
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		cancel()
		o := <-done
		t.Fatalf("%s\n=== rxe guest ===\n%s\n=== vrdmad ===\n%s", fmt.Sprintf(format, args...), o.log, d.Log())
	}

	u, err := newUDPP(dev)
	if err != nil {
		fail("vrdma UD QP: %v", err)
	}
	// Phase 1: rxe serves, we ping.
	conn, err := lab.Dial(gctx)
	if err != nil {
		fail("%v", err)
	}
	peer1, err := u.exchange(conn, true)
	conn.Close()
	if err != nil {
		fail("exchange with the rxe server: %v", err)
	}
	if err := u.pingpong(peer1, true); err != nil {
		fail("ping-pong with the rxe server: %v", err)
	}
	// Phase 2: rxe pings, we serve.
	u2, err := newUDPP(dev)
	if err != nil {
		fail("vrdma UD QP: %v", err)
	}
	conn, err = acceptCtx(gctx, ln)
	if err != nil {
		fail("accept the rxe client: %v", err)
	}
	peer2, err := u2.exchange(conn, false)
	conn.Close()
	if err != nil {
		fail("exchange with the rxe client: %v", err)
	}
	if err := u2.pingpong(peer2, false); err != nil {
		fail("ping-pong with the rxe client: %v", err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("rxe guest: %v\n%s\n=== vrdmad ===\n%s", o.err, o.log, d.Log())
	}
	for _, l := range strings.Split(o.log, "\n") {
		if strings.Contains(l, "iters in") || strings.Contains(l, "remote address") {
			t.Logf("rxe: %s", strings.TrimSpace(l))
		}
	}

	frames, err := roceinterop.ReadCapture(dump)
	if err != nil {
		t.Fatal(err)
	}
	want := map[[2]uint32]int{ // (DestQP, SrcQP) → datagrams
		{peer1.qpn, u.qp.Num()}: udppIters, {u.qp.Num(), peer1.qpn}: udppIters,
		{peer2.qpn, u2.qp.Num()}: udppIters, {u2.qp.Num(), peer2.qpn}: udppIters,
	}
	got := map[[2]uint32]int{}
	for i, f := range frames {
		p := &f.Packet
		if p.BTH.Opcode != roce.OpUDSendOnly || p.DETH.QKey != udppQKey || len(p.Payload) != udppSize || f.IPv6 {
			t.Fatalf("frame %d: %v→%v %v Q_Key %#x, %d bytes: want UD SEND_ONLY over IPv4, Q_Key %#x, %d bytes",
				i, f.Src, f.Dst, p.BTH.Opcode, p.DETH.QKey, len(p.Payload), udppQKey, udppSize)
		}
		got[[2]uint32{p.BTH.DestQP, p.DETH.SrcQP}]++
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("QP %#x from QP %#x: %d datagrams captured, want %d (all: %v)", k[0], k[1], got[k], n, got)
		}
	}
	if err := roceinterop.CheckTshark(lab.tshark, dump, len(frames)); err != nil {
		t.Fatal(err)
	}
	t.Logf("ibv_ud_pingpong -c both ways, %d × %d bytes each; %d UD frames captured, every ICRC good, tshark: none malformed",
		udppIters, udppSize, len(frames))
}

// stackBinary returns the file at path (relative, as in the image) of the
// standard-stack guest image bin/guest-stack/initramfs.img (make
// guest-stack-image), a gzip'd newc archive.
func stackBinary(t *testing.T, root, path string) []byte {
	t.Helper()
	img := filepath.Join(root, "bin", "guest-stack", "initramfs.img")
	f, err := os.Open(img)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: %v", err)
		}
		t.Skipf("%v (make guest-stack-image)", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", img, err)
	}
	data, err := newcFile(zr, path)
	if err != nil {
		t.Fatalf("%s: %v", img, err)
	}
	return data
}

// newcFile reads a newc (070701) archive up to its trailer and returns
// the regular file named name.
func newcFile(r io.Reader, name string) ([]byte, error) {
	var hdr [110]byte
	var off int64
	skip := func(n int64) error {
		_, err := io.CopyN(io.Discard, r, n)
		off += n
		return err
	}
	for range 1 << 20 {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return nil, err
		}
		off += 110
		if string(hdr[:6]) != "070701" {
			return nil, fmt.Errorf("not a newc header at %d", off-110)
		}
		field := func(i int) (int64, error) { return strconv.ParseInt(string(hdr[6+8*i:14+8*i]), 16, 64) }
		mode, err1 := field(1)
		size, err2 := field(6)
		nlen, err3 := field(11)
		if err := errors.Join(err1, err2, err3); err != nil || nlen < 1 || nlen > 4096 || size < 0 || size > 1<<30 {
			return nil, fmt.Errorf("bad newc header at %d: %v", off-110, err)
		}
		nb := make([]byte, nlen)
		if _, err := io.ReadFull(r, nb); err != nil {
			return nil, err
		}
		off += nlen
		if err := skip(-off & 3); err != nil {
			return nil, err
		}
		n := string(bytes.TrimRight(nb, "\x00"))
		if n == "TRAILER!!!" {
			return nil, fmt.Errorf("no %s", name)
		}
		if strings.TrimPrefix(n, "./") == name && mode&0o170000 == 0o100000 {
			data := make([]byte, size)
			_, err := io.ReadFull(r, data)
			return data, err
		}
		if err := skip(size + (-(off + size) & 3)); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("no %s", name)
}

// appendInitrd writes base with a newc archive of extra appended (the
// kernel unpacks concatenated archives in order).
func appendInitrd(dst, base string, extra []hostniclab.File) error {
	b, err := os.ReadFile(base)
	if err != nil {
		return err
	}
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	buf := bytes.NewBuffer(b)
	if err := hostniclab.WriteNewc(buf, extra); err != nil {
		return err
	}
	return os.WriteFile(dst, buf.Bytes(), 0o644)
}

func acceptCtx(ctx context.Context, ln net.Listener) (net.Conn, error) {
	if tl, ok := ln.(*net.TCPListener); ok {
		if dl, ok := ctx.Deadline(); ok {
			tl.SetDeadline(dl)
		}
	}
	return ln.Accept()
}

// udpp is our side of ibv_ud_pingpong: a UD QP with ud_pingpong's Q_Key,
// a buffer of 40 + size bytes for the receive and one for the send.
type udpp struct {
	dev *roceinterop.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	buf *verbs.Buffer
	mr  *verbs.MR
}

// udppPeer is what the exchange told of the other side.
type udppPeer struct {
	qpn uint32
	gid [16]byte
}

func newUDPP(dev *roceinterop.Device) (*udpp, error) {
	u := &udpp{dev: dev}
	var err error
	if u.pd, err = dev.Ctx.AllocPD(); err != nil {
		return nil, err
	}
	if u.cq, err = dev.Ctx.CreateCQ(16); err != nil {
		return nil, err
	}
	if u.qp, err = u.pd.CreateQP(verbs.QPInitAttr{Type: abi.QPTypeUD, SendCQ: u.cq, RecvCQ: u.cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	if err := u.qp.ReadyUD(udppQKey); err != nil {
		return nil, err
	}
	if u.buf, err = dev.Ctx.AllocBuffer(8192); err != nil {
		return nil, err
	}
	if u.mr, err = u.pd.RegMR(u.buf, 0, 8192, abi.AccessLocalWrite); err != nil {
		return nil, err
	}
	// The receive for the first datagram, before the exchange tells the
	// peer our QP number.
	return u, u.postRecv()
}

func (u *udpp) postRecv() error {
	return u.qp.PostRecv(verbs.RecvWR{WRID: 1, SGL: []abi.SGE{u.mr.SGE(0, 40+udppSize)}})
}

// exchange is ud_pingpong's TCP exchange: "LID:QPN:PSN:GID" (52 bytes
// with the NUL, the GID as 32 hex digits in wire order), the client's
// first, then the server's, then the client's "done".
func (u *udpp) exchange(conn net.Conn, client bool) (udppPeer, error) {
	conn.SetDeadline(time.Now().Add(3 * time.Minute))
	var msg [52]byte
	copy(msg[:], fmt.Sprintf("%04x:%06x:%06x:%s", 0, u.qp.Num(), u.qp.PSN(), hex.EncodeToString(u.dev.GID[:])))
	var in [52]byte
	if client {
		if _, err := conn.Write(msg[:]); err != nil {
			return udppPeer{}, err
		}
		if _, err := io.ReadFull(conn, in[:]); err != nil {
			return udppPeer{}, err
		}
		if _, err := conn.Write([]byte("done\x00")); err != nil {
			return udppPeer{}, err
		}
	} else {
		if _, err := io.ReadFull(conn, in[:]); err != nil {
			return udppPeer{}, err
		}
		if _, err := conn.Write(msg[:]); err != nil {
			return udppPeer{}, err
		}
		var done [5]byte
		if _, err := io.ReadFull(conn, done[:]); err != nil {
			return udppPeer{}, err
		}
	}
	f := strings.Split(string(bytes.TrimRight(in[:], "\x00")), ":")
	if len(f) != 4 {
		return udppPeer{}, fmt.Errorf("exchange: %q", in[:])
	}
	qpn, err := strconv.ParseUint(f[1], 16, 24)
	if err != nil {
		return udppPeer{}, fmt.Errorf("exchange: QPN %q: %w", f[1], err)
	}
	g, err := hex.DecodeString(f[3])
	if err != nil || len(g) != 16 {
		return udppPeer{}, fmt.Errorf("exchange: GID %q", f[3])
	}
	return udppPeer{qpn: uint32(qpn), gid: [16]byte(g)}, nil
}

// pingpong runs the iterations: as the client we send first and check
// that each pong carries our ping's bytes; as the server we answer each
// ping with its own bytes (ud_pingpong's server sends its receive buffer
// back). Every receive must carry the GRH of rxe's packet and its QP.
func (u *udpp) pingpong(peer udppPeer, client bool) error {
	ah, err := u.pd.CreateAH(verbs.AHAttr{DGID: peer.gid, SGIDIndex: uint32(u.dev.GIDIndex)})
	if err != nil {
		return fmt.Errorf("create AH to %x: %w", peer.gid, err)
	}
	defer ah.Destroy()
	b := u.mr.Bytes()
	send := func(i int) error {
		if client {
			// Varied bytes, but 0 at each page's start: what
			// ud_pingpong -c's server checks of the last ping.
			for k := range udppSize {
				b[4096+k] = byte(i*31 + k*7 + k>>8)
				if k%4096 == 0 {
					b[4096+k] = 0
				}
			}
		}
		return u.qp.PostSend(verbs.SendWR{WRID: 2, Opcode: abi.WROpSend, Flags: abi.WRFlagSignaled,
			SGL: []abi.SGE{u.mr.SGE(4096, udppSize)}, AH: ah, RemoteQPN: peer.qpn, RemoteQKey: udppQKey})
	}
	if client {
		if err := send(0); err != nil {
			return err
		}
	}
	// Counted as ud_pingpong counts: the completions of a poll may be a
	// send and the next receive.
	rcnt, scnt := 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for rcnt < udppIters || scnt < udppIters {
		var wc [2]verbs.WC
		n, err := u.cq.Poll(wc[:])
		if err != nil {
			return err
		}
		if n == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("no completion in 30 s after %d sends and %d receives", scnt, rcnt)
			}
			time.Sleep(20 * time.Microsecond)
			continue
		}
		deadline = time.Now().Add(30 * time.Second)
		for _, c := range wc[:n] {
			if c.Status != abi.WCSuccess {
				return fmt.Errorf("after %d sends and %d receives: %+v", scnt, rcnt, c)
			}
			if c.WRID == 2 {
				scnt++
				continue
			}
			i := rcnt
			rcnt++
			if rcnt > udppIters {
				return fmt.Errorf("receive %d: more than the %d pings", rcnt, udppIters)
			}
			if c.ByteLen != 40+udppSize || c.Flags&abi.WCFlagGRH == 0 || c.SrcQP != peer.qpn {
				return fmt.Errorf("receive %d: %+v, want %d bytes with GRH from QP %#x", i, c, 40+udppSize, peer.qpn)
			}
			g, err := verbs.ParseGRH(b[:40])
			if err != nil || g.SGID != peer.gid || g.DGID != u.dev.GID {
				return fmt.Errorf("receive %d: GRH %x (%+v, %v), want %x → %x", i, b[:40], g, err, peer.gid, u.dev.GID)
			}
			if client && !bytes.Equal(b[40:40+udppSize], b[4096:4096+udppSize]) {
				return fmt.Errorf("receive %d: the pong's payload is not the ping's", i)
			}
			if !client {
				copy(b[4096:4096+udppSize], b[40:40+udppSize])
			}
			if err := u.postRecv(); err != nil {
				return err
			}
			if !client || rcnt < udppIters {
				if err := send(rcnt); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
