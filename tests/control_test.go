package tests

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// startDaemonWith runs an in-process daemon with one device configured by
// cfg and dcfg.
func startDaemonWith(t *testing.T, dcfg daemon.Config, cfg rdma.Config) (*daemon.Daemon, string) {
	t.Helper()
	d := daemon.New(testLogger(t), dcfg)
	sock := filepath.Join(t.TempDir(), "dev.sock")
	if _, err := d.AddDevice(daemon.DeviceSpec{ID: "dev0", Socket: sock, Device: cfg}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, sock
}

func openRDMA(t *testing.T, sock string, mem uint64) (*verbs.Context, *frontend.Frontend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, f, err := frontend.OpenRDMA(ctx, sock, mem)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		f.Close()
	})
	return c, f
}

func info(t *testing.T, d *daemon.Daemon) daemon.DeviceInfo {
	t.Helper()
	dv, ok := d.Device("dev0")
	if !ok {
		t.Fatal("device dev0 gone")
	}
	return dv.Info()
}

// waitPinned waits until the device's pinned bytes satisfy ok.
func waitPinned(t *testing.T, d *daemon.Daemon, ok func(uint64) bool, what string) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p := info(t, d).PinnedBytes
		if ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pinned bytes %d: want %s", p, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPinOnDemand: a 1 GiB guest that registers 4 MiB has about 4 MiB
// pinned (plus its rings), not 1 GiB; with --pin=all it has all of it; when
// the front-end goes away nothing stays pinned.
func TestPinOnDemand(t *testing.T) {
	const guest = 1 << 30
	const mrSize = 4 << 20
	for _, all := range []bool{false, true} {
		name := "on-demand"
		if all {
			name = "all"
		}
		t.Run(name, func(t *testing.T) {
			hygiene(t)
			d, sock := startDaemonWith(t, daemon.Config{Pin: memmap.PinConfig{All: all}}, rdma.Config{})
			c, f := openRDMA(t, sock, guest)
			pd, err := c.AllocPD()
			if err != nil {
				t.Fatal(err)
			}
			buf, err := c.AllocBuffer(mrSize)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pd.RegMR(buf, 0, mrSize, abi.AccessAll); err != nil {
				t.Fatal(err)
			}
			cq, err := c.CreateCQ(256)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2}}); err != nil {
				t.Fatal(err)
			}
			got := info(t, d)
			t.Logf("guest %d MiB, MR %d MiB: pinned %d bytes (pin=%s)", guest>>20, mrSize>>20, got.PinnedBytes, name)
			if all {
				if got.PinnedBytes < guest {
					t.Fatalf("pin=all: pinned %d bytes, want at least the whole guest (%d)", got.PinnedBytes, guest)
				}
			} else if got.PinnedBytes < mrSize || got.PinnedBytes > mrSize+(1<<20) {
				t.Fatalf("on demand: pinned %d bytes, want the MR's %d plus rings (under 1 MiB)", got.PinnedBytes, mrSize)
			}
			if got.MRs != 1 || got.QPs != 1 || got.CQs != 1 || got.PDs != 1 {
				t.Fatalf("resources: %+v", got)
			}
			c.Close()
			f.Close()
			waitPinned(t, d, func(p uint64) bool { return p == 0 }, "0 after the front-end left")
			if p := d.PinnedBytes(); p != 0 {
				t.Fatalf("daemon-wide pinned bytes %d after the front-end left", p)
			}
		})
	}
}

// TestPinQuota: a registration over the device's quota fails with QUOTA,
// pins nothing and leaves the device working.
func TestPinQuota(t *testing.T) {
	hygiene(t)
	d, sock := startDaemonWith(t, daemon.Config{Pin: memmap.PinConfig{MaxPinned: 2 << 20}}, rdma.Config{})
	c, _ := openRDMA(t, sock, 64<<20)
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	big, err := c.AllocBuffer(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	before := info(t, d)
	_, err = pd.RegMR(big, 0, 4<<20, abi.AccessLocalWrite)
	var ce *verbs.CommandError
	if !errors.As(err, &ce) || ce.Status != abi.StatusQuota {
		t.Fatalf("REG_MR over quota: got %v, want status QUOTA", err)
	}
	after := info(t, d)
	if after.PinnedBytes != before.PinnedBytes || after.MRs != before.MRs {
		t.Fatalf("a refused REG_MR changed the device: %+v -> %+v", before, after)
	}
	if _, err := pd.RegMR(big, 0, 1<<20, abi.AccessLocalWrite); err != nil {
		t.Fatalf("REG_MR under quota after a refusal: %v", err)
	}
}

// cmd runs one raw control command and returns its status and payload.
func cmd(t *testing.T, f *frontend.Frontend, op abi.Opcode, payload []byte, respLen int) (abi.Status, []byte) {
	t.Helper()
	req := append(abi.Marshal(&abi.CmdHeader{Opcode: uint16(op)}), payload...)
	resp, err := f.Exec(abi.ControlQueue, req, abi.RespHeaderSize+respLen, cmdTimeout)
	if err != nil {
		t.Fatalf("%v: %v", op, err)
	}
	if len(resp) < abi.RespHeaderSize {
		t.Fatalf("%v: response of %d bytes", op, len(resp))
	}
	return abi.Status(binary.LittleEndian.Uint32(resp)), resp[abi.RespHeaderSize:]
}

func handleOf(t *testing.T, b []byte) uint32 {
	var h abi.Handle
	if err := abi.Unmarshal(b, &h); err != nil {
		t.Fatal(err)
	}
	return h.Handle
}

// TestMalformedCommands: every malformed or disallowed command gets its
// error status, creates nothing and leaves the device serving.
func TestMalformedCommands(t *testing.T) {
	hygiene(t)
	d, socks := startDaemon(t, 2)
	f := dial(t, socks[0], frontend.Config{MemorySize: 16 << 20, QueueSize: 64})
	if err := f.Start(abi.ControlQueue); err != nil {
		t.Fatal(err)
	}
	st, out := cmd(t, f, abi.CmdCreatePD, nil, 8)
	if st != abi.StatusOK {
		t.Fatalf("CREATE_PD: %v", st)
	}
	pdn := handleOf(t, out)
	gpa, _, err := f.Alloc(8192, 4096)
	if err != nil {
		t.Fatal(err)
	}
	page := func(p uint64) []byte { return binary.LittleEndian.AppendUint64(nil, p) }
	regMR := func(m abi.RegMR, pages ...uint64) []byte {
		b := abi.Marshal(&m)
		for _, p := range pages {
			b = append(b, page(p)...)
		}
		return b
	}
	good := abi.RegMR{PDN: pdn, Access: abi.AccessLocalWrite, IOVA: uint64(gpa), Length: 4096, PageShift: 12, NPages: 1}
	with := func(fn func(*abi.RegMR)) abi.RegMR { m := good; fn(&m); return m }
	handle := func(h uint32) []byte { return abi.Marshal(&abi.Handle{Handle: h}) }
	cqReq := func(c abi.CreateCQ) []byte { return append(abi.Marshal(&c), page(uint64(gpa))...) }

	cases := []struct {
		name    string
		op      abi.Opcode
		payload []byte
		want    abi.Status
	}{
		{"unknown opcode", abi.Opcode(77), nil, abi.StatusUnsupported},
		{"CREATE_PD with a payload", abi.CmdCreatePD, []byte{1}, abi.StatusInvalid},
		{"QUERY_DEVICE with a payload", abi.CmdQueryDevice, []byte{0, 0}, abi.StatusInvalid},
		{"QUERY_PORT of port 2", abi.CmdQueryPort, abi.Marshal(&abi.PortReq{PortNum: 2}), abi.StatusInvalid},
		{"QUERY_GID index past the table", abi.CmdQueryGID, abi.Marshal(&abi.GIDReq{PortNum: 1, Index: abi.GIDTableLen}), abi.StatusInvalid},
		{"DESTROY_PD of an unknown PD", abi.CmdDestroyPD, handle(pdn ^ 0xff), abi.StatusNotFound},
		{"DESTROY_PD truncated", abi.CmdDestroyPD, handle(pdn)[:6], abi.StatusInvalid},
		{"DESTROY_PD reserved bits", abi.CmdDestroyPD, abi.Marshal(&abi.Handle{Handle: pdn, Reserved: 1}), abi.StatusInvalid},
		{"REG_MR in an unknown PD", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.PDN ^= 0xff }), uint64(gpa)), abi.StatusNotFound},
		{"REG_MR page shift 16", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.PageShift = 16 }), uint64(gpa)), abi.StatusInvalid},
		{"REG_MR npages disagrees", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.NPages = 2 }), uint64(gpa), uint64(gpa)), abi.StatusInvalid},
		{"REG_MR page list shorter than npages", abi.CmdRegMR, regMR(good), abi.StatusInvalid},
		{"REG_MR unaligned page", abi.CmdRegMR, regMR(good, uint64(gpa)+8), abi.StatusInvalid},
		{"REG_MR page outside guest memory", abi.CmdRegMR, regMR(good, 1<<40), abi.StatusFault},
		{"REG_MR length zero", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.Length = 0 }), uint64(gpa)), abi.StatusInvalid},
		{"REG_MR iova+length overflows", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.IOVA = ^uint64(0) - 100 }), uint64(gpa)), abi.StatusInvalid},
		{"REG_MR remote write without local write", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.Access = abi.AccessRemoteWrite }), uint64(gpa)), abi.StatusInvalid},
		{"REG_MR unknown access bits", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.Access = 0x100 }), uint64(gpa)), abi.StatusInvalid},
		{"REG_MR indirect list outside memory", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.PageList = 1 << 40 })), abi.StatusFault},
		{"REG_MR reserved", abi.CmdRegMR, regMR(with(func(m *abi.RegMR) { m.Reserved = 1 }), uint64(gpa)), abi.StatusInvalid},
		{"DEREG_MR of an unknown key", abi.CmdDeregMR, handle(0x1234), abi.StatusNotFound},
		{"CREATE_CQ size not a power of two", abi.CmdCreateCQ, cqReq(abi.CreateCQ{CQE: 100, NPages: 1, Record: uint64(gpa) + 4096}), abi.StatusInvalid},
		{"CREATE_CQ unaligned record", abi.CmdCreateCQ, cqReq(abi.CreateCQ{CQE: 64, NPages: 1, Record: uint64(gpa) + 4097}), abi.StatusInvalid},
		{"CREATE_CQ record outside memory", abi.CmdCreateCQ, cqReq(abi.CreateCQ{CQE: 64, NPages: 1, Record: 1 << 40}), abi.StatusFault},
		{"CREATE_CQ too many entries", abi.CmdCreateCQ, cqReq(abi.CreateCQ{CQE: 1 << 30, NPages: 1, Record: uint64(gpa) + 4096}), abi.StatusInvalid},
		{"CREATE_QP with unknown CQs", abi.CmdCreateQP, append(abi.Marshal(&abi.CreateQP{PDN: pdn, QPType: abi.QPTypeRC, MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, SQWQEShift: 7, RQWQEShift: 5, SQNPages: 1, RQNPages: 1, Record: uint64(gpa)}), make([]byte, 16)...), abi.StatusNotFound},
		{"CREATE_QP with unknown flags", abi.CmdCreateQP, abi.Marshal(&abi.CreateQP{PDN: pdn, QPType: abi.QPTypeRC, Flags: 4}), abi.StatusInvalid},
		{"CREATE_QP with SRQ in an 80-byte request", abi.CmdCreateQP, abi.Marshal(&abi.CreateQP{PDN: pdn, QPType: abi.QPTypeRC, Flags: abi.QPFlagSRQ})[:abi.CreateQPV1Size], abi.StatusInvalid},
		{"CREATE_QP with srqn but no SRQ flag", abi.CmdCreateQP, abi.Marshal(&abi.CreateQP{PDN: pdn, QPType: abi.QPTypeRC, SRQN: 7}), abi.StatusInvalid},
		{"CREATE_QP of type UC", abi.CmdCreateQP, abi.Marshal(&abi.CreateQP{PDN: pdn, QPType: 3}), abi.StatusUnsupported},
		{"MODIFY_QP of an unknown QP", abi.CmdModifyQP, abi.Marshal(&abi.QPAttr{QPN: 99, AttrMask: abi.QPAttrState, QPState: abi.QPSInit}), abi.StatusNotFound},
		{"QUERY_QP of an unknown QP", abi.CmdQueryQP, handle(99), abi.StatusNotFound},
		{"REQ_NOTIFY_CQ of an unknown CQ", abi.CmdReqNotifyCQ, abi.Marshal(&abi.NotifyCQ{CQN: 99}), abi.StatusNotFound},
		{"CREATE_AH on port 2", abi.CmdCreateAH, abi.Marshal(&abi.CreateAH{PDN: pdn, PortNum: 2}), abi.StatusInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := info(t, d)
			st, _ := cmd(t, f, tc.op, tc.payload, 256)
			if st != tc.want {
				t.Fatalf("status %v, want %v", st, tc.want)
			}
			if after := info(t, d); after.PDs != before.PDs || after.MRs != before.MRs ||
				after.CQs != before.CQs || after.QPs != before.QPs || after.AHs != before.AHs ||
				after.PinnedBytes != before.PinnedBytes {
				t.Fatalf("a failed command changed the device: %+v -> %+v", before, after)
			}
		})
	}
	// A non-zero flags field in the header is INVALID.
	req := abi.Marshal(&abi.CmdHeader{Opcode: uint16(abi.CmdCreatePD), Flags: 1})
	resp, err := f.Exec(abi.ControlQueue, req, 16, cmdTimeout)
	if err != nil || abi.Status(binary.LittleEndian.Uint32(resp)) != abi.StatusInvalid {
		t.Fatalf("header flags: resp %x, err %v", resp, err)
	}
	// A PD with an MR is busy; after DEREG_MR it goes.
	st, out = cmd(t, f, abi.CmdRegMR, regMR(good, uint64(gpa)), 8)
	if st != abi.StatusOK {
		t.Fatalf("REG_MR: %v", st)
	}
	var keys abi.MRKeys
	abi.Unmarshal(out, &keys)
	if st, _ := cmd(t, f, abi.CmdDestroyPD, handle(pdn), 0); st != abi.StatusBusy {
		t.Fatalf("DESTROY_PD with an MR: %v, want BUSY", st)
	}
	if st, _ := cmd(t, f, abi.CmdDeregMR, handle(keys.LKey), 0); st != abi.StatusOK {
		t.Fatalf("DEREG_MR: %v", st)
	}
	if st, _ := cmd(t, f, abi.CmdDestroyPD, handle(pdn), 0); st != abi.StatusOK {
		t.Fatalf("DESTROY_PD: %v", st)
	}
	bystanderOK(t, socks[1])
}

// TestLimits: creating beyond a device limit answers NO_RESOURCES.
func TestLimits(t *testing.T) {
	hygiene(t)
	lim := rdma.DefaultLimits()
	lim.MaxPD = 3
	d, sock := startDaemonWith(t, daemon.Config{}, rdma.Config{Limits: lim})
	c, _ := openRDMA(t, sock, 16<<20)
	for i := range 3 {
		if _, err := c.AllocPD(); err != nil {
			t.Fatalf("PD %d: %v", i, err)
		}
	}
	_, err := c.AllocPD()
	var ce *verbs.CommandError
	if !errors.As(err, &ce) || ce.Status != abi.StatusNoResources {
		t.Fatalf("PD beyond max_pd: %v, want NO_RESOURCES", err)
	}
	if got := info(t, d).PDs; got != 3 {
		t.Fatalf("PDs: %d, want 3", got)
	}
}
