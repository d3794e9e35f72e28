package frontend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// UserBase is added to a guest-physical address to form the front-end
// virtual address the back-end sees.
const UserBase = 0x7f00_0000_0000

// Config describes the front-end's VM.
type Config struct {
	// Socket is the back-end's unix socket.
	Socket string
	// MemorySize is the guest memory in bytes; zero means 64 MiB.
	MemorySize uint64
	// QueueSize is every queue's size (QEMU's vq_size); zero means 256.
	QueueSize uint16
	// Features are the virtio features the driver accepts, masked by what
	// the device offers; zero means all the device offers.
	Features uint64
	// NoSeal leaves the memfd unsealed (tests that shrink it use this).
	NoSeal bool
	// AbortAfter, when positive, makes the front-end drop the connection
	// instead of sending its message number AbortAfter+1: fault tests use
	// it to disconnect at every step of start-up.
	AbortAfter int
	// Spin is how long Exec polls the used ring for the answer, yielding
	// the processor between looks, before it sleeps on the call eventfd;
	// zero means 20µs, a negative value not at all.
	Spin time.Duration
}

// Frontend is one connected front-end.
type Frontend struct {
	cfg   Config
	conn  *vu.Conn
	fd    int // the memfd, kept to send again (SET_MEM_TABLE) and for tests
	mem   *memmap.Region
	alloc *allocator // guest memory allocator (alloc.go)
	log   []byte     // the dirty log's mapping (StartDirtyLog), unmapped by Close

	// Negotiated.
	DeviceFeatures   uint64
	Features         uint64
	ProtocolFeatures uint64
	NumQueues        int
	MaxMemSlots      uint64

	queues []*Queue

	sent       int    // messages sent, for AbortAfter
	scratch    []byte // Exec's request and response buffers
	scratchGPA abi.GPA

	backendConn   *vu.Conn
	backendEvents chan vu.BackendRequest
	wg            sync.WaitGroup
}

// Queue is a driver-side virtqueue with its eventfds.
type Queue struct {
	Index int
	*virtio.DriverQueue
	Kick, Call, Err   *eventfd.EventFD
	desc, avail, used abi.GPA
	rings             virtio.Rings // host views of the rings, for tests that forge them
	base              uint16       // ring base for the next start (from GET_VRING_BASE)
	started           bool
}

// ProtocolFeatures is what this front-end accepts, as QEMU 10 does for the
// generic device.
const ProtocolFeatures = vu.ProtocolMQ | vu.ProtocolReplyAck | vu.ProtocolBackendReq |
	vu.ProtocolConfig | vu.ProtocolResetDevice | vu.ProtocolConfigureMemSlots | vu.ProtocolStatus |
	vu.ProtocolLogShmfd | vu.ProtocolInflightShmfd | vu.ProtocolBackendSendFd | vu.ProtocolDeviceState

// Dial connects to the back-end, creates guest memory and performs QEMU's
// realize sequence: GET_FEATURES, GET_PROTOCOL_FEATURES,
// SET_PROTOCOL_FEATURES, GET_QUEUE_NUM, GET_MAX_MEM_SLOTS,
// SET_BACKEND_REQ_FD, SET_OWNER, then SET_VRING_CALL and SET_VRING_ERR for
// every queue.
func Dial(ctx context.Context, cfg Config) (*Frontend, error) {
	f, err := Connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := f.Realize(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// Connect connects and creates guest memory without sending anything.
func Connect(ctx context.Context, cfg Config) (*Frontend, error) {
	if cfg.MemorySize == 0 {
		cfg.MemorySize = 64 << 20
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = 256
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	fd, err := memmap.NewMemfd("vrdma-guest", cfg.MemorySize)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("frontend: guest memory: %w", err)
	}
	if !cfg.NoSeal {
		if err := memmap.SealSize(fd); err != nil {
			unix.Close(fd)
			c.Close()
			return nil, fmt.Errorf("frontend: seal guest memory: %w", err)
		}
	}
	mfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		c.Close()
		return nil, fmt.Errorf("frontend: %w", err)
	}
	region, err := memmap.MapRegion(mfd, memmap.RegionSpec{GuestAddr: 0, Size: cfg.MemorySize, UserAddr: UserBase})
	if err != nil {
		unix.Close(fd)
		c.Close()
		return nil, fmt.Errorf("frontend: map guest memory: %w", err)
	}
	return &Frontend{
		cfg:  cfg,
		conn: vu.NewConn(c.(*net.UnixConn)),
		fd:   fd,
		mem:  region,
		// Leave GPA 0 unused: a zero address is a bug's favourite.
		alloc: newAllocator(4096, cfg.MemorySize),
	}, nil
}

// Conn is the raw connection, for tests that send what QEMU never would.
func (f *Frontend) Conn() *vu.Conn { return f.conn }

// MemFd is the guest memory's memfd (owned by f).
func (f *Frontend) MemFd() int { return f.fd }

// Memory is the guest memory as this process sees it.
func (f *Frontend) Memory() []byte { return f.mem.Bytes() }

// MemoryRegion is the one region of guest memory as sent to the back-end.
func (f *Frontend) MemoryRegion() vu.MemoryRegion {
	return vu.MemoryRegion{GuestAddr: 0, Size: f.cfg.MemorySize, UserAddr: UserBase, MmapOffset: 0}
}

// Call sends a request and, when it expects one, returns the reply.
func (f *Frontend) Call(req vu.Request, payload []byte, fds []int, wantReply bool) (*vu.Message, error) {
	if err := f.gate(req); err != nil {
		return nil, err
	}
	return f.conn.Call(req, payload, fds, wantReply)
}

// callU64 sends a request whose reply is a u64.
func (f *Frontend) callU64(req vu.Request) (uint64, error) {
	m, err := f.Call(req, nil, nil, true)
	if err != nil {
		return 0, err
	}
	defer m.CloseFds()
	return vu.DecodeU64(m.Payload)
}

// Send sends a request that has no reply of its own; with REPLY_ACK it
// asks for one and returns the back-end's verdict.
func (f *Frontend) Send(req vu.Request, payload []byte, fds []int) error {
	if err := f.gate(req); err != nil {
		return err
	}
	if f.ProtocolFeatures&vu.ProtocolReplyAck == 0 {
		h := vu.Header{Request: uint32(req), Flags: vu.FlagVersion, Size: uint32(len(payload))}
		return f.conn.WriteMessage(h, payload, fds)
	}
	h := vu.Header{Request: uint32(req), Flags: vu.FlagVersion | vu.FlagNeedReply, Size: uint32(len(payload))}
	if err := f.conn.WriteMessage(h, payload, fds); err != nil {
		return err
	}
	m, err := f.conn.ReadMessage()
	if err != nil {
		return fmt.Errorf("%s: %w", req, err)
	}
	defer m.CloseFds()
	if req.Known() {
		if err := vu.CheckReply(req, m); err != nil {
			return err
		}
	} else if m.Request != uint32(req) || !m.IsReply() {
		return fmt.Errorf("%s: reply to %s", req, vu.Request(m.Request))
	}
	v, err := vu.DecodeU64(m.Payload)
	if err != nil {
		return err
	}
	if v != 0 {
		return &NackError{Request: req, Status: v}
	}
	return nil
}

// Sent is the number of vhost-user messages sent so far (counted only
// when Config.AbortAfter is set).
func (f *Frontend) Sent() int { return f.sent }

// ErrAborted is returned once Config.AbortAfter messages were sent.
var ErrAborted = errors.New("frontend: connection dropped on purpose (AbortAfter)")

// gate counts messages and drops the connection when AbortAfter is
// reached.
func (f *Frontend) gate(req vu.Request) error {
	if f.cfg.AbortAfter <= 0 {
		return nil
	}
	if f.sent >= f.cfg.AbortAfter {
		f.conn.Close()
		return fmt.Errorf("%s: %w", req, ErrAborted)
	}
	f.sent++
	return nil
}

// NackError is a REPLY_ACK with a non-zero status.
type NackError struct {
	Request vu.Request
	Status  uint64
}

func (e *NackError) Error() string {
	return fmt.Sprintf("%s: back-end answered failure (%d)", e.Request, e.Status)
}

// SetVringFile sends SET_VRING_KICK/CALL/ERR for queue i with e's fd (nil:
// the no-fd flag).
func (f *Frontend) SetVringFile(req vu.Request, i int, e *eventfd.EventFD) error {
	if e == nil {
		return f.Send(req, vu.EncodeU64(vu.EncodeVringFile(uint8(i), true)), nil)
	}
	return f.Send(req, vu.EncodeU64(vu.EncodeVringFile(uint8(i), false)), []int{e.Fd()})
}

func (f *Frontend) setupBackendChannel() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("frontend: backend channel: %w", err)
	}
	file := os.NewFile(uintptr(fds[0]), "backend-channel")
	c, err := net.FileConn(file)
	file.Close()
	if err != nil {
		unix.Close(fds[1])
		return err
	}
	err = f.Send(vu.SetBackendReqFd, nil, []int{fds[1]})
	unix.Close(fds[1])
	if err != nil {
		c.Close()
		return err
	}
	f.backendConn = vu.NewConn(c.(*net.UnixConn))
	f.backendEvents = make(chan vu.BackendRequest, 16)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer close(f.backendEvents)
		for {
			m, err := f.backendConn.ReadMessage()
			if err != nil {
				return
			}
			m.CloseFds()
			select {
			case f.backendEvents <- vu.BackendRequest(m.Request):
			default:
			}
			if m.NeedReply() {
				f.backendConn.ReplyU64(vu.Request(m.Request), 0)
			}
		}
	}()
	return nil
}

// BackendEvents delivers the requests the back-end sends on its channel
// (e.g. CONFIG_CHANGE_MSG). Closed when the channel closes.
func (f *Frontend) BackendEvents() <-chan vu.BackendRequest { return f.backendEvents }

// Queue returns queue i.
func (f *Frontend) Queue(i int) *Queue { return f.queues[i] }

// SetMemTable sends the guest memory table.
func (f *Frontend) SetMemTable() error {
	mt := vu.MemTable{Regions: []vu.MemoryRegion{f.MemoryRegion()}}
	return f.Send(vu.SetMemTable, mt.Encode(), []int{f.fd})
}

// ReadConfig reads n bytes of device config space at off (GET_CONFIG).
func (f *Frontend) ReadConfig(off, n uint32) ([]byte, error) {
	msg := vu.ConfigMsg{Offset: off, Size: n, Data: make([]byte, n)}
	m, err := f.Call(vu.GetConfig, msg.Encode(), nil, true)
	if err != nil {
		return nil, err
	}
	defer m.CloseFds()
	c, err := vu.DecodeConfigMsg(m.Payload)
	if err != nil {
		return nil, fmt.Errorf("frontend: GET_CONFIG reply: %w", err)
	}
	if c.Size != n {
		return nil, fmt.Errorf("frontend: GET_CONFIG failed (reply of %d bytes)", c.Size)
	}
	return c.Data, nil
}

// Rings returns host views of q's rings (nil before the first Start), for
// tests that write what no correct driver would.
func (q *Queue) Rings() virtio.Rings { return q.rings }

// Notify kicks queue q if the device wants it.
func (q *Queue) Notify() error {
	if q.NeedsKick() {
		return q.Kick.Signal()
	}
	return nil
}

// ErrTimeout is returned when the device did not answer in time.
var ErrTimeout = errors.New("frontend: timed out waiting for the device")

// SpinUsed polls q's used ring for up to d, yielding the processor between
// looks, and reports whether a used element is there.
func (q *Queue) SpinUsed(d time.Duration) bool {
	if d <= 0 {
		return q.HasUsed()
	}
	start := time.Now()
	for !q.HasUsed() {
		if time.Since(start) >= d {
			return false
		}
		runtime.Gosched()
	}
	return true
}

// WaitUsed waits up to timeout for the next used element of q.
func (q *Queue) WaitUsed(timeout time.Duration) (head uint16, written uint32, err error) {
	deadline := time.Now().Add(timeout)
	for {
		h, n, ok, err := q.Used()
		if err != nil {
			return 0, 0, err
		}
		if ok {
			return h, n, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return 0, 0, ErrTimeout
		}
		// Sleep until the device signals the call eventfd (it does when it
		// returns a chain and the driver has interrupts enabled), but look
		// at the ring again at least every millisecond: a suppressed or
		// coalesced interrupt must never hang a caller.
		q.EnableInterrupts()
		if q.HasUsed() {
			continue
		}
		q.Call.WaitTimeout(min(left, time.Millisecond))
	}
}

// Close disconnects and releases guest memory, eventfds and the backend
// channel.
func (f *Frontend) Close() error {
	err := f.conn.Close()
	if f.backendConn != nil {
		f.backendConn.Close()
	}
	f.wg.Wait()
	for _, q := range f.queues {
		if q == nil {
			continue
		}
		q.Kick.Close()
		q.Call.Close()
		q.Err.Close()
	}
	if f.mem != nil {
		f.mem.Release()
		f.mem = nil
	}
	if f.fd >= 0 {
		unix.Close(f.fd)
		f.fd = -1
	}
	if f.log != nil {
		unix.Munmap(f.log)
		f.log = nil
	}
	return err
}
