package tests

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma/roce"
	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/hostniclab"
	"github.com/vrdma/vrdma/internal/roceinterop"
	"github.com/vrdma/vrdma/internal/vrdmadproc"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/guestvm"
	"github.com/vrdma/vrdma/vmm/qemu"
)

// rdma_cm between a vrdma guest and an rxe guest: the addresses and the
// programs' ports.
const (
	cmRxeMAC   = "52:54:00:77:00:02" // the rxe guest's NIC (as in TestRoCEUDInterop)
	cmVrdmaMAC = "52:54:00:77:00:01" // the vrdma guest's NIC, paired with its device
	cmGSIQKey  = 0x80010000
	cmMADSize  = 256
	cmPings    = 100
)

// CM MAD attribute IDs (InfiniBand Architecture, Vol. 1, 12.11) at offset
// 16 of the MAD header; class 0x07 is the communication manager's.
const (
	madClassCM  = 0x07
	cmAttrREQ   = 0x0010
	cmAttrREJ   = 0x0012
	cmAttrREP   = 0x0013
	cmAttrRTU   = 0x0014
	cmAttrDREQ  = 0x0015
	cmAttrDREP  = 0x0016
	cmAttrSIDRQ = 0x0017
	cmAttrSIDRP = 0x0018
)

var cmAttrNames = map[uint16]string{
	cmAttrREQ: "REQ", 0x0011: "MRA", cmAttrREJ: "REJ", cmAttrREP: "REP", cmAttrRTU: "RTU",
	cmAttrDREQ: "DREQ", cmAttrDREP: "DREP", cmAttrSIDRQ: "SIDR_REQ", cmAttrSIDRP: "SIDR_REP",
}

// cmShellLib is shared by both guests' scripts. run runs a client and
// prints its stdout, each line prefixed with its tag, its stderr prefixed
// with "tag!", then "CM-RC tag rc" (the two streams go to files of their
// own: rping's stdout is buffered, its stderr is not, and one would cut
// the other's lines); show does the same for a server started in the
// background (so that two servers' lines never interleave); listening
// waits, bounded, until rdma_cm listens on each PS:PORT given (rdma
// resource's cm_id table): rping and udaddy (whose port is fixed, 7174)
// listen on the same number in the TCP and UDP port spaces.
const cmShellLib = `
show() {
	sed "s/^/$1| /" "/tmp/$1.out"
	sed "s/^/$1!| /" "/tmp/$1.err"
	echo "CM-RC $1 $2"
	[ "$2" = 0 ]
}
run() {
	tag=$1
	shift
	timeout 300 "$@" >"/tmp/$tag.out" 2>"/tmp/$tag.err"
	show "$tag" $?
}
listening() {
	for p in "$@"; do
		i=0
		until rdma resource show cm_id 2>/dev/null | grep -Eq "LISTEN ps ${p%%:*} .*:${p#*:}( |\$)"; do
			i=$((i + 1))
			[ "$i" -le 300 ] || { echo "CM-FAIL nothing listens on $p after 30 s"; rdma resource show cm_id; return 1; }
			sleep 0.1
		done
	done
}
`

// cmRxeJob is /extra/job.sh of the rxe guest (A: vrdmad's address, the
// vrdma guest's; B: the rxe guest's). rxe serves rping and ucmatose; once
// both ended it waits for the host's CM-GO (the vrdma guest's servers
// listen) on the protocol line, which rxe-init keeps open as fd 3, and
// runs rping's and udaddy's clients.
const cmRxeJob = `#!/bin/sh
A=%[1]s
B=%[2]s
` + cmShellLib + `
timeout 600 /extra/rping -s -a $B -p 7174 -C %[3]d -v -V >/tmp/rping-server.out 2>/tmp/rping-server.err &
rs=$!
timeout 600 /extra/ucmatose -b $B -p 7471 >/tmp/ucmatose-server.out 2>/tmp/ucmatose-server.err &
us=$!
listening TCP:7174 TCP:7471 || exit 1
echo "CM-LISTEN"
wait $rs
show rping-server $? || exit 1
wait $us
show ucmatose-server $? || exit 1
echo "CM-WAIT"
read -r -t 600 go <&3 || { echo "CM-FAIL no CM-GO from the host"; exit 1; }
run rping-client /extra/rping -c -a $A -p 7174 -C %[3]d -v -V || exit 1
run udaddy-client /extra/udaddy -s $A || exit 1
echo "CM-DONE"
`

// cmVrdmaJob is /extra/cm.sh of the vrdma guest: its eth0 carries A, the
// address vrdmad sends from, on a link of its own; B's neighbour entry is
// static, so the guest never needs eth0 to carry a frame (rdma_cm
// resolves B through it; every RoCE packet is vrdmad's, from A in h).
// Clients of rxe's rping and ucmatose first (they listen before this
// guest boots), then rping's and udaddy's servers for rxe's clients.
const cmVrdmaJob = `#!/bin/sh
A=%[1]s
B=%[2]s
` + cmShellLib + `
ip neigh replace $B lladdr %[4]s dev eth0 nud permanent || exit 1
rdma resource show qp link vrdma0/1 | sed 's/^/RES /'
run rping-client rping -c -a $B -p 7174 -C %[3]d -v -V || exit 1
run ucmatose-client ucmatose -s $B -p 7471 || exit 1
timeout 600 rping -s -a $A -p 7174 -C %[3]d -v -V >/tmp/rping-server.out 2>/tmp/rping-server.err &
rs=$!
timeout 600 udaddy -b $A >/tmp/udaddy-server.out 2>/tmp/udaddy-server.err &
ds=$!
listening TCP:7174 UDP:7174 || exit 1
echo "CM-LISTEN"
wait $rs
show rping-server $? || exit 1
wait $ds
show udaddy-server $? || exit 1
echo "CM-DONE"
`

// TestRoCECMInterop is rdma_cm over RoCEv2 between a vrdma guest and an
// rxe guest (issue 27): the standard-stack guest's kernel runs ib_mad,
// ib_cm and rdma_cm on its device's GSI QP, which vrdmad (in namespace h,
// --roce-bind A) attaches as QP 1 at A; Linux rxe in the interop lab's
// guest (B) runs its own. librdmacm's programs connect both ways: rping
// -C 100 -v -V (data validated by the client) with rxe serving and vrdma
// connecting, then the other way round, ucmatose (RC) with rxe serving,
// udaddy (UD, SIDR) with vrdma serving; every program exits 0 and each
// rping client prints its 100 validated pings.
//
// The vrdma guest's eth0 carries A itself, the device's network GID (its
// ADD_GID is allowed, docs/spec.md § "The GID table"), so that rdma_cm
// takes ::ffff:A as the source GID and the device sends from A; eth0 sits
// on a link of its own where nothing answers, and a static neighbour
// entry for B lets rdma_cm resolve B without ARP. A is answered for on
// the rxe link by h's interface only.
//
// QEMU's capture of the rxe guest's link holds the CM MADs: every
// datagram to QP 1 is a 256-byte UD SEND_ONLY with DETH source QP 1 and
// Q_Key 0x80010000, in both directions, with the CM's REQ, REP, RTU and
// SIDR exchange each way the programs connected; every RoCE frame's ICRC
// is good and tshark finds nothing malformed.
func TestRoCECMInterop(t *testing.T) {
	if testing.Short() {
		t.Skip("boots two TCG guests")
	}
	vrdmad := needBinary(t, "vrdmad")
	lab := newInteropLab(t)
	stackKernel := filepath.Join(lab.root, "bin", "guest-stack", "vmlinuz")
	stackInitrd := filepath.Join(lab.root, "bin", "guest-stack", "initramfs.img")
	var extra []hostniclab.File
	for _, p := range []string{"rping", "ucmatose", "udaddy"} {
		extra = append(extra, hostniclab.File{Name: "extra/" + p, Mode: 0o755, Data: stackBinary(t, lab.root, "usr/bin/"+p)})
	}
	// rping's threads end with pthread_exit, for which glibc loads
	// libgcc_s's unwinder; the rxe image (perftest's needs) has none.
	// Both images are Debian 12's.
	const libgcc = "lib/x86_64-linux-gnu/libgcc_s.so.1"
	extra = append(extra, hostniclab.File{Name: libgcc, Mode: 0o644, Data: stackBinary(t, lab.root, libgcc)})
	if _, err := os.Stat(stackKernel); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI: %v (make guest-stack-image)", err)
		}
		t.Skipf("%v (make guest-stack-image)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	d, err := lab.StartVrdmad(ctx, vrdmadproc.Config{Binary: vrdmad, StateDir: vrdmadproc.NoState})
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
	// No addresses assigned: the guest's only IPv4 GID is the network
	// GID of A, which the device may hold without an assignment.
	info, err := d.AddDevice(ctx, controlapi.AddRequest{ID: "cm", Socket: filepath.Join(d.Dir(), "cm.sock"), MAC: cmVrdmaMAC})
	if err != nil {
		t.Fatalf("%v\n%s", err, d.Log())
	}

	a, b := roceinterop.HostIP, roceinterop.GuestIP
	dir := t.TempDir()
	rxeInitrd := filepath.Join(dir, "rxe-initramfs.img")
	job := fmt.Sprintf(cmRxeJob, a, b, cmPings)
	if err := appendInitrd(rxeInitrd, lab.initrd, append(extra, hostniclab.File{Name: "extra/job.sh", Mode: 0o755, Data: []byte(job)})); err != nil {
		t.Fatal(err)
	}
	vrdmaInitrd := filepath.Join(dir, "stack-initramfs.img")
	script := fmt.Sprintf(cmVrdmaJob, a, b, cmPings, cmRxeMAC)
	if err := appendInitrd(vrdmaInitrd, stackInitrd, []hostniclab.File{{Name: "extra/cm.sh", Mode: 0o755, Data: []byte(script)}}); err != nil {
		t.Fatal(err)
	}
	dump := filepath.Join(dir, "cm.pcap")

	s := &cmSession{lab: lab, dump: dump, initrd: rxeInitrd}
	s.start(ctx)
	defer s.stop()
	if err := s.awaitRxe(ctx, "CM-LISTEN"); err != nil {
		t.Fatalf("rxe servers: %v\n=== rxe guest ===\n%s", err, s.rxeLog())
	}

	// The vrdma guest boots once rxe's servers listen, so its clients
	// need no retry.
	vcfg := guestvm.StackConfig{
		Name: "vrdma-cm", QEMU: lab.qemu, Kernel: stackKernel, Initrd: vrdmaInitrd,
		NIC: &qemu.NIC{ID: "net0", MAC: cmVrdmaMAC}, IP: netip.PrefixFrom(a, 24),
		Command: "sh /extra/cm.sh",
		Devices: []qemu.VhostUserDevice{{ID: "vrdma0", Socket: info.Socket, VirtioID: abi.DeviceID,
			NumVQs: info.NumQueues, VQSize: 256, ConfigSize: abi.ConfigSize}},
	}
	vg, err := guestvm.BootStack(ctx, vcfg)
	if err != nil {
		s.stop()
		t.Fatalf("boot the vrdma guest: %v\n=== rxe guest ===\n%s", err, s.rxeLog())
	}
	defer vg.Close()
	var vout strings.Builder
	listen := make(chan struct{})
	type vres struct {
		res guestvm.CommandResult
		err error
	}
	vdone := make(chan vres, 1)
	go func() {
		once := sync.Once{}
		res, err := vg.RunCommand(ctx, func(l guestvm.StackLine) {
			vout.WriteString(l.Text + "\n")
			if l.Command && l.Text == "CM-LISTEN" {
				once.Do(func() { close(listen) })
			}
		})
		vdone <- vres{res, err}
	}()
	failed := func(format string, args ...any) {
		t.Helper()
		cancel()
		vg.Close()
		s.stop()
		v := <-vdone
		t.Fatalf("%s\n=== vrdma guest (exit %d) ===\n%s\n=== rxe guest ===\n%s\n=== vrdmad ===\n%s",
			fmt.Sprintf(format, args...), v.res.ExitCode, vout.String(), s.rxeLog(), d.Log())
	}
	select {
	case <-listen:
	case v := <-vdone:
		vdone <- v
		failed("the vrdma guest ended before its servers listened: %v", v.err)
	case <-s.done:
		failed("the rxe guest ended before the vrdma guest's servers listened: %v", s.err)
	}
	if err := s.awaitRxe(ctx, "CM-WAIT"); err != nil {
		failed("rxe: %v", err)
	}
	if err := s.guest.WriteLine("CM-GO"); err != nil {
		failed("%v", err)
	}
	var v vres
	select {
	case v = <-vdone:
	case <-ctx.Done():
		failed("%v", ctx.Err())
	}
	if v.err != nil || v.res.ExitCode != 0 {
		vdone <- v
		failed("vrdma guest: exit %d: %v", v.res.ExitCode, v.err)
	}
	<-s.done
	if s.err != nil {
		vdone <- v
		failed("rxe guest: %v", s.err)
	}
	vlog, rlog := vout.String(), s.rxeLog()

	for _, c := range []struct{ who, out string }{{"vrdma", vlog}, {"rxe", rlog}} {
		for _, l := range strings.Split(c.out, "\n") {
			if strings.HasPrefix(l, "CM-RC ") && !strings.HasSuffix(l, " 0") {
				t.Errorf("%s: %s", c.who, l)
			}
		}
		// rping's client prints each ping it validated (-V).
		if n := len(regexp.MustCompile(`(?m)^rping-client\| ping data: rdma-ping-\d+: `).FindAllString(c.out, -1)); n != cmPings {
			t.Errorf("%s: the rping client printed %d validated pings, want %d", c.who, n, cmPings)
		}
	}
	for _, tag := range []string{"ucmatose-client", "udaddy-server"} {
		if !regexp.MustCompile(`(?m)^` + tag + `\| .*data transfers complete`).MatchString(vlog) {
			t.Errorf("vrdma: %s says no \"data transfers complete\"", tag)
		}
	}
	for _, tag := range []string{"ucmatose-server", "udaddy-client"} {
		if !regexp.MustCompile(`(?m)^` + tag + `\| .*data transfers complete`).MatchString(rlog) {
			t.Errorf("rxe: %s says no \"data transfers complete\"", tag)
		}
	}
	// The device's network GID is in the guest's table, and the kernel's
	// GSI QP is QP 1.
	if !regexp.MustCompile(`vrdma0 gid \d+ 0000:0000:0000:0000:0000:ffff:0ac8:4d01 RoCE v2`).MatchString(vlog) {
		t.Errorf("the vrdma guest's GID table lacks ::ffff:%s (RoCE v2):\n%s", a, grepLines(vlog, " gid "))
	}
	if !regexp.MustCompile(`(?m)^RES .*lqpn 1 .*type GSI`).MatchString(vlog) {
		t.Errorf("rdma resource shows no GSI QP 1:\n%s", grepLines(vlog, "RES "))
	}
	if !v.res.Exited || v.res.Rmmod != "ok" || len(v.res.KernelWarnings) != 0 {
		t.Errorf("vrdma guest: rmmod %q, kernel warnings %q", v.res.Rmmod, v.res.KernelWarnings)
	}
	if t.Failed() {
		t.Fatalf("=== vrdma guest ===\n%s\n=== rxe guest ===\n%s", vlog, rlog)
	}

	frames, err := roceinterop.ReadCapture(dump)
	if err != nil {
		t.Fatal(err)
	}
	got, err := cmMADs(frames, a, b)
	if err != nil {
		t.Fatal(err)
	}
	// The exchanges each side must have sent: rping and ucmatose connect
	// to rxe (REQ from vrdma, REP from rxe, RTU from vrdma), rping to
	// vrdma (REQ from rxe, REP, RTU), udaddy to vrdma (SIDR).
	want := map[cmDir]int{
		{true, cmAttrREQ}: 2, {false, cmAttrREP}: 2, {true, cmAttrRTU}: 2,
		{false, cmAttrREQ}: 1, {true, cmAttrREP}: 1, {false, cmAttrRTU}: 1,
		{false, cmAttrSIDRQ}: 1, {true, cmAttrSIDRP}: 1,
	}
	for k, n := range want {
		if got[k] < n {
			t.Errorf("%s: %d CM MADs, want at least %d (all: %v)", k, got[k], n, got)
		}
	}
	if got[cmDir{true, cmAttrREJ}]+got[cmDir{false, cmAttrREJ}] != 0 {
		t.Errorf("connections rejected: %v", got)
	}
	if err := roceinterop.CheckTshark(lab.tshark, dump, len(frames)); err != nil {
		t.Fatal(err)
	}
	t.Logf("rping -C %d -v -V both ways, ucmatose rxe→vrdma, udaddy vrdma→rxe; %d RoCE frames captured (CM MADs %v), every ICRC good, tshark: none malformed",
		cmPings, len(frames), got)
}

// cmDir is a CM MAD's attribute and whether the vrdma side sent it.
type cmDir struct {
	fromVrdma bool
	attr      uint16
}

func (k cmDir) String() string {
	name, ok := cmAttrNames[k.attr]
	if !ok {
		name = fmt.Sprintf("attribute %#04x", k.attr)
	}
	if k.fromVrdma {
		return "vrdma→rxe " + name
	}
	return "rxe→vrdma " + name
}

// cmMADs checks the capture's datagrams of the GSI QPs and counts the CM
// MADs by direction and attribute: every packet to QP 1 or from source QP
// 1 is a UD SEND_ONLY between a (vrdma) and b (rxe) from QP 1 to QP 1
// with the GSI Q_Key, carrying one MAD of the CM class.
func cmMADs(frames []roceinterop.Frame, a, b netip.Addr) (map[cmDir]int, error) {
	got := map[cmDir]int{}
	for i, f := range frames {
		p := &f.Packet
		gsi := p.BTH.DestQP == 1 || p.BTH.Opcode == roce.OpUDSendOnly && p.DETH.SrcQP == 1
		if !gsi {
			continue
		}
		fromVrdma := f.Src == a && f.Dst == b
		if !fromVrdma && !(f.Src == b && f.Dst == a) {
			return nil, fmt.Errorf("frame %d: GSI datagram %v→%v, want between %v and %v", i, f.Src, f.Dst, a, b)
		}
		if p.BTH.Opcode != roce.OpUDSendOnly || p.BTH.DestQP != 1 || p.DETH.SrcQP != 1 || p.DETH.QKey != cmGSIQKey || len(p.Payload) != cmMADSize {
			return nil, fmt.Errorf("frame %d (%v→%v): %v to QP %#x from QP %#x, Q_Key %#x, %d bytes: want UD SEND_ONLY from QP 1 to QP 1, Q_Key %#x, %d bytes",
				i, f.Src, f.Dst, p.BTH.Opcode, p.BTH.DestQP, p.DETH.SrcQP, p.DETH.QKey, len(p.Payload), cmGSIQKey, cmMADSize)
		}
		if p.Payload[0] != 1 || p.Payload[1] != madClassCM {
			return nil, fmt.Errorf("frame %d (%v→%v): MAD base version %d class %#x, want 1 and the CM's %#x", i, f.Src, f.Dst, p.Payload[0], p.Payload[1], madClassCM)
		}
		got[cmDir{fromVrdma, binary.BigEndian.Uint16(p.Payload[16:])}]++
	}
	return got, nil
}

// cmSession is the rxe guest of TestRoCECMInterop, booted in the lab's
// namespace g with its link captured.
type cmSession struct {
	lab          *interopLab
	dump, initrd string

	guest  *guestvm.Guest // set before ready closes
	ready  chan struct{}  // closed once guest is set, or done
	done   chan struct{}  // closed when the guest ended
	err    error          // the guest's end; read after done
	log    string         // its console; read after done
	cancel context.CancelFunc
}

func (s *cmSession) start(ctx context.Context) {
	s.ready, s.done = make(chan struct{}), make(chan struct{})
	ctx, s.cancel = context.WithCancel(ctx)
	cfg := guestvm.Config{
		Name: "rxe-cm-interop", QEMU: s.lab.qemu, Kernel: s.lab.kernel, Initrd: s.initrd,
		SMP: 1, HugePages: 1, Run: "exec", Append: "rxe.ip=" + roceinterop.GuestIP.String() + " rxe.gid=1",
		ExtraQEMUArgs: []string{
			"-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=n0,romfile=,mac=" + cmRxeMAC,
			"-object", "filter-dump,id=dump0,netdev=n0,file=" + s.dump + ",maxlen=65536",
		},
	}
	go func() {
		defer close(s.done)
		readyOnce := sync.Once{}
		defer readyOnce.Do(func() { close(s.ready) })
		// QEMU starts on g's thread and lives in g; its Pdeathsig is tied
		// to that thread, so the guest's whole life runs inside Do.
		s.err = s.lab.g.Do(func() error {
			ctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
			defer cancel()
			g, err := guestvm.Boot(ctx, cfg)
			if err != nil {
				return err
			}
			defer g.Close()
			s.guest = g
			readyOnce.Do(func() { close(s.ready) })
			_, err = g.WaitResult(ctx)
			s.log = g.Log()
			return err
		})
	}()
}

// awaitRxe waits for the rxe guest's console line want.
func (s *cmSession) awaitRxe(ctx context.Context, want string) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if s.guest == nil {
		<-s.done
		return fmt.Errorf("the rxe guest did not boot: %v", s.err)
	}
	for l := range s.guest.Lines() {
		if strings.TrimSpace(l) == want {
			return nil
		}
	}
	<-s.done
	return fmt.Errorf("the rxe guest ended before %q: %v", want, s.err)
}

// rxeLog is the rxe guest's console: the whole log once it ended, else
// what it printed so far.
func (s *cmSession) rxeLog() string {
	select {
	case <-s.done:
		return s.log
	default:
	}
	select {
	case <-s.ready:
		if s.guest != nil {
			return s.guest.Console()
		}
	default:
	}
	return ""
}

// stop ends the rxe guest (if it still runs) and waits for its end.
func (s *cmSession) stop() {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
}
