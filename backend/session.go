package backend

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// ProtocolFeatures are the vhost-user protocol features the back-end
// offers. DEVICE_STATE moves a StateSaver device's state (devstate.go).
// LOG_SHMFD carries a migration's dirty log (session_log.go; the session
// offers VHOST_F_LOG_ALL for a device that logs its writes, DirtyLogger).
// Not offered, deliberately: INFLIGHT_SHMFD, in-band notifications, host
// notifiers.
const ProtocolFeatures = vu.ProtocolMQ | vu.ProtocolLogShmfd | vu.ProtocolReplyAck | vu.ProtocolBackendReq |
	vu.ProtocolConfig | vu.ProtocolResetDevice | vu.ProtocolConfigureMemSlots | vu.ProtocolStatus |
	vu.ProtocolDeviceState

// errUnsupported answers requests for features the back-end did not offer.
var errUnsupported = errors.New("request not supported")

// session serves one front-end connection. Everything but the rings'
// workers runs on the session goroutine, so a field marked "session
// goroutine" is read and written only there, without a lock. Lock order:
// doc.go.
type session struct {
	conn  *vu.Conn       // immutable; closed by teardown (or Server.Disconnect, from any goroutine)
	dev   Device         // immutable
	log   *logrus.Entry  // immutable
	mem   *memmap.Memory // immutable; its table is swapped atomically (memmap.Memory)
	stats *Stats         // immutable; atomic counters

	features uint64 // session goroutine: acked virtio features
	// protocol (acked protocol features) is written by the session
	// goroutine with backendMu held, and read there freely and elsewhere
	// (NotifyConfigChange) with backendMu.
	protocol    uint64
	protocolSet bool           // session goroutine
	owner       bool           // session goroutine; recorded, not required (doc.go, "Errors")
	status      uint8          // session goroutine
	rings       []*vring       // immutable slice; each vring documents its fields
	queues      []*Queue       // immutable slice
	wg          sync.WaitGroup // counts running ring workers
	backendMu   sync.Mutex     // protects backendConn and writes of protocol; a leaf: no blocking call while held
	backendConn *vu.Conn       // protected by backendMu
	closing     atomic.Bool    // atomic: the connection is being closed on purpose (teardown, Server.Disconnect)
	done        chan struct{}  // immutable; closed by Server.runSession when the session has released everything
	resumed     atomic.Bool    // atomic: rings resumed from a base this session never produced

	// logBase is the last SET_LOG_BASE's dirty log, one reference, nil
	// when none (session goroutine; session_log.go).
	logBase *memmap.DirtyLog

	// Freezing (handover.go). backendFrozen and configPending are
	// protected by backendMu; notifying counts NotifyConfigChange writes
	// in flight (Add under backendMu while not frozen).
	backendFrozen bool           // protected by backendMu: NotifyConfigChange records instead of writing
	configPending bool           // protected by backendMu: a config change arrived while frozen
	notifying     sync.WaitGroup // writes on the backend channel in flight
	pauseMu       sync.Mutex     // a leaf; protects freezeReq
	freezeReq     *freezeRequest // protected by pauseMu; the Freeze waiting for this session, nil when none
	kill          chan struct{}  // immutable; closed (killOnce) by end: a paused session ends
	killOnce      sync.Once
	xfer          *stateTransfer // session goroutine: the device-state transfer under way (devstate.go)
	suspended     bool           // session goroutine: the device was told it is suspended (Suspender)
}

func newSession(c *net.UnixConn, dev Device, log *logrus.Entry, stats *Stats) *session {
	s := &session{
		conn:  vu.NewConn(c),
		dev:   dev,
		log:   log,
		mem:   memmap.NewMemory(),
		stats: stats,
		done:  make(chan struct{}),
		kill:  make(chan struct{}),
	}
	n := dev.NumQueues()
	s.rings = make([]*vring, n)
	s.queues = make([]*Queue, n)
	for i := range n {
		q := &Queue{index: i}
		r := &vring{s: s, q: q, wg: &s.wg}
		q.vr = r
		s.rings[i] = r
		s.queues[i] = q
	}
	return s
}

// Host implementation for the device.

func (s *session) Memory() *memmap.Memory { return s.mem }

func (s *session) Queue(i int) *Queue {
	if i < 0 || i >= len(s.queues) {
		return nil
	}
	return s.queues[i]
}

func (s *session) Resumed() bool { return s.resumed.Load() }

// NotifyConfigChange may be called from any goroutine. It writes without
// backendMu: a front-end that does not read its channel blocks the write
// until teardown (or a new channel) closes the connection, and closing must
// not wait for the blocked writer. vu.Conn serialises concurrent writes.
func (s *session) NotifyConfigChange() error {
	s.backendMu.Lock()
	c := s.backendConn
	if s.protocol&vu.ProtocolBackendReq == 0 {
		c = nil
	}
	if c != nil && s.backendFrozen {
		// Frozen (handover.go): nothing goes to the front-end; the
		// change is sent when the session runs again, here or in the
		// process it was handed to.
		s.configPending = true
		c = nil
	}
	if c != nil {
		s.notifying.Add(1)
	}
	s.backendMu.Unlock()
	if c == nil {
		return nil
	}
	defer s.notifying.Done()
	return writeConfigChange(c)
}

func writeConfigChange(c *vu.Conn) error {
	h := vu.Header{Request: uint32(vu.BackendConfigChangeMsg), Flags: vu.FlagVersion}
	return c.WriteMessage(h, nil, nil)
}

// serve runs until the front-end disconnects or the connection must close
// because of a protocol error. It releases everything the front-end owned
// before it returns.
func (s *session) serve() error {
	s.dev.Attach(s)
	return s.run()
}

// run is serve's loop, for a session the device is attached to. Between
// two messages it may pause for a Freeze (handover.go).
func (s *session) run() error {
	defer s.teardown()
	for {
		m, err := s.conn.ReadMessage()
		if errors.Is(err, vu.ErrPaused) {
			if s.paused() {
				continue
			}
			return nil
		}
		if err != nil {
			if s.closing.Load() || errors.Is(err, net.ErrClosed) || isEOF(err) {
				return nil
			}
			return err
		}
		s.stats.messages.Add(1)
		if err := s.handle(m); err != nil {
			return err
		}
	}
}

// handle validates and dispatches one message; a non-nil error ends the
// session.
func (s *session) handle(m *vu.Message) error {
	defer m.CloseFds() // whatever a handler did not take
	req := m.Req()
	if m.Flags&vu.FlagReply != 0 {
		return fmt.Errorf("%s: reply flag set on a request", req)
	}
	reply, err := []byte(nil), vu.Check(m)
	if err == nil {
		reply, err = s.dispatch(m)
	}
	// The entry is built only when it is written: one per message was
	// most of what a connect allocated (backend/doc.go, "Cost of a device").
	if err != nil {
		s.stats.protocolErrors.Add(1)
		s.log.WithField("msg", req.String()).WithError(err).Warn("request failed")
	} else if s.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
		s.log.WithField("msg", req.String()).Debug("request")
	}
	if req == vu.SetLogBase && s.protocol&vu.ProtocolLogShmfd != 0 {
		// With LOG_SHMFD the front-end waits for an answer (QEMU reads
		// it before it syncs the previous log): a u64, 0 when the log
		// is in use, as REPLY_ACK's; a refused log is never written.
		var status uint64
		if err != nil {
			status = 1
		}
		return s.reply(req, vu.EncodeU64(status))
	}
	if alwaysReplies(req) {
		if err != nil {
			// There is no way to say "failed" in these replies but to
			// break the stream: the front-end's reply check fails and it
			// sees the back-end as gone.
			if req == vu.GetConfig {
				// An empty GET_CONFIG reply is how vhost-user says "failed".
				return s.reply(req, nil)
			}
			return fmt.Errorf("%s: %w", req, err)
		}
		return s.reply(req, reply)
	}
	if m.NeedReply() && s.protocol&vu.ProtocolReplyAck != 0 {
		var status uint64
		if err != nil {
			status = 1
		}
		return s.reply(req, vu.EncodeU64(status))
	}
	return nil
}

// alwaysReplies lists the requests answered whether or not REPLY_ACK was
// negotiated.
func alwaysReplies(r vu.Request) bool {
	switch r {
	case vu.GetFeatures, vu.GetProtocolFeatures, vu.GetVringBase, vu.GetConfig,
		vu.GetQueueNum, vu.GetMaxMemSlots, vu.GetStatus, vu.GetInflightFd,
		vu.SetDeviceStateFd, vu.CheckDeviceState:
		return true
	}
	return false
}

func (s *session) reply(req vu.Request, payload []byte) error {
	h := vu.Header{Request: uint32(req), Flags: vu.FlagVersion | vu.FlagReply, Size: uint32(len(payload))}
	return s.conn.WriteMessage(h, payload, nil)
}

func (s *session) offered() uint64 {
	f := s.dev.Features() | vu.FeatureProtocolFeatures
	if s.logsDirty() {
		f |= virtio.FeatureLogAll
	}
	return f
}

func (s *session) ring(index uint32) (*vring, error) {
	if index >= uint32(len(s.rings)) {
		return nil, fmt.Errorf("ring index %d out of range (device has %d)", index, len(s.rings))
	}
	return s.rings[index], nil
}

func (s *session) dispatch(m *vu.Message) ([]byte, error) {
	p := m.Payload
	switch m.Req() {
	case vu.GetFeatures:
		return vu.EncodeU64(s.offered()), nil
	case vu.SetFeatures:
		f, err := vu.DecodeU64(p)
		if err != nil {
			return nil, err
		}
		if f&^s.offered() != 0 {
			return nil, fmt.Errorf("features %#x not offered (offered %#x)", f&^s.offered(), s.offered())
		}
		was := s.features
		s.features = f
		s.setLogAll(was)
		if f&vu.FeatureProtocolFeatures == 0 {
			// "If VHOST_USER_F_PROTOCOL_FEATURES has not been negotiated,
			// the ring starts directly in the enabled state."
			for _, r := range s.rings {
				r.enabled.Store(true)
			}
		}
		return nil, nil
	case vu.SetOwner:
		s.owner = true
		return nil, nil
	case vu.ResetOwner:
		s.resetDevice()
		s.owner = false
		return nil, nil
	case vu.GetProtocolFeatures:
		return vu.EncodeU64(ProtocolFeatures), nil
	case vu.SetProtocolFeatures:
		f, err := vu.DecodeU64(p)
		if err != nil {
			return nil, err
		}
		if f&^ProtocolFeatures != 0 {
			return nil, fmt.Errorf("protocol features %#x not offered", f&^ProtocolFeatures)
		}
		s.backendMu.Lock() // NotifyConfigChange reads protocol
		s.protocol, s.protocolSet = f, true
		s.backendMu.Unlock()
		return nil, nil
	case vu.GetQueueNum:
		return vu.EncodeU64(uint64(len(s.rings))), nil
	case vu.GetMaxMemSlots:
		return vu.EncodeU64(memmap.MaxRegions), nil
	case vu.SetBackendReqFd:
		return nil, s.setBackendChannel(m)
	case vu.SetMemTable:
		if err := s.checkLogCoversTable(m); err != nil {
			return nil, err
		}
		return nil, s.setMemTable(m)
	case vu.AddMemReg:
		if err := s.checkLogCoversTable(m); err != nil {
			return nil, err
		}
		return nil, s.addMemReg(m)
	case vu.SetLogBase:
		return nil, s.setLogBase(m)
	case vu.SetLogFd:
		return nil, s.setLogFd(m)
	case vu.RemMemReg:
		return nil, s.remMemReg(m)
	case vu.SetVringNum:
		return nil, s.setVringNum(p)
	case vu.SetVringAddr:
		return nil, s.setVringAddr(p)
	case vu.SetVringBase:
		return nil, s.setVringBase(p)
	case vu.GetVringBase:
		return s.getVringBase(p)
	case vu.SetVringKick, vu.SetVringCall, vu.SetVringErr:
		return nil, s.setVringFile(m)
	case vu.SetVringEnable:
		return nil, s.setVringEnable(p)
	case vu.GetConfig:
		return s.getConfig(p)
	case vu.SetConfig:
		return nil, s.setConfig(p)
	case vu.ResetDevice:
		s.resetDevice()
		return nil, nil
	case vu.SetStatus:
		return nil, s.setStatus(p)
	case vu.GetStatus:
		return vu.EncodeU64(uint64(s.status)), nil
	case vu.SetDeviceStateFd:
		return s.setDeviceStateFd(m)
	case vu.CheckDeviceState:
		return s.checkDeviceState()
	}
	return nil, fmt.Errorf("%w: %s", errUnsupported, m.Req())
}

func (s *session) setBackendChannel(m *vu.Message) error {
	if s.protocol&vu.ProtocolBackendReq == 0 {
		return fmt.Errorf("%w: BACKEND_REQ not negotiated", errUnsupported)
	}
	fd, err := m.TakeFd(0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "vhost-user-backend")
	c, err := net.FileConn(f) // dups
	f.Close()
	if err != nil {
		return fmt.Errorf("backend channel: %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return errors.New("backend channel is not a unix socket")
	}
	s.backendMu.Lock()
	old := s.backendConn
	s.backendConn = vu.NewConn(uc)
	s.backendMu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

func (s *session) configRange(off, size uint32) error {
	if s.protocol&vu.ProtocolConfig == 0 {
		return fmt.Errorf("%w: CONFIG not negotiated", errUnsupported)
	}
	end := uint64(off) + uint64(size)
	if size == 0 || end > uint64(s.dev.ConfigSize()) {
		return fmt.Errorf("config range [%d, %d) outside config space of %d bytes", off, end, s.dev.ConfigSize())
	}
	return nil
}

func (s *session) getConfig(p []byte) ([]byte, error) {
	c, err := vu.DecodeConfigMsg(p)
	if err != nil {
		return nil, err
	}
	if err := s.configRange(c.Offset, c.Size); err != nil {
		return nil, err
	}
	buf := make([]byte, c.Size)
	if err := s.dev.ReadConfig(int(c.Offset), buf); err != nil {
		return nil, err
	}
	c.Data = buf
	return c.Encode(), nil
}

func (s *session) setConfig(p []byte) error {
	c, err := vu.DecodeConfigMsg(p)
	if err != nil {
		return err
	}
	if err := s.configRange(c.Offset, c.Size); err != nil {
		return err
	}
	return s.dev.WriteConfig(int(c.Offset), c.Data)
}

func (s *session) setStatus(p []byte) error {
	if s.protocol&vu.ProtocolStatus == 0 {
		return fmt.Errorf("%w: STATUS not negotiated", errUnsupported)
	}
	u, err := vu.DecodeU64(p)
	if err != nil {
		return err
	}
	if u > 0xff {
		return fmt.Errorf("status %#x does not fit the 8-bit device status", u)
	}
	// QEMU's generic device sends 0 when the guest resets the device (and
	// when the VM stops): the device's objects go, rings and memory stay.
	if u == 0 && s.status != 0 {
		s.dev.Reset()
		s.suspended = false
		s.resumed.Store(false)
	}
	s.status = uint8(u)
	return nil
}

// stopRings stops every ring's worker.
func (s *session) stopRings() {
	for _, r := range s.rings {
		r.stop()
	}
}

// resetDevice is RESET_DEVICE: "disable all rings and reset all internal
// device state to the initial state". Guest memory stays mapped: the
// front-end keeps ownership of the device and sends a new table when it
// wants to.
func (s *session) resetDevice() {
	s.stopRings()
	for _, r := range s.rings {
		r.reset()
	}
	s.dev.Reset()
	s.suspended = false
	s.resumed.Store(false)
	s.features, s.status = 0, 0
	s.dropLog()
}

// end closes the connection on purpose (Server.Disconnect, Close): the
// session's goroutine, reading or paused, tears the session down.
func (s *session) end() {
	s.closing.Store(true)
	s.conn.Close()
	s.killOnce.Do(func() { close(s.kill) })
}

// teardown releases everything the front-end owned: workers, fds, device
// resources, memory maps.
func (s *session) teardown() {
	s.closing.Store(true)
	s.stopRings()
	s.wg.Wait()
	for _, r := range s.rings {
		r.reset()
	}
	s.dev.Reset()
	s.dev.Detach()
	s.backendMu.Lock()
	if s.backendConn != nil {
		s.backendConn.Close()
		s.backendConn = nil
	}
	s.backendMu.Unlock()
	s.dropLog()
	s.mem.Close()
	s.conn.Close()
}

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET)
}
