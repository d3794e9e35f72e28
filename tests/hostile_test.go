package tests

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
	"github.com/vrdma/vrdma/vmm/frontend"
)

// bystanderOK checks that another device of the same daemon still serves
// a front-end end to end: the bug class "a guest-triggered failure takes
// down every other VM's device".
func bystanderOK(t *testing.T, sock string) {
	t.Helper()
	f := dial(t, sock, frontendCfg())
	defer f.Close()
	if err := f.Start(abi.ControlQueue); err != nil {
		t.Fatalf("bystander start: %v", err)
	}
	if _, st, err := queryDevice(f); err != nil || st != abi.StatusOK {
		t.Fatalf("bystander QUERY_DEVICE: status %v, err %v", st, err)
	}
}

// waitRingError waits until the device reports a broken ring through the
// error eventfd and the daemon's counter.
func waitRingError(t *testing.T, d *daemon.Daemon, id string, q *frontend.Queue) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ok, _ := q.Err.TryWait()
		dv, _ := d.Device(id)
		if ok && dv.Info().RingErrors > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ring error reported (err eventfd %v, counter %d)", ok, dv.Info().RingErrors)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

type desc struct {
	addr  uint64
	len   uint32
	flags uint16
	next  uint16
}

func putDesc(table []byte, i int, d desc) {
	b := table[16*i:]
	binary.LittleEndian.PutUint64(b, d.addr)
	binary.LittleEndian.PutUint32(b[8:], d.len)
	binary.LittleEndian.PutUint16(b[12:], d.flags)
	binary.LittleEndian.PutUint16(b[14:], d.next)
}

// publish makes head available as avail ring entry idx and sets the
// available index to newIdx.
func publish(r virtio.Rings, size int, idx uint16, head uint16, newIdx uint16) {
	binary.LittleEndian.PutUint16(r.Avail[4+2*(int(idx)%size):], head)
	abi.StoreUint16(r.Avail, 2, newIdx)
}

// TestMalformedChains: each bug class of descriptor chains breaks that
// device's ring only; the daemon keeps serving another device; nothing
// leaks.
func TestMalformedChains(t *testing.T) {
	const mem = 16 << 20
	cases := []struct {
		name  string
		forge func(f *frontend.Frontend, r virtio.Rings) (head, newIdx uint16)
	}{
		{"loop", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			gpa, _, _ := f.Alloc(64, 8)
			putDesc(r.Desc, 0, desc{uint64(gpa), 8, virtio.DescFNext, 1})
			putDesc(r.Desc, 1, desc{uint64(gpa), 8, virtio.DescFNext, 0})
			return 0, 1
		}},
		{"next out of range", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			gpa, _, _ := f.Alloc(64, 8)
			putDesc(r.Desc, 0, desc{uint64(gpa), 8, virtio.DescFNext, 9999})
			return 0, 1
		}},
		{"head out of range", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			return 4000, 1
		}},
		{"avail index jumps", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			return 0, 1000
		}},
		{"buffer outside guest memory", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			putDesc(r.Desc, 0, desc{mem + 4096, 64, 0, 0})
			return 0, 1
		}},
		{"buffer straddles the end of memory", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			putDesc(r.Desc, 0, desc{mem - 8, 64, 0, 0})
			return 0, 1
		}},
		{"address plus length overflows", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			putDesc(r.Desc, 0, desc{math.MaxUint64 - 8, 64, 0, 0})
			return 0, 1
		}},
		{"nested indirect", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			gpa, tbl, _ := f.Alloc(32, 16)
			putDesc(tbl, 0, desc{uint64(gpa), 32, virtio.DescFIndirect, 0})
			putDesc(r.Desc, 0, desc{uint64(gpa), 32, virtio.DescFIndirect, 0})
			return 0, 1
		}},
		{"indirect length not a multiple of 16", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			gpa, _, _ := f.Alloc(64, 16)
			putDesc(r.Desc, 0, desc{uint64(gpa), 24, virtio.DescFIndirect, 0})
			return 0, 1
		}},
		{"indirect table outside memory", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			putDesc(r.Desc, 0, desc{mem - 16, 64, virtio.DescFIndirect, 0})
			return 0, 1
		}},
		{"readable after writable", func(f *frontend.Frontend, r virtio.Rings) (uint16, uint16) {
			gpa, _, _ := f.Alloc(64, 8)
			putDesc(r.Desc, 0, desc{uint64(gpa), 8, virtio.DescFWrite | virtio.DescFNext, 1})
			putDesc(r.Desc, 1, desc{uint64(gpa), 8, 0, 0})
			return 0, 1
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hygiene(t)
			d, socks := startDaemon(t, 2)
			f := dial(t, socks[0], frontend.Config{MemorySize: mem, QueueSize: 64})
			if err := f.Start(abi.ControlQueue); err != nil {
				t.Fatal(err)
			}
			q := f.Queue(abi.ControlQueue)
			r := q.Rings()
			head, newIdx := tc.forge(f, r)
			publish(r, 64, 0, head, newIdx)
			q.Kick.Signal()
			waitRingError(t, d, "dev0", q)
			// The ring stays broken ("log the error and keep going" is a
			// bug): nothing comes back on it, even for a valid command.
			if _, _, ok, _ := q.Used(); ok {
				t.Fatal("device returned a chain from a broken ring")
			}
			bystanderOK(t, socks[1])
			// Stopping still answers; after RESET_DEVICE the device works.
			if _, err := f.Stop(); err != nil {
				t.Fatal(err)
			}
			if err := f.ResetDevice(); err != nil {
				t.Fatal(err)
			}
			if err := f.Start(abi.ControlQueue); err != nil {
				t.Fatal(err)
			}
			if _, st, err := queryDevice(f); err != nil || st != abi.StatusOK {
				t.Fatalf("QUERY_DEVICE after reset: status %v, err %v", st, err)
			}
		})
	}
}

// TestShrunkMemory: a front-end that shrinks the file behind guest memory
// after SET_MEM_TABLE makes the next access fault (SIGBUS). The fault
// breaks that ring; the daemon lives.
func TestShrunkMemory(t *testing.T) {
	hygiene(t)
	d, socks := startDaemon(t, 2)
	f := dial(t, socks[0], frontend.Config{MemorySize: 16 << 20, QueueSize: 64, NoSeal: true})
	if err := f.Start(abi.ControlQueue); err != nil {
		t.Fatal(err)
	}
	if _, st, err := queryDevice(f); err != nil || st != abi.StatusOK {
		t.Fatalf("QUERY_DEVICE: %v %v", st, err)
	}
	// From here on this process must not touch guest memory either.
	if err := unix.Ftruncate(f.MemFd(), 0); err != nil {
		t.Fatal(err)
	}
	q := f.Queue(abi.ControlQueue)
	q.Kick.Signal()
	waitRingError(t, d, "dev0", q)
	f.Close()

	// Starting a ring reads its used index, on the session goroutine:
	// rings set up, stopped, the memory truncated, the ring started again.
	// The ring breaks; the daemon lives.
	f = dial(t, socks[0], frontend.Config{MemorySize: 16 << 20, QueueSize: 64, NoSeal: true})
	if err := f.Start(abi.ControlQueue); err != nil {
		t.Fatal(err)
	}
	if _, st, err := queryDevice(f); err != nil || st != abi.StatusOK {
		t.Fatalf("QUERY_DEVICE: %v %v", st, err)
	}
	if _, err := f.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(f.MemFd(), 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Start(abi.ControlQueue); err != nil {
		t.Fatal(err)
	}
	waitRingError(t, d, "dev0", f.Queue(abi.ControlQueue))
	bystanderOK(t, socks[1])
}

// nack sends a request with NEED_REPLY and wants a failure status.
func nack(t *testing.T, f *frontend.Frontend, req vu.Request, payload []byte, fds []int) {
	t.Helper()
	err := f.Send(req, payload, fds)
	var ne *frontend.NackError
	if !errors.As(err, &ne) {
		t.Fatalf("%s: got %v, want a failure status", req, err)
	}
}

func newEventFd(t *testing.T) int {
	t.Helper()
	e, err := eventfd.New()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.FcntlInt(uintptr(e.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	e.Close()
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

// TestBadMessages: protocol-level bug classes get an error status; fds that
// arrive with them are closed; the session and the daemon go on.
func TestBadMessages(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	f := dial(t, socks[0], frontendCfg())
	if f.ProtocolFeatures&vu.ProtocolReplyAck == 0 {
		t.Fatal("REPLY_ACK not negotiated")
	}
	region := f.MemoryRegion()
	memTable := func(rs ...vu.MemoryRegion) []byte { return vu.MemTable{Regions: rs}.Encode() }
	big := region
	big.Size *= 2
	overflowGPA := region
	overflowGPA.GuestAddr = math.MaxUint64 - 4095
	overflowOff := region
	overflowOff.MmapOffset = math.MaxUint64 - 4095
	overflowUVA := region
	overflowUVA.UserAddr = math.MaxUint64 - 4095
	zero := region
	zero.Size = 0

	steps := []struct {
		name    string
		req     vu.Request
		payload []byte
		nfds    int
	}{
		{"ring size zero", vu.SetVringNum, vu.VringState{Index: 0, Num: 0}.Encode(), 0},
		{"ring size not a power of two", vu.SetVringNum, vu.VringState{Index: 0, Num: 48}.Encode(), 0},
		{"ring size above the maximum", vu.SetVringNum, vu.VringState{Index: 0, Num: 65536}.Encode(), 0},
		{"ring index out of range", vu.SetVringNum, vu.VringState{Index: 3, Num: 64}.Encode(), 0},
		{"ring index truncated to 8 bits would be valid", vu.SetVringNum, vu.VringState{Index: 256, Num: 64}.Encode(), 0},
		{"ring base above 16 bits", vu.SetVringBase, vu.VringState{Index: 0, Num: 1 << 16}.Encode(), 0},
		{"enable value not 0 or 1", vu.SetVringEnable, vu.VringState{Index: 0, Num: 2}.Encode(), 0},
		{"region larger than its file", vu.SetMemTable, memTable(big), 1},
		{"region guest address overflows", vu.SetMemTable, memTable(overflowGPA), 1},
		{"region mmap offset overflows", vu.SetMemTable, memTable(overflowOff), 1},
		{"region user address overflows", vu.SetMemTable, memTable(overflowUVA), 1},
		{"region of size zero", vu.SetMemTable, memTable(zero), 1},
		{"overlapping regions", vu.SetMemTable, memTable(region, region), 2},
		{"fewer fds than regions", vu.SetMemTable, memTable(region, region), 1},
		{"more fds than regions", vu.SetMemTable, memTable(region), 3},
		{"REM_MEM_REG carrying an fd", vu.RemMemReg, vu.MemRegionMsg{Region: region}.Encode(), 1},
		{"REM_MEM_REG of a region never added", vu.RemMemReg, vu.MemRegionMsg{Region: region}.Encode(), 0},
		{"ADD_MEM_REG without fd", vu.AddMemReg, vu.MemRegionMsg{Region: region}.Encode(), 0},
		{"kick with two fds", vu.SetVringKick, vu.EncodeU64(vu.EncodeVringFile(0, false)), 2},
		{"call with the no-fd bit and an fd", vu.SetVringCall, vu.EncodeU64(vu.EncodeVringFile(0, true)), 1},
		{"kick for a ring that does not exist", vu.SetVringKick, vu.EncodeU64(vu.EncodeVringFile(200, false)), 1},
		{"kick flags beyond bit 8", vu.SetVringKick, vu.EncodeU64(1 << 20), 1},
		{"dirty log (not offered)", vu.SetLogBase, make([]byte, 16), 1},
		{"IOTLB (not offered)", vu.IOTLBMsg, make([]byte, 32), 0},
		{"short payload", vu.SetVringNum, []byte{1, 2, 3}, 0},
		{"features never offered", vu.SetFeatures, vu.EncodeU64(1 << 40), 0},
		{"unknown request", vu.Request(200), nil, 0},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			fds := make([]int, st.nfds)
			for i := range fds {
				if st.req == vu.SetMemTable || st.req == vu.RemMemReg || st.req == vu.AddMemReg {
					fd, err := unix.FcntlInt(uintptr(f.MemFd()), unix.F_DUPFD_CLOEXEC, 0)
					if err != nil {
						t.Fatal(err)
					}
					fds[i] = fd
				} else {
					fds[i] = newEventFd(t)
				}
			}
			nack(t, f, st.req, st.payload, fds)
			for _, fd := range fds {
				unix.Close(fd)
			}
		})
	}
	// Replacing call and error fds many times keeps exactly one of each.
	before := countFds(t)
	for range 50 {
		e := newEventFd(t)
		if err := f.Send(vu.SetVringCall, vu.EncodeU64(vu.EncodeVringFile(0, false)), []int{e}); err != nil {
			t.Fatal(err)
		}
		unix.Close(e)
	}
	if after := countFds(t); after > before+1 {
		t.Fatalf("replacing the call fd 50 times: fds %d -> %d", before, after)
	}
	// The session survived all of it.
	if err := f.Start(abi.ControlQueue); err != nil {
		t.Fatal(err)
	}
	if _, st, err := queryDevice(f); err != nil || st != abi.StatusOK {
		t.Fatalf("QUERY_DEVICE after bad messages: status %v, err %v", st, err)
	}
	bystanderOK(t, socks[1])
}

// TestBrokenStream: a message the back-end cannot answer (a GET with a
// surplus fd, a header announcing a huge payload) ends that session, with
// its fds closed; the socket takes the next front-end.
func TestBrokenStream(t *testing.T) {
	hygiene(t)
	_, socks := startDaemon(t, 2)
	for _, tc := range []struct {
		name string
		send func(f *frontend.Frontend) error
	}{
		{"GET_FEATURES with an fd", func(f *frontend.Frontend) error {
			fd := newEventFd(t)
			defer unix.Close(fd)
			return f.Conn().WriteMessage(vu.Header{Request: uint32(vu.GetFeatures), Flags: vu.FlagVersion}, nil, []int{fd})
		}},
		{"huge payload size", func(f *frontend.Frontend) error {
			h := vu.Header{Request: uint32(vu.SetFeatures), Flags: vu.FlagVersion, Size: 1 << 30}
			_, err := f.Conn().UnixConn().Write(h.Encode())
			return err
		}},
		{"bad version", func(f *frontend.Frontend) error {
			h := vu.Header{Request: uint32(vu.GetFeatures), Flags: 2}
			_, err := f.Conn().UnixConn().Write(h.Encode())
			return err
		}},
		{"reply flag on a request", func(f *frontend.Frontend) error {
			h := vu.Header{Request: uint32(vu.GetFeatures), Flags: vu.FlagVersion | vu.FlagReply}
			_, err := f.Conn().UnixConn().Write(h.Encode())
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := dial(t, socks[0], frontendCfg())
			if err := tc.send(f); err != nil {
				t.Fatal(err)
			}
			f.Conn().UnixConn().SetReadDeadline(time.Now().Add(5 * time.Second))
			var b [64]byte
			n, err := f.Conn().UnixConn().Read(b[:])
			if err == nil || n != 0 {
				t.Fatalf("read after a fatal message: %d bytes, %v; want the connection closed", n, err)
			}
			f.Close()
			// The next front-end is served.
			bystanderOK(t, socks[0])
			bystanderOK(t, socks[1])
		})
	}
}
