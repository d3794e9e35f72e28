package rdma

import (
	"encoding/binary"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/backend"
	"github.com/vrdma/vrdma/backend/rdma/engine"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// fakeHost is a backend.Host with real memfd guest memory and no queues.
type fakeHost struct{ mem *memmap.Memory }

func (h *fakeHost) Memory() *memmap.Memory    { return h.mem }
func (h *fakeHost) Queue(int) *backend.Queue  { return nil }
func (h *fakeHost) NotifyConfigChange() error { return nil }
func (h *fakeHost) Resumed() bool             { return false }

const guestSize = 1 << 20

func attached(t testing.TB) (*Device, *memmap.Table, func()) {
	t.Helper()
	return attachedOn(t, nil, "fuzz")
}

// attachedOn is attached for a device named id on fabric f (nil: its own).
func attachedOn(t testing.TB, f *engine.Fabric, id string) (*Device, *memmap.Table, func()) {
	t.Helper()
	d, mem, _, done := attachedMem(t, f, id, false)
	t2 := mem.Acquire()
	return d, t2, func() {
		t2.Release()
		done()
	}
}

// attachedMem builds a device named id on fabric f (nil: its own) with
// small limits, attached to a guest memory of guestSize in one memfd
// region at front-end address 1<<40. With keepFile, file is a duplicate of
// the memfd (so that a test can map the memory anew), else -1; done
// destroys everything, the file too.
func attachedMem(t testing.TB, f *engine.Fabric, id string, keepFile bool) (d *Device, mem *memmap.Memory, file int, done func()) {
	t.Helper()
	fd, err := memmap.NewMemfd("guest", guestSize)
	if err != nil {
		t.Fatal(err)
	}
	file = -1
	if keepFile {
		if file, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
	}
	r, err := memmap.MapRegion(fd, memmap.RegionSpec{Size: guestSize, UserAddr: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := memmap.NewTable([]*memmap.Region{r})
	r.Release()
	if err != nil {
		t.Fatal(err)
	}
	mem = memmap.NewMemory()
	mem.Swap(tbl)
	d, err = New(Config{ID: id, Fabric: f, Limits: Limits{MaxQP: 4, MaxQPWR: 64, MaxSGE: 4, MaxCQ: 4, MaxCQE: 256,
		MaxMR: 8, MaxPD: 4, MaxAH: 4, MaxMRSize: guestSize, MaxInlineData: 64, MaxQPRdAtom: 4}})
	if err != nil {
		t.Fatal(err)
	}
	d.Attach(&fakeHost{mem: mem})
	return d, mem, file, func() {
		d.Reset()
		d.Detach()
		d.Close()
		mem.Close()
		if file >= 0 {
			unix.Close(file)
		}
	}
}

// FuzzControl feeds arbitrary commands to the control path: it must never
// panic, every failed command must leave the object counts and pinned bytes
// as they were, and every object must be gone after Reset.
func FuzzControl(f *testing.F) {
	le := binary.LittleEndian
	f.Add(uint16(abi.CmdCreatePD), []byte{})
	f.Add(uint16(abi.CmdRegMR), append(abi.Marshal(&abi.RegMR{PDN: 0x100, Access: 1, IOVA: 4096, Length: 4096, PageShift: 12, NPages: 1}), le.AppendUint64(nil, 4096)...))
	f.Add(uint16(abi.CmdCreateCQ), append(abi.Marshal(&abi.CreateCQ{CQE: 64, NPages: 1, Record: 8192}), le.AppendUint64(nil, 12288)...))
	f.Add(uint16(abi.CmdCreateQP), abi.Marshal(&abi.CreateQP{QPType: abi.QPTypeRC, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1, SQWQEShift: 7, RQWQEShift: 5, SQNPages: 1, RQNPages: 1, Record: 16384}))
	f.Add(uint16(abi.CmdModifyQP), abi.Marshal(&abi.QPAttr{AttrMask: abi.QPAttrState, QPState: abi.QPSInit}))
	f.Add(uint16(abi.CmdAddGID), abi.Marshal(&abi.GIDEntry{PortNum: 1, Index: 2, GID: [16]byte{0xfe, 0x80, 15: 9}}))
	f.Add(uint16(abi.CmdDelGID), abi.Marshal(&abi.GIDReq{PortNum: 1, Index: 0}))
	f.Add(uint16(abi.CmdCreateCQ), append(abi.Marshal(&abi.CreateCQ{CQE: 64, NPages: 1, Record: 8192, Flags: abi.CQFlagArmRecord}), le.AppendUint64(nil, 12288)...))
	f.Add(uint16(abi.CmdCreateSRQ), append(abi.Marshal(&abi.CreateSRQ{PDN: 0x100, MaxWR: 4, MaxSGE: 1, WQEShift: 5, Record: 8192, NPages: 1}), le.AppendUint64(nil, 12288)...))
	f.Add(uint16(abi.CmdModifySRQ), abi.Marshal(&abi.SRQAttr{SRQN: 0x100, AttrMask: abi.SRQAttrLimit, SRQLimit: 1}))
	f.Add(uint16(abi.CmdCreateQP), abi.Marshal(&abi.CreateQP{QPType: abi.QPTypeUD, MaxSendWR: 4, MaxSendSGE: 1, SQWQEShift: 7, SQNPages: 1, Record: 16384, Flags: abi.QPFlagSRQ, SRQN: 0x100}))
	f.Fuzz(func(t *testing.T, op uint16, req []byte) {
		d, tbl, done := attached(t)
		defer done()
		// A PD to refer to, so deeper paths are reached.
		if _, st := d.command(abi.CmdCreatePD, nil, tbl); st != abi.StatusOK {
			t.Fatalf("CREATE_PD: %v", st)
		}
		before := d.Stats()
		out, st := d.command(abi.Opcode(op), req, tbl)
		after := d.Stats()
		if st != abi.StatusOK {
			if out != nil {
				t.Fatalf("failed command %d returned a payload", op)
			}
			if after.PDs != before.PDs || after.MRs != before.MRs || after.CQs != before.CQs ||
				after.QPs != before.QPs || after.AHs != before.AHs || after.SRQs != before.SRQs ||
				after.Pin.PinnedBytes != before.Pin.PinnedBytes {
				t.Fatalf("failed command %d (%v) changed the device: %+v -> %+v", op, st, before, after)
			}
		}
		d.Reset()
		if s := d.Stats(); s.PDs+s.MRs+s.CQs+s.QPs+s.AHs+s.SRQs != 0 || s.Pin.PinnedBytes != 0 {
			t.Fatalf("after Reset: %+v", s)
		}
	})
}

// TestNoLeakAfterDetach checks pins go back to zero through Detach too.
func TestNoLeakAfterDetach(t *testing.T) {
	d, tbl, done := attached(t)
	_, st := d.command(abi.CmdCreatePD, nil, tbl)
	if st != abi.StatusOK {
		t.Fatal(st)
	}
	var vm unix.Sysinfo_t
	_ = unix.Sysinfo(&vm)
	done()
	if s := d.Stats(); s.PDs != 0 {
		t.Fatalf("objects after detach: %+v", s)
	}
}

// TestCommandRateLimit: beyond MaxCommandsPerSec a command answers QUOTA;
// tokens come back with time.
func TestCommandRateLimit(t *testing.T) {
	d, err := New(Config{ID: "rate", MaxCommandsPerSec: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	admitted := 0
	for range 25 {
		if d.admitCommand() {
			admitted++
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d of 25 back-to-back commands, want the bucket's 10", admitted)
	}
	d.tokensAt = d.tokensAt.Add(-time.Second) // a second passes
	if !d.admitCommand() {
		t.Fatal("no command admitted after the bucket refilled")
	}
}
