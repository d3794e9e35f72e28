package backend

import (
	"errors"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// backendChannel sends SET_BACKEND_REQ_FD (with need_reply) and returns
// the front-end's end of the channel and the REPLY_ACK status.
func (f *testFrontend) backendChannel() (*vu.Conn, uint64) {
	f.t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		f.t.Fatal(err)
	}
	st := f.ack(vu.SetBackendReqFd, nil, fds[1])
	unix.Close(fds[1])
	file := os.NewFile(uintptr(fds[0]), "backend-channel")
	c, err := net.FileConn(file)
	file.Close()
	if err != nil {
		f.t.Fatal(err)
	}
	bc := vu.NewConn(c.(*net.UnixConn))
	f.t.Cleanup(func() { bc.Close() })
	return bc, st
}

// getConfig sends GET_CONFIG and returns the reply's data (nil for the
// empty reply that means failure).
func (f *testFrontend) getConfig(off, size uint32) []byte {
	f.t.Helper()
	m := f.call(vu.GetConfig, vu.ConfigMsg{Offset: off, Size: size}.Encode())
	if len(m.Payload) == 0 {
		return nil
	}
	c, err := vu.DecodeConfigMsg(m.Payload)
	if err != nil {
		f.t.Fatal(err)
	}
	if c.Offset != off || c.Size != size {
		f.t.Fatalf("GET_CONFIG reply for [%d,+%d), want [%d,+%d)", c.Offset, c.Size, off, size)
	}
	return c.Data
}

func (f *testFrontend) getVringBase(i int) uint32 {
	f.t.Helper()
	st, err := vu.DecodeVringState(f.call(vu.GetVringBase, vu.VringState{Index: uint32(i)}.Encode()).Payload)
	if err != nil {
		f.t.Fatal(err)
	}
	if st.Index != uint32(i) {
		f.t.Fatalf("GET_VRING_BASE reply for ring %d, want %d", st.Index, i)
	}
	return st.Num
}

// TestQEMUSequence drives a session through the message order of QEMU 10's
// generic device: realize, DRIVER_OK with two queues, traffic, config
// access, a config-change notification, stop, disconnect.
func TestQEMUSequence(t *testing.T) {
	dev := newFakeDevice(2)
	f := newFrontend(t, dev)

	// Realize.
	if got, want := f.getU64(vu.GetFeatures), dev.features|vu.FeatureProtocolFeatures; got != want {
		t.Fatalf("GET_FEATURES: got %#x, want %#x", got, want)
	}
	if got := f.getU64(vu.GetProtocolFeatures); got != ProtocolFeatures {
		t.Fatalf("GET_PROTOCOL_FEATURES: got %#x, want %#x", got, ProtocolFeatures)
	}
	if ProtocolFeatures&vu.ProtocolLogShmfd == 0 {
		t.Fatal("LOG_SHMFD not offered: the dirty log of a migration has no way in")
	}
	f.send(vu.SetProtocolFeatures, vu.EncodeU64(ProtocolFeatures))
	if got := f.getU64(vu.GetQueueNum); got != 2 {
		t.Fatalf("GET_QUEUE_NUM: got %d, want 2", got)
	}
	if got := f.getU64(vu.GetMaxMemSlots); got != memmap.MaxRegions {
		t.Fatalf("GET_MAX_MEM_SLOTS: got %d, want %d", got, memmap.MaxRegions)
	}
	bc, st := f.backendChannel()
	if st != 0 {
		t.Fatalf("SET_BACKEND_REQ_FD: status %d", st)
	}
	f.mustAck(vu.SetOwner, nil)
	for i := range 2 {
		r := f.ring(i)
		f.mustAck(vu.SetVringCall, vringFile(i, false), r.call.Fd())
		f.mustAck(vu.SetVringErr, vringFile(i, false), r.errfd.Fd())
	}
	if got := f.getU64(vu.GetStatus); got != 0 {
		t.Fatalf("GET_STATUS before DRIVER_OK: got %#x, want 0", got)
	}

	// DRIVER_OK.
	f.mustAck(vu.SetFeatures, vu.EncodeU64(dev.features|vu.FeatureProtocolFeatures))
	f.feats = dev.features
	f.mustAck(vu.SetMemTable, vu.MemTable{Regions: []vu.MemoryRegion{f.region()}}.Encode(), f.memfd)
	for i := range 2 {
		r := f.ring(i)
		f.newDriverQueue(r, queueSize)
		f.mustAck(vu.SetVringNum, vu.VringState{Index: uint32(i), Num: queueSize}.Encode())
		f.mustAck(vu.SetVringBase, vu.VringState{Index: uint32(i), Num: 0}.Encode())
		f.mustAck(vu.SetVringAddr, r.addr())
		f.mustAck(vu.SetVringKick, vringFile(i, false), r.kick.Fd())
	}
	for i := range 2 {
		f.mustAck(vu.SetVringEnable, vu.VringState{Index: uint32(i), Num: 1}.Encode())
	}
	status := uint64(virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK | virtio.StatusDriverOK)
	f.mustAck(vu.SetStatus, vu.EncodeU64(status))
	if got := f.getU64(vu.GetStatus); got != status {
		t.Fatalf("GET_STATUS: got %#x, want %#x", got, status)
	}

	// Traffic on both queues.
	for n := range 3 {
		for i := range 2 {
			f.roundTrip(f.rings[i], string(rune('a'+n))+"-hello")
		}
	}
	if dev.Host().Resumed() {
		t.Error("Resumed after a start from index 0")
	}

	// Config space.
	if got := f.getConfig(4, 4); string(got) != "4567" {
		t.Fatalf("GET_CONFIG [4,8): got %q, want %q", got, "4567")
	}
	f.mustAck(vu.SetConfig, vu.ConfigMsg{Offset: 2, Size: 2, Data: []byte("XY")}.Encode())
	if got := f.getConfig(0, 16); string(got) != "01XY456789abcdef" {
		t.Fatalf("config after SET_CONFIG: got %q", got)
	}

	// A config change reaches the front-end on the backend channel.
	if err := dev.Host().NotifyConfigChange(); err != nil {
		t.Fatalf("NotifyConfigChange: %v", err)
	}
	bc.UnixConn().SetReadDeadline(time.Now().Add(waitLong))
	m, err := bc.ReadMessage()
	if err != nil {
		t.Fatalf("backend channel: %v", err)
	}
	if err := vu.CheckBackendRequest(m); err != nil || vu.BackendRequest(m.Request) != vu.BackendConfigChangeMsg {
		t.Fatalf("backend channel: got %v (%v), want CONFIG_CHANGE_MSG", vu.BackendRequest(m.Request), err)
	}

	// Stop: disable, then GET_VRING_BASE returns the next avail index.
	for i := range 2 {
		f.mustAck(vu.SetVringEnable, vu.VringState{Index: uint32(i), Num: 0}.Encode())
	}
	for i := range 2 {
		if got := f.getVringBase(i); got != 3 {
			t.Fatalf("GET_VRING_BASE %d: got %d, want 3", i, got)
		}
	}

	if got := f.stats.memTables.Load(); got != 1 {
		t.Errorf("mem tables: got %d, want 1", got)
	}
	if got := f.stats.interrupts.Load(); got < 6 {
		t.Errorf("interrupts: got %d, want at least 6", got)
	}
	if got := f.stats.protocolErrors.Load(); got != 0 {
		t.Errorf("protocol errors: got %d, want 0", got)
	}

	f.close()
	if f.err != nil {
		t.Fatalf("serve: %v", f.err)
	}
	want := []string{"Attach", "MemoryChanged", "ReadConfig(4,4)", `WriteConfig(2,"XY")`, "ReadConfig(0,16)", "Reset", "Detach"}
	if got := dev.takeCalls(); !slices.Equal(got, want) {
		t.Fatalf("device calls:\n got %q\nwant %q", got, want)
	}
	// The backend channel was closed with the session.
	if _, err := bc.ReadMessage(); err == nil {
		t.Fatal("backend channel still open after the session ended")
	}
}

// TestReplyAck: need_reply gets a u64 only once REPLY_ACK is negotiated;
// 0 is success and non-zero failure; requests that always reply send their
// reply and nothing more.
func TestReplyAck(t *testing.T) {
	f := newFrontend(t, newFakeDevice(1))

	// Not negotiated: need_reply is ignored, the next reply is the
	// GET_QUEUE_NUM one.
	f.write(vu.SetOwner, vu.FlagNeedReply, nil, nil)
	f.write(vu.SetFeatures, vu.FlagNeedReply, vu.EncodeU64(1<<63), nil) // fails silently
	if got := f.getU64(vu.GetQueueNum); got != 1 {
		t.Fatalf("GET_QUEUE_NUM: got %d, want 1", got)
	}
	if got := f.stats.protocolErrors.Load(); got != 1 {
		t.Fatalf("protocol errors: got %d, want 1", got)
	}

	f.send(vu.SetProtocolFeatures, vu.EncodeU64(vu.ProtocolReplyAck))
	f.mustAck(vu.SetOwner, nil)
	if st := f.ack(vu.SetFeatures, vu.EncodeU64(1<<63)); st != 1 {
		t.Fatalf("SET_FEATURES of a feature not offered: status %d, want 1", st)
	}
	// An always-reply request with need_reply gets exactly one reply.
	f.write(vu.GetFeatures, vu.FlagNeedReply, nil, nil)
	m, err := f.read()
	if err != nil || vu.CheckReply(vu.GetFeatures, m) != nil {
		t.Fatalf("GET_FEATURES with need_reply: %v", err)
	}
	if got := f.getU64(vu.GetQueueNum); got != 1 {
		t.Fatalf("GET_QUEUE_NUM after GET_FEATURES with need_reply: got %d", got)
	}
}

// TestProtocolFeaturesGateEnable: without VHOST_USER_F_PROTOCOL_FEATURES
// rings start enabled and SET_VRING_ENABLE is refused; with it a ring
// starts disabled, swallows kicks until enabled, and catches up then.
func TestProtocolFeaturesGateEnable(t *testing.T) {
	t.Run("without", func(t *testing.T) {
		dev := newFakeDevice(1)
		f := newFrontend(t, dev)
		f.send(vu.SetOwner, nil)
		f.send(vu.SetFeatures, vu.EncodeU64(dev.features)) // no bit 30
		f.feats = dev.features
		f.setMemTable(f.region())
		r := f.ring(0)
		f.newDriverQueue(r, queueSize)
		f.send(vu.SetVringCall, vringFile(0, false), r.call.Fd())
		f.send(vu.SetVringNum, vu.VringState{Num: queueSize}.Encode())
		f.send(vu.SetVringAddr, r.addr())
		f.send(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
		f.roundTrip(r, "enabled at once")
		f.send(vu.SetVringEnable, vu.VringState{Num: 0}.Encode())
		f.sync()
		if got := f.stats.protocolErrors.Load(); got != 1 {
			t.Fatalf("SET_VRING_ENABLE without protocol features: %d protocol errors, want 1", got)
		}
		f.roundTrip(r, "still enabled")
	})
	t.Run("with", func(t *testing.T) {
		dev := newFakeDevice(1)
		f := newFrontend(t, dev)
		f.negotiate(ProtocolFeatures)
		f.mustAck(vu.SetMemTable, vu.MemTable{Regions: []vu.MemoryRegion{f.region()}}.Encode(), f.memfd)
		r := f.ring(0)
		f.newDriverQueue(r, queueSize)
		f.mustAck(vu.SetVringCall, vringFile(0, false), r.call.Fd())
		f.mustAck(vu.SetVringNum, vu.VringState{Num: queueSize}.Encode())
		f.mustAck(vu.SetVringAddr, r.addr())
		f.mustAck(vu.SetVringKick, vringFile(0, false), r.kick.Fd())
		out := f.post(r, []byte("while disabled"))
		if _, err := r.call.WaitTimeout(100 * time.Millisecond); !errors.Is(err, eventfd.ErrTimeout) {
			t.Fatalf("a disabled ring answered: %v", err)
		}
		f.mustAck(vu.SetVringEnable, vu.VringState{Num: 1}.Encode())
		if _, err := r.call.WaitTimeout(waitLong); err != nil {
			t.Fatalf("no interrupt after SET_VRING_ENABLE(1): %v", err)
		}
		if _, _, ok, _ := r.dq.Used(); !ok || string(f.mem[out:out+14]) != "while disabled" {
			t.Fatal("chain made available while disabled not processed after enable")
		}
		f.nack(vu.SetVringEnable, vu.VringState{Num: 2}.Encode())
		f.mustAck(vu.SetVringEnable, vu.VringState{Num: 0}.Encode())
		f.post(r, []byte("x"))
		if _, err := r.call.WaitTimeout(100 * time.Millisecond); !errors.Is(err, eventfd.ErrTimeout) {
			t.Fatalf("a disabled ring answered: %v", err)
		}
	})
}

// TestConfigSpace covers GET_CONFIG and SET_CONFIG, and their failures: an
// empty GET_CONFIG reply, a REPLY_ACK failure for SET_CONFIG.
func TestConfigSpace(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)

	// CONFIG not negotiated.
	f.send(vu.SetProtocolFeatures, vu.EncodeU64(vu.ProtocolReplyAck))
	if got := f.getConfig(0, 4); got != nil {
		t.Fatalf("GET_CONFIG without CONFIG: got %q, want the empty reply", got)
	}
	f.nack(vu.SetConfig, vu.ConfigMsg{Offset: 0, Size: 1, Data: []byte("z")}.Encode())

	f.send(vu.SetProtocolFeatures, vu.EncodeU64(vu.ProtocolReplyAck|vu.ProtocolConfig))
	for _, tc := range []struct {
		name      string
		off, size uint32
		want      string // "" = failure
	}{
		{"whole", 0, 16, "0123456789abcdef"},
		{"middle", 5, 3, "567"},
		{"last byte", 15, 1, "f"},
		{"zero size", 0, 0, ""},
		{"past the end", 10, 7, ""},
		{"offset past the end", 16, 1, ""},
		{"offset overflow", 0xffffffff, 2, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := f.getConfig(tc.off, tc.size)
			if string(got) != tc.want || (tc.want == "" && got != nil) {
				t.Fatalf("GET_CONFIG [%d,+%d): got %q, want %q", tc.off, tc.size, got, tc.want)
			}
			// SET_CONFIG of the same range succeeds exactly when
			// GET_CONFIG did.
			st := f.ack(vu.SetConfig, vu.ConfigMsg{Offset: tc.off, Size: tc.size, Data: []byte(tc.want)}.Encode())
			if (st == 0) != (tc.want != "") {
				t.Fatalf("SET_CONFIG [%d,+%d): status %d", tc.off, tc.size, st)
			}
		})
	}

	// The device's own failures.
	dev.mu.Lock()
	dev.readErr, dev.writeErr = errors.New("read fails"), errors.New("write fails")
	dev.mu.Unlock()
	if got := f.getConfig(0, 4); got != nil {
		t.Fatalf("GET_CONFIG with ReadConfig failing: got %q, want the empty reply", got)
	}
	f.nack(vu.SetConfig, vu.ConfigMsg{Offset: 0, Size: 1, Data: []byte("z")}.Encode())
	// A failed GET_CONFIG does not end the session.
	f.sync()
}

// TestSetStatus: STATUS must be negotiated; a status above 8 bits is
// refused; status 0 after a non-zero status resets the device (not the
// rings: QEMU pauses VMs this way); status 0 again does nothing.
func TestSetStatus(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.negotiate(vu.ProtocolReplyAck)
	f.nack(vu.SetStatus, vu.EncodeU64(1))

	f.send(vu.SetProtocolFeatures, vu.EncodeU64(ProtocolFeatures))
	f.mustAck(vu.SetMemTable, vu.MemTable{Regions: []vu.MemoryRegion{f.region()}}.Encode(), f.memfd)
	r := f.startRing(0, 0)
	f.nack(vu.SetStatus, vu.EncodeU64(0x100))
	f.mustAck(vu.SetStatus, vu.EncodeU64(0))
	if n := dev.count("Reset"); n != 0 {
		t.Fatalf("status 0 from 0 reset the device %d times", n)
	}
	f.mustAck(vu.SetStatus, vu.EncodeU64(0xf))
	f.roundTrip(r, "before")
	f.mustAck(vu.SetStatus, vu.EncodeU64(0))
	if n := dev.count("Reset"); n != 1 {
		t.Fatalf("status 0 after 0xf: %d resets, want 1", n)
	}
	if got := f.getU64(vu.GetStatus); got != 0 {
		t.Fatalf("GET_STATUS: got %#x, want 0", got)
	}
	f.roundTrip(r, "rings stay")
}

// TestMemorySlots covers ADD_MEM_REG and REM_MEM_REG.
func TestMemorySlots(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	half := uint64(memSize / 2)
	low := vu.MemoryRegion{GuestAddr: 0, Size: half, UserAddr: userBase}
	high := vu.MemoryRegion{GuestAddr: half, Size: half, UserAddr: userBase + half, MmapOffset: half}
	regions := func() []memmap.RegionSpec {
		tb := dev.Host().Memory().Acquire()
		defer tb.Release()
		return tb.Regions()
	}

	f.negotiate(vu.ProtocolReplyAck)
	f.nack(vu.AddMemReg, vu.MemRegionMsg{Region: low}.Encode(), f.memfd)
	f.nack(vu.RemMemReg, vu.MemRegionMsg{Region: low}.Encode())

	f.send(vu.SetProtocolFeatures, vu.EncodeU64(ProtocolFeatures))
	f.mustAck(vu.AddMemReg, vu.MemRegionMsg{Region: low}.Encode(), f.memfd)
	f.mustAck(vu.AddMemReg, vu.MemRegionMsg{Region: high}.Encode(), f.memfd)
	if got := regions(); len(got) != 2 || got[1].GuestAddr != abi.GPA(half) {
		t.Fatalf("regions after two ADD_MEM_REG: %+v", got)
	}
	// A ring in the high region works.
	r := f.startRing(0, 0)
	f.roundTrip(r, "two slots")

	// Overlap with an existing region.
	f.nack(vu.AddMemReg, vu.MemRegionMsg{Region: vu.MemoryRegion{GuestAddr: half - 4096, Size: 8192, UserAddr: userBase + memSize}}.Encode(), f.memfd)
	// Removing a region that is not there.
	f.nack(vu.RemMemReg, vu.MemRegionMsg{Region: vu.MemoryRegion{GuestAddr: 1 << 40, Size: 4096, UserAddr: 1 << 41}}.Encode())
	// Removing the low region leaves the high one.
	f.mustAck(vu.RemMemReg, vu.MemRegionMsg{Region: low}.Encode())
	if got := regions(); len(got) != 1 || got[0].GuestAddr != abi.GPA(half) {
		t.Fatalf("regions after REM_MEM_REG: %+v", got)
	}
	// Up to MaxRegions slots, not one more.
	f.mustAck(vu.RemMemReg, vu.MemRegionMsg{Region: high}.Encode())
	page := uint64(4096)
	for i := range uint64(memmap.MaxRegions) {
		reg := vu.MemoryRegion{GuestAddr: i * page, Size: page, UserAddr: userBase + i*page, MmapOffset: i * page}
		f.mustAck(vu.AddMemReg, vu.MemRegionMsg{Region: reg}.Encode(), f.memfd)
	}
	extra := vu.MemoryRegion{GuestAddr: 1 << 30, Size: page, UserAddr: userBase + 1<<30}
	f.nack(vu.AddMemReg, vu.MemRegionMsg{Region: extra}.Encode(), f.memfd)
	if got := len(regions()); got != memmap.MaxRegions {
		t.Fatalf("regions: got %d, want %d", got, memmap.MaxRegions)
	}
}

// TestBackendChannel: SET_BACKEND_REQ_FD needs BACKEND_REQ and a unix
// socket; a second channel replaces the first; NotifyConfigChange is a
// no-op without one.
func TestBackendChannel(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.negotiate(vu.ProtocolReplyAck)
	if err := dev.Host().NotifyConfigChange(); err != nil {
		t.Fatalf("NotifyConfigChange without a channel: %v", err)
	}
	if _, st := f.backendChannel(); st == 0 {
		t.Fatal("SET_BACKEND_REQ_FD without BACKEND_REQ accepted")
	}
	f.send(vu.SetProtocolFeatures, vu.EncodeU64(vu.ProtocolReplyAck|vu.ProtocolBackendReq))

	// Not a socket; a socket that is not a unix socket.
	efd := f.ring(0).kick.Fd()
	f.nack(vu.SetBackendReqFd, nil, efd)
	udp, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.nack(vu.SetBackendReqFd, nil, udp)
	unix.Close(udp)

	first, st := f.backendChannel()
	if st != 0 {
		t.Fatalf("SET_BACKEND_REQ_FD: status %d", st)
	}
	second, st := f.backendChannel()
	if st != 0 {
		t.Fatalf("second SET_BACKEND_REQ_FD: status %d", st)
	}
	first.UnixConn().SetReadDeadline(time.Now().Add(waitLong))
	if _, err := first.ReadMessage(); err == nil {
		t.Fatal("the replaced channel got a message, want it closed")
	}
	if err := dev.Host().NotifyConfigChange(); err != nil {
		t.Fatal(err)
	}
	second.UnixConn().SetReadDeadline(time.Now().Add(waitLong))
	if m, err := second.ReadMessage(); err != nil || vu.BackendRequest(m.Request) != vu.BackendConfigChangeMsg {
		t.Fatalf("new channel: %v", err)
	}
	// With BACKEND_REQ withdrawn the notification is not sent.
	f.send(vu.SetProtocolFeatures, vu.EncodeU64(vu.ProtocolReplyAck))
	f.sync()
	if err := dev.Host().NotifyConfigChange(); err != nil {
		t.Fatal(err)
	}
	second.UnixConn().SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if m, err := second.ReadMessage(); err == nil {
		t.Fatalf("got %v without BACKEND_REQ", vu.BackendRequest(m.Request))
	}
}

// TestNotifyConfigChangeConcurrent: a device may notify from any goroutine
// (a port event, a timer) while the front-end renegotiates protocol
// features. Run with -race.
func TestNotifyConfigChangeConcurrent(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.negotiate(vu.ProtocolReplyAck | vu.ProtocolBackendReq)
	bc, _ := f.backendChannel()
	go func() { // drain the channel
		for {
			if _, err := bc.ReadMessage(); err != nil {
				return
			}
		}
	}()
	h := dev.Host()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			h.NotifyConfigChange()
		}
	}()
	for range 200 {
		f.send(vu.SetProtocolFeatures, vu.EncodeU64(vu.ProtocolReplyAck|vu.ProtocolBackendReq))
	}
	f.sync()
	close(stop)
	wg.Wait()
}

// TestNotifyConfigChangeBlockedDoesNotWedgeTeardown: a front-end that never
// reads its backend channel makes NotifyConfigChange block once the
// socket buffer is full. The front-end going away must still end the
// session (and unblock the notifier), or the device could never serve
// another front-end.
func TestNotifyConfigChangeBlockedDoesNotWedgeTeardown(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.negotiate(vu.ProtocolReplyAck | vu.ProtocolBackendReq)
	f.backendChannel() // never read
	h := dev.Host()
	var sent atomic.Int64
	notifierDone := make(chan error, 1)
	go func() {
		for {
			if err := h.NotifyConfigChange(); err != nil {
				notifierDone <- err
				return
			}
			if sent.Add(1) > 1<<20 {
				notifierDone <- errors.New("the channel never filled up")
				return
			}
		}
	}()
	// Wait until the notifier is stuck.
	for last := int64(-1); ; {
		time.Sleep(50 * time.Millisecond)
		n := sent.Load()
		if n == last {
			break
		}
		last = n
	}
	f.conn.Close()
	select {
	case err := <-f.done:
		f.done = nil
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(waitLong):
		t.Fatal("session teardown blocked behind a notification the front-end never read")
	}
	select {
	case <-notifierDone:
	case <-time.After(waitLong):
		t.Fatal("NotifyConfigChange still blocked after the session ended")
	}
}

// TestResumed: a start from a ring index this back-end never produced
// marks the device resumed (its state for the driver is lost); indices
// that GET_VRING_BASE handed out do not, and a device reset clears it.
func TestResumed(t *testing.T) {
	dev := newFakeDevice(1)
	f := newFrontend(t, dev)
	f.ready()
	r := f.startRing(0, 0)
	f.roundTrip(r, "one")
	f.roundTrip(r, "two")
	if got := f.getVringBase(0); got != 2 {
		t.Fatalf("GET_VRING_BASE: got %d, want 2", got)
	}
	f.mustAck(vu.SetVringBase, vu.VringState{Num: 2}.Encode())
	if dev.Host().Resumed() {
		t.Fatal("Resumed after a restart from our own index")
	}
	f.mustAck(vu.SetVringBase, vu.VringState{Num: 7}.Encode())
	if !dev.Host().Resumed() {
		t.Fatal("not Resumed after a restart from a foreign index")
	}
	f.mustAck(vu.SetStatus, vu.EncodeU64(0xf))
	f.mustAck(vu.SetStatus, vu.EncodeU64(0))
	if dev.Host().Resumed() {
		t.Fatal("still Resumed after status 0")
	}
	f.mustAck(vu.SetVringBase, vu.VringState{Num: 9}.Encode())
	f.mustAck(vu.ResetDevice, nil)
	if dev.Host().Resumed() {
		t.Fatal("still Resumed after RESET_DEVICE")
	}
}

// TestHostQueue: Host.Queue bounds its index.
func TestHostQueue(t *testing.T) {
	dev := newFakeDevice(3)
	f := newFrontend(t, dev)
	f.sync()
	h := dev.Host()
	for i := range 3 {
		if q := h.Queue(i); q == nil || q.Index() != i {
			t.Fatalf("Queue(%d): got %v", i, q)
		}
	}
	for _, i := range []int{-1, 3, 1 << 20} {
		if q := h.Queue(i); q != nil {
			t.Fatalf("Queue(%d): got queue %d, want nil", i, q.Index())
		}
	}
}
