package backend

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/eventfd"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// What a hostile front-end gets for each thing it can send is documented
// in doc.go, "Errors"; these tests hold the session to it, and check that
// every fd is closed and other sessions notice nothing.

// writeRaw writes bytes, with fds attached to them, bypassing vu.Conn's
// checks.
func (f *testFrontend) writeRaw(b []byte, fds ...int) {
	f.t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := f.conn.UnixConn().WriteMsgUnix(b, oob, nil); err != nil {
		f.t.Fatalf("write: %v", err)
	}
}

func header(req vu.Request, flags, size uint32) []byte {
	b := make([]byte, vu.HeaderSize)
	binary.LittleEndian.PutUint32(b[0:], uint32(req))
	binary.LittleEndian.PutUint32(b[4:], flags)
	binary.LittleEndian.PutUint32(b[8:], size)
	return b
}

func state(index, num uint32) []byte { return vu.VringState{Index: index, Num: num}.Encode() }

func memTable(regions ...vu.MemoryRegion) []byte { return vu.MemTable{Regions: regions}.Encode() }

// dupFds returns n dups of fd, closed at the end of the test.
func dupFds(t *testing.T, fd, n int) []int {
	t.Helper()
	fds := make([]int, n)
	for i := range fds {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		fds[i] = d
	}
	t.Cleanup(func() {
		for _, d := range fds {
			unix.Close(d)
		}
	})
	return fds
}

// hostileCase is one attack on a session that has negotiated every
// protocol feature, has its memory table and runs ring 0 of 2.
type hostileCase struct {
	name string
	run  func(t *testing.T, f *testFrontend)
	// closes: the session must close, with an error matching want (nil:
	// any error). Otherwise it must go on, and ring 0 must still work
	// unless breaksRing0.
	closes      bool
	want        error
	breaksRing0 bool
}

var oneRegion = vu.MemoryRegion{GuestAddr: 0, Size: memSize, UserAddr: userBase}

func hostileCases() []hostileCase {
	nack := func(req vu.Request, payload []byte, fdsFrom ...func(f *testFrontend) int) func(*testing.T, *testFrontend) {
		return func(t *testing.T, f *testFrontend) {
			var fds []int
			for _, fn := range fdsFrom {
				fds = append(fds, fn(f))
			}
			f.nack(req, payload, fds...)
		}
	}
	memfd := func(f *testFrontend) int { return f.memfd }
	efd := func(f *testFrontend) int { return f.rings[0].call.Fd() }
	region := func(gpa, size, uva, off uint64) vu.MemoryRegion {
		return vu.MemoryRegion{GuestAddr: gpa, Size: size, UserAddr: uva, MmapOffset: off}
	}
	closeWith := func(b []byte) func(*testing.T, *testFrontend) {
		return func(t *testing.T, f *testFrontend) {
			f.writeRaw(b)
			f.conn.UnixConn().CloseWrite()
		}
	}
	return []hostileCase{
		// The stream cannot be resynchronised: close.
		{name: "header version 0", closes: true, want: vu.ErrProtocol,
			run: func(t *testing.T, f *testFrontend) { f.writeRaw(header(vu.GetFeatures, 0, 0)) }},
		{name: "header version 2", closes: true, want: vu.ErrProtocol,
			run: func(t *testing.T, f *testFrontend) { f.writeRaw(header(vu.GetFeatures, 2, 0)) }},
		{name: "payload size above the limit", closes: true, want: vu.ErrProtocol,
			run: func(t *testing.T, f *testFrontend) {
				f.writeRaw(header(vu.SetConfig, vu.FlagVersion, vu.MaxPayloadSize+1))
			}},
		{name: "payload size 4 GiB", closes: true, want: vu.ErrProtocol,
			run: func(t *testing.T, f *testFrontend) { f.writeRaw(header(vu.SetConfig, vu.FlagVersion, 0xffffffff)) }},
		{name: "eof inside the header", closes: true, want: vu.ErrProtocol,
			run: closeWith(header(vu.GetFeatures, vu.FlagVersion, 0)[:6])},
		{name: "eof inside the payload", closes: true, want: vu.ErrProtocol,
			run: closeWith(append(header(vu.SetFeatures, vu.FlagVersion, 8), 1, 2, 3, 4))},
		{name: "more fds than MaxFds", closes: true, want: vu.ErrProtocol,
			run: func(t *testing.T, f *testFrontend) {
				f.writeRaw(header(vu.SetOwner, vu.FlagVersion, 0), dupFds(t, f.memfd, vu.MaxFds+1)...)
			}},
		{name: "fds with the payload", closes: true, want: vu.ErrProtocol,
			run: func(t *testing.T, f *testFrontend) {
				f.writeRaw(header(vu.SetVringCall, vu.FlagVersion, 8))
				f.writeRaw(vringFile(0, false), f.rings[0].call.Fd())
			}},
		{name: "fds twice within the header", closes: true, want: vu.ErrProtocol,
			run: func(t *testing.T, f *testFrontend) {
				h := header(vu.SetVringCall, vu.FlagVersion, 8)
				f.writeRaw(h[:6], f.rings[0].call.Fd())
				f.writeRaw(h[6:], f.rings[0].call.Fd()) // closes here
			}},
		{name: "reply flag on a request", closes: true,
			run: func(t *testing.T, f *testFrontend) { f.write(vu.SetOwner, vu.FlagReply, nil, nil) }},

		// Requests that always reply have no failure form but GET_CONFIG's:
		// close.
		{name: "GET_FEATURES with a payload", closes: true, want: vu.ErrInvalid,
			run: func(t *testing.T, f *testFrontend) { f.send(vu.GetFeatures, make([]byte, 8)) }},
		{name: "GET_FEATURES with an fd", closes: true, want: vu.ErrInvalid,
			run: func(t *testing.T, f *testFrontend) { f.send(vu.GetFeatures, nil, f.memfd) }},
		{name: "GET_VRING_BASE of a ring out of range", closes: true,
			run: func(t *testing.T, f *testFrontend) { f.send(vu.GetVringBase, state(2, 0)) }},
		{name: "GET_VRING_BASE short", closes: true, want: vu.ErrInvalid,
			run: func(t *testing.T, f *testFrontend) { f.send(vu.GetVringBase, make([]byte, 4)) }},
		{name: "GET_INFLIGHT_FD (not offered)", closes: true, want: errUnsupported,
			run: func(t *testing.T, f *testFrontend) { f.send(vu.GetInflightFd, make([]byte, vu.InflightInfoSize)) }},

		// Unknown and unsupported requests: refused, the session goes on.
		{name: "unknown request", run: nack(99, nil)},
		{name: "unknown request with payload and fd", run: nack(1000, make([]byte, 100), memfd)},
		{name: "SET_LOG_BASE of zero bytes", run: nack(vu.SetLogBase, make([]byte, vu.LogInfoSize), memfd)},
		{name: "SET_LOG_FD not an eventfd", run: nack(vu.SetLogFd, nil, memfd)},
		{name: "IOTLB_MSG", run: nack(vu.IOTLBMsg, make([]byte, vu.IOTLBSize))},
		{name: "SET_VRING_ENDIAN", run: nack(vu.SetVringEndian, state(0, 1))},
		{name: "SET_INFLIGHT_FD (not offered)", run: nack(vu.SetInflightFd, make([]byte, vu.InflightInfoSize), memfd)},
		{name: "VRING_KICK in band (not offered)", run: nack(vu.VringKick, state(0, 0))},
		{name: "SET_FEATURES not offered", run: nack(vu.SetFeatures, vu.EncodeU64(1<<62))},
		{name: "SET_PROTOCOL_FEATURES INFLIGHT_SHMFD", run: nack(vu.SetProtocolFeatures, vu.EncodeU64(ProtocolFeatures|vu.ProtocolInflightShmfd))},
		{name: "SET_STATUS above 8 bits", run: nack(vu.SetStatus, vu.EncodeU64(0x100))},

		// Wrong sizes.
		{name: "SET_FEATURES short", run: nack(vu.SetFeatures, make([]byte, 4))},
		{name: "SET_PROTOCOL_FEATURES long", run: nack(vu.SetProtocolFeatures, make([]byte, 9))},
		{name: "SET_OWNER with a payload", run: nack(vu.SetOwner, make([]byte, 8))},
		{name: "RESET_DEVICE with a payload", run: nack(vu.ResetDevice, make([]byte, 1))},
		{name: "SET_STATUS empty", run: nack(vu.SetStatus, nil)},
		{name: "SET_VRING_NUM short", run: nack(vu.SetVringNum, make([]byte, 4))},
		{name: "SET_VRING_ADDR short", run: nack(vu.SetVringAddr, make([]byte, vu.VringAddrSize-1))},
		{name: "SET_VRING_KICK short", run: nack(vu.SetVringKick, make([]byte, 4), efd)},
		{name: "SET_MEM_TABLE count larger than the payload", run: func(t *testing.T, f *testFrontend) {
			p := memTable(oneRegion)
			binary.LittleEndian.PutUint32(p, 2)
			f.nack(vu.SetMemTable, p, f.memfd, f.memfd)
		}},
		{name: "SET_MEM_TABLE shorter than its header", run: nack(vu.SetMemTable, make([]byte, 4))},
		{name: "SET_CONFIG size larger than the data", run: func(t *testing.T, f *testFrontend) {
			p := vu.ConfigMsg{Offset: 0, Size: 4, Data: []byte("abcd")}.Encode()
			f.nack(vu.SetConfig, p[:len(p)-2])
		}},
		{name: "SET_CONFIG above MaxConfigSize", run: func(t *testing.T, f *testFrontend) {
			f.nack(vu.SetConfig, vu.ConfigMsg{Size: vu.MaxConfigSize + 1}.Encode())
		}},
		{name: "ADD_MEM_REG short", run: nack(vu.AddMemReg, make([]byte, vu.MemoryRegionSize), memfd)},

		// Wrong fd counts: refused, every fd closed.
		{name: "SET_MEM_TABLE surplus fd", run: nack(vu.SetMemTable, memTable(oneRegion), memfd, memfd)},
		{name: "SET_MEM_TABLE missing fd", run: nack(vu.SetMemTable, memTable(region(0, 4096, userBase, 0), region(4096, 4096, userBase+4096, 4096)), memfd)},
		{name: "SET_MEM_TABLE without fds", run: nack(vu.SetMemTable, memTable(oneRegion))},
		{name: "SET_VRING_CALL without fd or no-fd flag", run: nack(vu.SetVringCall, vringFile(0, false))},
		{name: "SET_VRING_CALL with the no-fd flag and an fd", run: nack(vu.SetVringCall, vringFile(0, true), efd)},
		{name: "SET_VRING_KICK with reserved bits", run: nack(vu.SetVringKick, vu.EncodeU64(1<<9), efd)},
		{name: "REM_MEM_REG with an fd", run: nack(vu.RemMemReg, vu.MemRegionMsg{Region: oneRegion}.Encode(), memfd)},
		{name: "ADD_MEM_REG with two fds", run: nack(vu.AddMemReg, vu.MemRegionMsg{Region: region(1<<30, 4096, 1<<40, 0)}.Encode(), memfd, memfd)},
		{name: "SET_OWNER with an fd", run: nack(vu.SetOwner, nil, efd)},
		{name: "SET_VRING_NUM with an fd", run: nack(vu.SetVringNum, state(1, 64), efd)},
		{name: "SET_BACKEND_REQ_FD without fd", run: nack(vu.SetBackendReqFd, nil)},

		// Bad memory tables: refused, the current table stays.
		{name: "memory table without regions", run: nack(vu.SetMemTable, memTable())},
		{name: "memory table of 33 regions", run: func(t *testing.T, f *testFrontend) {
			rs := make([]vu.MemoryRegion, vu.MaxFds+1)
			p := memTable(rs[:1]...)
			binary.LittleEndian.PutUint32(p, uint32(len(rs)))
			p = append(p, make([]byte, vu.MemoryRegionSize*vu.MaxFds)...)
			f.nack(vu.SetMemTable, p, dupFds(t, f.memfd, vu.MaxFds)...)
		}},
		{name: "regions overlapping in guest-physical space", run: nack(vu.SetMemTable,
			memTable(region(0, 8192, userBase, 0), region(4096, 8192, userBase+1<<30, 0)), memfd, memfd)},
		{name: "regions overlapping in front-end virtual space", run: nack(vu.SetMemTable,
			memTable(region(0, 8192, userBase, 0), region(1<<30, 8192, userBase+4096, 0)), memfd, memfd)},
		{name: "the same region twice", run: nack(vu.SetMemTable, memTable(oneRegion, oneRegion), memfd, memfd)},
		{name: "region of size zero", run: nack(vu.SetMemTable, memTable(region(0, 0, userBase, 0)), memfd)},
		{name: "region larger than its file", run: nack(vu.SetMemTable, memTable(region(0, memSize+4096, userBase, 0)), memfd)},
		{name: "region offset past its file", run: nack(vu.SetMemTable, memTable(region(0, 4096, userBase, memSize)), memfd)},
		{name: "region guest address overflows", run: nack(vu.SetMemTable, memTable(region(^uint64(0)-4095, 8192, userBase, 0)), memfd)},
		{name: "region user address overflows", run: nack(vu.SetMemTable, memTable(region(0, 8192, ^uint64(0)-4095, 0)), memfd)},
		{name: "region offset overflows", run: nack(vu.SetMemTable, memTable(region(0, 8192, userBase, ^uint64(0)-4095)), memfd)},
		{name: "region fd not a file", run: nack(vu.SetMemTable, memTable(oneRegion), efd)},
		{name: "ADD_MEM_REG of size zero", run: nack(vu.AddMemReg, vu.MemRegionMsg{Region: region(1<<30, 0, 1<<40, 0)}.Encode(), memfd)},
		{name: "ADD_MEM_REG overlapping", run: nack(vu.AddMemReg, vu.MemRegionMsg{Region: region(0, 4096, 1<<40, 0)}.Encode(), memfd)},
		{name: "second region bad, first fine", run: nack(vu.SetMemTable,
			memTable(region(0, 4096, userBase, 0), region(1<<30, 0, userBase+1<<30, 0)), memfd, memfd)},

		// Ring indices out of range.
		{name: "SET_VRING_NUM ring 2 of 2", run: nack(vu.SetVringNum, state(2, 64))},
		{name: "SET_VRING_NUM ring 2^32-1", run: nack(vu.SetVringNum, state(0xffffffff, 64))},
		{name: "SET_VRING_BASE ring 2", run: nack(vu.SetVringBase, state(2, 0))},
		{name: "SET_VRING_ADDR ring 2", run: nack(vu.SetVringAddr, vu.VringAddr{Index: 2}.Encode())},
		{name: "SET_VRING_ENABLE ring 2", run: nack(vu.SetVringEnable, state(2, 1))},
		{name: "SET_VRING_KICK ring 2", run: nack(vu.SetVringKick, vringFile(2, false), efd)},
		{name: "SET_VRING_CALL ring 255", run: nack(vu.SetVringCall, vringFile(255, false), efd)},
		{name: "SET_VRING_ERR ring 2 without fd", run: nack(vu.SetVringErr, vringFile(2, true))},

		// Ring configuration out of range or at the wrong time.
		{name: "SET_VRING_NUM 0", run: nack(vu.SetVringNum, state(1, 0))},
		{name: "SET_VRING_NUM not a power of two", run: nack(vu.SetVringNum, state(1, 48))},
		{name: "SET_VRING_NUM above the device maximum", run: nack(vu.SetVringNum, state(1, 512))},
		{name: "SET_VRING_NUM 2^31", run: nack(vu.SetVringNum, state(1, 1<<31))},
		{name: "SET_VRING_BASE above 16 bits", run: nack(vu.SetVringBase, state(1, 0x10000))},
		{name: "SET_VRING_ADDR with F_LOG at an overflowing address", run: nack(vu.SetVringAddr, vu.VringAddr{Index: 1, Flags: vu.VringAddrFLog, Log: 1<<64 - 4}.Encode())},
		{name: "SET_VRING_ADDR unknown flags", run: nack(vu.SetVringAddr, vu.VringAddr{Index: 1, Flags: 2}.Encode())},
		{name: "SET_VRING_ENABLE 2", run: nack(vu.SetVringEnable, state(1, 2))},
		{name: "SET_VRING_NUM while started", run: nack(vu.SetVringNum, state(0, 32))},
		{name: "SET_VRING_BASE while started", run: nack(vu.SetVringBase, state(0, 5))},
		{name: "SET_VRING_ADDR while started", run: func(t *testing.T, f *testFrontend) {
			f.nack(vu.SetVringAddr, vu.VringAddr{Index: 0, Desc: userBase, Avail: userBase, Used: userBase}.Encode())
		}},
		{name: "SET_VRING_KICK with the no-fd flag (polling)", run: nack(vu.SetVringKick, vringFile(1, true))},
		{name: "SET_VRING_KICK with a regular file", run: nack(vu.SetVringKick, vringFile(1, false), memfd)},
		{name: "SET_VRING_CALL with a regular file", run: nack(vu.SetVringCall, vringFile(0, false), memfd)},
		{name: "SET_VRING_ERR with a directory", run: func(t *testing.T, f *testFrontend) {
			d, err := unix.Open(t.TempDir(), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(d)
			f.nack(vu.SetVringErr, vringFile(0, false), d)
		}},

		// Ring addresses outside guest memory: accepted (they are
		// translated when the ring starts, against the table of that
		// time), and the ring starts broken.
		{name: "SET_VRING_ADDR outside memory", run: func(t *testing.T, f *testFrontend) {
			r := f.ring(1)
			f.newDriverQueue(r, queueSize)
			f.mustAck(vu.SetVringErr, vringFile(1, false), r.errfd.Fd())
			f.mustAck(vu.SetVringNum, state(1, queueSize))
			f.mustAck(vu.SetVringAddr, vu.VringAddr{Index: 1, Desc: userBase + memSize, Avail: r.avail + userBase, Used: r.used + userBase}.Encode())
			f.mustAck(vu.SetVringKick, vringFile(1, false), r.kick.Fd())
			f.expectBroken(r)
		}},
		{name: "SET_VRING_ADDR crossing the end of memory", run: func(t *testing.T, f *testFrontend) {
			r := f.ring(1)
			f.newDriverQueue(r, queueSize)
			f.mustAck(vu.SetVringErr, vringFile(1, false), r.errfd.Fd())
			f.mustAck(vu.SetVringNum, state(1, queueSize))
			f.mustAck(vu.SetVringAddr, vu.VringAddr{Index: 1, Desc: r.desc + userBase, Avail: r.avail + userBase, Used: userBase + memSize - 16}.Encode())
			f.mustAck(vu.SetVringKick, vringFile(1, false), r.kick.Fd())
			f.expectBroken(r)
		}},
		{name: "available ring outside memory", run: func(t *testing.T, f *testFrontend) {
			r := f.ring(1)
			f.newDriverQueue(r, queueSize)
			f.mustAck(vu.SetVringErr, vringFile(1, false), r.errfd.Fd())
			f.mustAck(vu.SetVringNum, state(1, queueSize))
			f.mustAck(vu.SetVringAddr, vu.VringAddr{Index: 1, Desc: r.desc + userBase, Avail: 1 << 20, Used: r.used + userBase}.Encode())
			f.mustAck(vu.SetVringKick, vringFile(1, false), r.kick.Fd())
			f.expectBroken(r)
		}},
		{name: "SET_VRING_ADDR with guest-physical addresses", run: func(t *testing.T, f *testFrontend) {
			r := f.ring(1)
			f.newDriverQueue(r, queueSize)
			f.mustAck(vu.SetVringErr, vringFile(1, false), r.errfd.Fd())
			f.mustAck(vu.SetVringNum, state(1, queueSize))
			f.mustAck(vu.SetVringAddr, vu.VringAddr{Index: 1, Desc: r.desc, Avail: r.avail, Used: r.used}.Encode())
			f.mustAck(vu.SetVringKick, vringFile(1, false), r.kick.Fd())
			f.expectBroken(r)
		}},
		{name: "memory table that drops the running ring", breaksRing0: true, run: func(t *testing.T, f *testFrontend) {
			f.mustAck(vu.SetMemTable, memTable(region(dataBase, memSize-dataBase, userBase+dataBase, dataBase)), f.memfd)
			f.rings[0].kick.Signal()
			f.expectBroken(f.rings[0])
		}},
		{name: "REM_MEM_REG of the running ring's region", breaksRing0: true, run: func(t *testing.T, f *testFrontend) {
			f.mustAck(vu.RemMemReg, vu.MemRegionMsg{Region: oneRegion}.Encode())
			f.rings[0].kick.Signal()
			f.expectBroken(f.rings[0])
		}},
	}
}

// TestHostileFrontend runs every case against its own session, beside a
// bystander session that must not notice, and checks that no fd or guest
// memory mapping outlives the sessions.
func TestHostileFrontend(t *testing.T) {
	bystander := newFrontend(t, newFakeDevice(1))
	bystander.ready(0)
	br := bystander.rings[0]
	cases := hostileCases()
	checkNoLeaks(t, func() {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				f := newFrontend(t, newFakeDevice(2))
				f.ready(0)
				f.roundTrip(f.rings[0], "before")
				f.run(t, tc)
				bystander.roundTrip(br, tc.name)
				bystander.expectNotBroken(br)
			})
		}
	})
	if got := bystander.stats.protocolErrors.Load(); got != 0 {
		t.Fatalf("bystander: %d protocol errors", got)
	}
}

func (f *testFrontend) run(t *testing.T, tc hostileCase) {
	t.Helper()
	errsBefore := f.stats.protocolErrors.Load()
	tc.run(t, f)
	if tc.closes {
		f.expectClosed(tc.want)
		return
	}
	f.sync()
	if f.stats.protocolErrors.Load() == errsBefore && f.stats.ringErrors.Load() == 0 {
		t.Fatal("neither a protocol nor a ring error counted")
	}
	if !tc.breaksRing0 {
		f.roundTrip(f.rings[0], "after")
		f.expectNotBroken(f.rings[0])
	}
}

// TestRefusedWithoutReplyAck: without REPLY_ACK a refused request gets no
// answer at all; the next reply is the next request's.
func TestRefusedWithoutReplyAck(t *testing.T) {
	f := newFrontend(t, newFakeDevice(1))
	f.send(vu.SetOwner, nil)
	f.write(99, vu.FlagNeedReply, nil, nil)
	f.write(vu.SetVringNum, vu.FlagNeedReply, state(5, 64), nil)
	f.send(vu.SetMemTable, memTable(oneRegion)) // no fd
	if got := f.getU64(vu.GetQueueNum); got != 1 {
		t.Fatalf("GET_QUEUE_NUM: got %d", got)
	}
	if got := f.stats.protocolErrors.Load(); got != 3 {
		t.Fatalf("protocol errors: got %d, want 3", got)
	}
}

// TestBeforeSetOwner: SET_OWNER is recorded but not required. QEMU sends
// GET_FEATURES, the protocol features, GET_QUEUE_NUM, GET_MAX_MEM_SLOTS and
// SET_BACKEND_REQ_FD before it, and a connection has one front-end anyway
// (the socket is the ownership), so the session serves every request
// before SET_OWNER as after it (as libvhost-user and DPDK do). A second
// SET_OWNER is harmless; RESET_OWNER resets the device.
func TestBeforeSetOwner(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.send(vu.SetProtocolFeatures, vu.EncodeU64(ProtocolFeatures))
	f.feats = dev.features | vu.FeatureProtocolFeatures
	f.mustAck(vu.SetFeatures, vu.EncodeU64(f.feats))
	f.mustAck(vu.SetMemTable, memTable(oneRegion), f.memfd)
	r := f.startRing(0, 0)
	f.roundTrip(r, "no owner")
	f.mustAck(vu.SetOwner, nil)
	f.mustAck(vu.SetOwner, nil)
	f.roundTrip(r, "owner")
	f.mustAck(vu.ResetOwner, nil)
	if dev.count("Reset") != 1 {
		t.Fatal("RESET_OWNER did not reset the device")
	}
	if got := f.getU64(vu.GetStatus); got != 0 {
		t.Fatalf("status after RESET_OWNER: %#x", got)
	}
	// The ring is gone: a kick does nothing.
	f.post(r, []byte("x"))
	if _, err := r.call.WaitTimeout(100 * time.Millisecond); !errors.Is(err, eventfd.ErrTimeout) {
		t.Fatalf("ring answered after RESET_OWNER: %v", err)
	}
}

// TestDispatchDefendsItself: the handlers decode their payloads again
// rather than trust that Check ran; a message that skipped Check is
// refused, never a panic.
func TestDispatchDefendsItself(t *testing.T) {
	a, b := socketpair(t)
	defer a.Close()
	s := newSession(b, newFakeDevice(1), discardLog(), &Stats{})
	defer s.teardown()
	s.protocol, s.protocolSet = ProtocolFeatures, true
	for _, tc := range []struct {
		req     vu.Request
		payload []byte
	}{
		{vu.SetFeatures, nil},
		{vu.SetProtocolFeatures, make([]byte, 3)},
		{vu.SetMemTable, nil},
		{vu.SetMemTable, memTable(oneRegion)}, // no fd
		{vu.AddMemReg, nil},
		{vu.RemMemReg, nil},
		{vu.SetBackendReqFd, nil}, // no fd
		{vu.SetVringNum, nil},
		{vu.SetVringAddr, nil},
		{vu.SetVringBase, nil},
		{vu.GetVringBase, make([]byte, 9)},
		{vu.SetVringEnable, nil},
		{vu.SetVringKick, nil},
		{vu.SetVringCall, vu.EncodeU64(1 << 9)},
		{vu.SetVringErr, vringFile(0, false)}, // no fd
		{vu.GetConfig, nil},
		{vu.SetConfig, nil},
		{vu.SetStatus, nil},
	} {
		m := &vu.Message{Header: vu.Header{Request: uint32(tc.req), Flags: vu.FlagVersion, Size: uint32(len(tc.payload))}, Payload: tc.payload}
		if reply, err := s.dispatch(m); err == nil || reply != nil {
			t.Errorf("%s with payload %x: got %x, %v; want an error", tc.req, tc.payload, reply, err)
		}
	}
}
