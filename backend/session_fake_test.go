package backend

// The fakes the session tests share: fakeDevice, a Device that records what
// the session asks of it, and testFrontend, a minimal vhost-user front-end
// over a real unix socketpair with memfd guest memory and real eventfds.
//
// vmm/frontend is a complete front-end and importing it here would not make
// a cycle, but it speaks only what QEMU speaks, hides the raw connection's
// timing (REPLY_ACK on everything) and pulls the vmm layer and the device
// ABI into the backend's tests; these tests need to send what QEMU never
// would, so they drive vu.Conn directly.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// Test geometry. Front-end virtual addresses are guest-physical addresses
// plus userBase, so a session that confused the two would fail.
const (
	userBase  = 0x7f00_0000_0000
	memSize   = 4 << 20
	ringSpan  = 0x10000  // guest memory per queue's rings, from ringBase
	ringBase  = 0x10000  // queue i's rings start at ringBase + i*ringSpan
	dataBase  = 0x200000 // buffers
	queueSize = 64
	waitLong  = 5 * time.Second
)

// fakeDevice is a Device with NumQueues queues that records its lifecycle
// and config calls (Attach, MemoryChanged, ReadConfig, WriteConfig, Reset,
// Detach).
// Its queues echo: each chain's readable bytes are copied into its writable
// buffers (see echo), unless handle is set.
type fakeDevice struct {
	features uint64 // immutable
	queues   int    // immutable
	maxQueue int    // immutable

	mu       sync.Mutex
	calls    []string           // protected by mu
	config   []byte             // protected by mu
	readErr  error              // protected by mu; ReadConfig fails with it
	writeErr error              // protected by mu; WriteConfig fails with it
	host     Host               // protected by mu; between Attach and Detach
	handle   func(*Queue) error // protected by mu; nil means echo
}

func newFakeDevice(queues int) *fakeDevice {
	return &fakeDevice{
		features: virtio.FeatureVersion1 | virtio.FeatureEventIdx | virtio.FeatureIndirectDesc,
		queues:   queues,
		maxQueue: 256,
		config:   []byte("0123456789abcdef"),
	}
}

func (d *fakeDevice) record(s string) {
	d.mu.Lock()
	d.calls = append(d.calls, s)
	d.mu.Unlock()
}

// takeCalls returns the calls recorded so far, and forgets them.
func (d *fakeDevice) takeCalls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.calls
	d.calls = nil
	return c
}

// count returns how many recorded calls are name (without forgetting them).
func (d *fakeDevice) count(name string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.calls {
		if c == name {
			n++
		}
	}
	return n
}

func (d *fakeDevice) setHandle(fn func(*Queue) error) {
	d.mu.Lock()
	d.handle = fn
	d.mu.Unlock()
}

func (d *fakeDevice) Features() uint64  { return d.features }
func (d *fakeDevice) NumQueues() int    { return d.queues }
func (d *fakeDevice) MaxQueueSize() int { return d.maxQueue }
func (d *fakeDevice) ConfigSize() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.config)
}

func (d *fakeDevice) ReadConfig(off int, buf []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, fmt.Sprintf("ReadConfig(%d,%d)", off, len(buf)))
	if d.readErr != nil {
		return d.readErr
	}
	copy(buf, d.config[off:])
	return nil
}

func (d *fakeDevice) WriteConfig(off int, data []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, fmt.Sprintf("WriteConfig(%d,%q)", off, data))
	if d.writeErr != nil {
		return d.writeErr
	}
	copy(d.config[off:], data)
	return nil
}

func (d *fakeDevice) Attach(h Host) {
	d.mu.Lock()
	d.host = h
	d.calls = append(d.calls, "Attach")
	d.mu.Unlock()
}

func (d *fakeDevice) Host() Host {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.host
}

func (d *fakeDevice) MemoryChanged() {
	d.record("MemoryChanged")
}

func (d *fakeDevice) HandleQueue(q *Queue) error {
	d.mu.Lock()
	fn := d.handle
	d.mu.Unlock()
	if fn == nil {
		fn = echo
	}
	return fn(q)
}

func (d *fakeDevice) Reset() {
	d.record("Reset")
}

func (d *fakeDevice) Detach() {
	d.mu.Lock()
	d.host = nil
	d.calls = append(d.calls, "Detach")
	d.mu.Unlock()
}

// echo is the fake device's queue work: every chain gets its readable bytes
// back in its writable buffers.
func echo(q *Queue) error {
	var c virtio.Chain
	for {
		ok, err := q.Pop(&c)
		if err != nil || !ok {
			return err
		}
		buf := make([]byte, c.ReadableLen)
		c.Gather(buf)
		n := c.Scatter(buf)
		if err := q.Push(c.Head, uint32(n)); err != nil {
			return err
		}
	}
}

// discardLog is a logger that writes nothing (at debug level, so that the
// debug lines run too).
func discardLog() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(discard{})
	l.SetLevel(logrus.DebugLevel)
	return logrus.NewEntry(l)
}

// socketpair returns both ends of a connected unix stream socketpair.
func socketpair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// testFrontend is a front-end connected to a session over a socketpair.
type testFrontend struct {
	t     testing.TB
	conn  *vu.Conn
	dev   *fakeDevice
	sess  *session    // nil when connected to a Server
	stats *Stats      // nil when connected to a Server
	done  chan error  // serve's result (session fronts only)
	memfd int         // guest memory (owned; -1 once closed)
	mem   []byte      // the front-end's mapping of it
	rings []*testRing // per queue, once set up
	feats uint64      // virtio features acked (SET_FEATURES), for the driver queues
	err   error       // serve's result, once received
}

// testRing is the driver side of one queue.
type testRing struct {
	index     int
	dq        *virtio.DriverQueue
	kick      *eventfd.EventFD
	call      *eventfd.EventFD
	errfd     *eventfd.EventFD
	desc      uint64 // guest-physical addresses
	avail     uint64
	used      uint64
	nextData  uint64
	usedRings []byte
}

// newFrontend starts a session for dev and connects a front-end to it.
func newFrontend(t testing.TB, dev *fakeDevice) *testFrontend {
	t.Helper()
	a, b := socketpair(t)
	stats := &Stats{}
	s := newSession(b, dev, discardLog(), stats)
	f := &testFrontend{t: t, conn: vu.NewConn(a), dev: dev, sess: s, stats: stats, done: make(chan error, 1)}
	go func() { f.done <- s.serve() }()
	f.initMemory()
	t.Cleanup(f.close)
	return f
}

// dialFrontend connects a front-end to a Server's socket.
func dialFrontend(t testing.TB, srv *Server) *testFrontend {
	t.Helper()
	c, err := net.Dial("unix", srv.Socket())
	if err != nil {
		t.Fatal(err)
	}
	f := &testFrontend{t: t, conn: vu.NewConn(c.(*net.UnixConn)), dev: srv.Device().(*fakeDevice)}
	f.initMemory()
	t.Cleanup(f.close)
	return f
}

func (f *testFrontend) initMemory() {
	fd, err := memmap.NewMemfd("vrdma-backend-test", memSize)
	if err != nil {
		f.t.Fatal(err)
	}
	m, err := unix.Mmap(fd, 0, memSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		f.t.Fatal(err)
	}
	f.memfd, f.mem = fd, m
}

// close disconnects and releases everything the front-end holds. For a
// session front-end it waits for serve to return.
func (f *testFrontend) close() {
	f.conn.Close()
	if f.done != nil {
		f.wait()
	}
	for _, r := range f.rings {
		if r != nil {
			r.kick.Close()
			r.call.Close()
			r.errfd.Close()
		}
	}
	f.rings = nil
	if f.mem != nil {
		unix.Munmap(f.mem)
		f.mem = nil
	}
	if f.memfd >= 0 {
		unix.Close(f.memfd)
		f.memfd = -1
	}
}

// wait returns serve's result, waiting for it at most waitLong.
func (f *testFrontend) wait() error {
	f.t.Helper()
	if f.done == nil {
		return f.err
	}
	select {
	case f.err = <-f.done:
		f.done = nil
	case <-time.After(waitLong):
		f.t.Fatal("session did not end")
	}
	return f.err
}

// write sends one raw message.
func (f *testFrontend) write(req vu.Request, flags uint32, payload []byte, fds []int) {
	f.t.Helper()
	if err := f.conn.WriteMessage(vu.Header{Request: uint32(req), Flags: vu.FlagVersion | flags}, payload, fds); err != nil {
		f.t.Fatalf("write %s: %v", req, err)
	}
}

// read reads the next message, within waitLong.
func (f *testFrontend) read() (*vu.Message, error) {
	f.conn.UnixConn().SetReadDeadline(time.Now().Add(waitLong))
	defer f.conn.UnixConn().SetReadDeadline(time.Time{})
	return f.conn.ReadMessage()
}

// send sends a request that gets no reply (no need_reply flag).
func (f *testFrontend) send(req vu.Request, payload []byte, fds ...int) {
	f.t.Helper()
	f.write(req, 0, payload, fds)
}

// call sends a request that always replies and returns the reply.
func (f *testFrontend) call(req vu.Request, payload []byte) *vu.Message {
	f.t.Helper()
	f.write(req, 0, payload, nil)
	m, err := f.read()
	if err != nil {
		f.t.Fatalf("%s: reply: %v", req, err)
	}
	if err := vu.CheckReply(req, m); err != nil {
		f.t.Fatalf("%s: %v", req, err)
	}
	return m
}

// getU64 sends a GET_* request and returns the u64 it answers.
func (f *testFrontend) getU64(req vu.Request) uint64 {
	f.t.Helper()
	v, err := vu.DecodeU64(f.call(req, nil).Payload)
	if err != nil {
		f.t.Fatalf("%s: %v", req, err)
	}
	return v
}

// ack sends req with need_reply and returns the REPLY_ACK status (0 is
// success). REPLY_ACK must have been negotiated.
func (f *testFrontend) ack(req vu.Request, payload []byte, fds ...int) uint64 {
	f.t.Helper()
	f.write(req, vu.FlagNeedReply, payload, fds)
	m, err := f.read()
	if err != nil {
		f.t.Fatalf("%s: reply: %v", req, err)
	}
	if req.Known() {
		err = vu.CheckReply(req, m)
	} else if m.Req() != req || !m.IsReply() || len(m.Fds) != 0 {
		err = fmt.Errorf("got %s (flags %#x), want a reply", m.Req(), m.Flags)
	}
	if err != nil {
		f.t.Fatalf("%s: %v", req, err)
	}
	v, err := vu.DecodeU64(m.Payload)
	if err != nil {
		f.t.Fatalf("%s: %v", req, err)
	}
	return v
}

// mustAck is ack expecting success.
func (f *testFrontend) mustAck(req vu.Request, payload []byte, fds ...int) {
	f.t.Helper()
	if st := f.ack(req, payload, fds...); st != 0 {
		f.t.Fatalf("%s: status %d, want 0", req, st)
	}
}

// nack is ack expecting failure.
func (f *testFrontend) nack(req vu.Request, payload []byte, fds ...int) {
	f.t.Helper()
	if st := f.ack(req, payload, fds...); st == 0 {
		f.t.Fatalf("%s: status 0, want a failure", req)
	}
}

// sync waits until the session has handled everything sent so far (messages
// are handled in order, and GET_FEATURES always replies).
func (f *testFrontend) sync() {
	f.t.Helper()
	f.getU64(vu.GetFeatures)
}

// expectClosed checks that the back-end closed the connection (EOF, with
// nothing before it) and, for a session front-end, that serve returned an
// error matching want (nil: any non-nil error).
func (f *testFrontend) expectClosed(want error) {
	f.t.Helper()
	m, err := f.read()
	if err == nil {
		m.CloseFds()
		f.t.Fatalf("got %s, want the connection closed", m.Req())
	}
	if !errors.Is(err, net.ErrClosed) && !isEOF(err) {
		f.t.Fatalf("read: %v, want EOF", err)
	}
	if f.done == nil && f.sess == nil {
		return
	}
	serr := f.wait()
	if serr == nil {
		f.t.Fatal("session ended without an error")
	}
	if want != nil && !errors.Is(serr, want) {
		f.t.Fatalf("session error %v, want %v", serr, want)
	}
}

// negotiate performs QEMU's realize sequence with the given protocol
// features, then SET_FEATURES with the device's features and bit 30.
func (f *testFrontend) negotiate(protocol uint64) {
	f.t.Helper()
	feat := f.getU64(vu.GetFeatures)
	if feat&vu.FeatureProtocolFeatures == 0 {
		f.t.Fatalf("GET_FEATURES %#x: bit 30 not offered", feat)
	}
	if pf := f.getU64(vu.GetProtocolFeatures); pf&protocol != protocol {
		f.t.Fatalf("protocol features %#x do not include %#x", pf, protocol)
	}
	f.send(vu.SetProtocolFeatures, vu.EncodeU64(protocol))
	f.send(vu.SetOwner, nil)
	f.send(vu.SetFeatures, vu.EncodeU64(feat))
	f.feats = feat
	f.sync()
}

// region is the memory region that covers all of the front-end's memory.
func (f *testFrontend) region() vu.MemoryRegion {
	return vu.MemoryRegion{GuestAddr: 0, Size: memSize, UserAddr: userBase}
}

// setMemTable sends SET_MEM_TABLE with the given regions, each backed by a
// dup of the memfd.
func (f *testFrontend) setMemTable(regions ...vu.MemoryRegion) {
	f.t.Helper()
	fds := make([]int, len(regions))
	for i := range fds {
		fds[i] = f.memfd
	}
	f.send(vu.SetMemTable, vu.MemTable{Regions: regions}.Encode(), fds...)
}

// ring returns queue i's driver side, creating it (and its eventfds and
// rings in guest memory) on first use.
func (f *testFrontend) ring(i int) *testRing {
	f.t.Helper()
	for len(f.rings) <= i {
		f.rings = append(f.rings, nil)
	}
	if r := f.rings[i]; r != nil {
		return r
	}
	r := &testRing{index: i}
	base := uint64(ringBase + i*ringSpan)
	r.desc, r.avail, r.used = base, base+0x4000, base+0x8000
	r.nextData = dataBase + uint64(i)*0x10000
	var err error
	for _, e := range []**eventfd.EventFD{&r.kick, &r.call, &r.errfd} {
		if *e, err = eventfd.New(); err != nil {
			f.t.Fatal(err)
		}
	}
	f.rings[i] = r
	return r
}

// newDriverQueue zeroes queue i's rings and makes a fresh driver side.
func (f *testFrontend) newDriverQueue(r *testRing, size uint16) {
	f.t.Helper()
	rings := virtio.Rings{
		Desc:  f.mem[r.desc : r.desc+virtio.DescTableSize(size)],
		Avail: f.mem[r.avail : r.avail+virtio.AvailRingSize(size)],
		Used:  f.mem[r.used : r.used+virtio.UsedRingSize(size)],
	}
	dq, err := virtio.NewDriverQueue(virtio.DriverQueueConfig{Size: size, Index: r.index, EventIdx: f.feats&virtio.FeatureEventIdx != 0}, rings)
	if err != nil {
		f.t.Fatal(err)
	}
	r.dq, r.usedRings = dq, rings.Used
}

// vringFile encodes the u64 of SET_VRING_KICK/CALL/ERR.
func vringFile(i int, noFd bool) []byte {
	return vu.EncodeU64(vu.EncodeVringFile(uint8(i), noFd))
}

// addr is the SET_VRING_ADDR payload for r, in front-end virtual addresses.
func (r *testRing) addr() []byte {
	return vu.VringAddr{Index: uint32(r.index), Desc: r.desc + userBase, Avail: r.avail + userBase, Used: r.used + userBase}.Encode()
}

// startRing sets queue i up in QEMU's order (CALL, ERR, NUM, BASE, ADDR,
// KICK, ENABLE) with REPLY_ACK on each message, so each must succeed.
func (f *testFrontend) startRing(i int, base uint16) *testRing {
	f.t.Helper()
	r := f.ring(i)
	f.newDriverQueue(r, queueSize)
	idx := uint32(i)
	f.mustAck(vu.SetVringCall, vringFile(i, false), r.call.Fd())
	f.mustAck(vu.SetVringErr, vringFile(i, false), r.errfd.Fd())
	f.mustAck(vu.SetVringNum, vu.VringState{Index: idx, Num: queueSize}.Encode())
	f.mustAck(vu.SetVringBase, vu.VringState{Index: idx, Num: uint32(base)}.Encode())
	f.mustAck(vu.SetVringAddr, r.addr())
	f.mustAck(vu.SetVringKick, vringFile(i, false), r.kick.Fd())
	f.mustAck(vu.SetVringEnable, vu.VringState{Index: idx, Num: 1}.Encode())
	return r
}

// ready negotiates every protocol feature the back-end offers, sends the
// memory table and starts the given queues.
func (f *testFrontend) ready(queues ...int) {
	f.t.Helper()
	f.negotiate(ProtocolFeatures)
	f.mustAck(vu.SetMemTable, vu.MemTable{Regions: []vu.MemoryRegion{f.region()}}.Encode(), f.memfd)
	for _, i := range queues {
		f.startRing(i, 0)
	}
}

// post makes one chain available on r: a readable buffer holding data and a
// writable one of the same size. It kicks and returns the writable buffer's
// guest address.
func (f *testFrontend) post(r *testRing, data []byte) uint64 {
	f.t.Helper()
	out := f.add(r, data)
	r.kick.Signal()
	return out
}

// add is post without the kick.
func (f *testFrontend) add(r *testRing, data []byte) uint64 {
	f.t.Helper()
	in, out := r.nextData, r.nextData+0x1000
	r.nextData += 0x2000
	if r.nextData >= dataBase+uint64(r.index+1)*0x10000 {
		r.nextData = dataBase + uint64(r.index)*0x10000
	}
	copy(f.mem[in:], data)
	clear(f.mem[out : out+uint64(len(data))])
	if _, err := r.dq.Add([]virtio.Buf{
		{Addr: abi.GPA(in), Len: uint32(len(data))},
		{Addr: abi.GPA(out), Len: uint32(len(data)), Writable: true},
	}); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// roundTrip posts data on r and waits for the device to echo it, with the
// interrupt on the call eventfd.
func (f *testFrontend) roundTrip(r *testRing, data string) {
	f.t.Helper()
	out := f.post(r, []byte(data))
	if _, err := r.call.WaitTimeout(waitLong); err != nil {
		f.t.Fatalf("queue %d: no interrupt: %v", r.index, err)
	}
	_, n, ok, err := r.dq.Used()
	if err != nil || !ok {
		f.t.Fatalf("queue %d: used: ok=%v err=%v", r.index, ok, err)
	}
	if got := string(f.mem[out : out+uint64(n)]); got != data {
		f.t.Fatalf("queue %d: echoed %q, want %q", r.index, got, data)
	}
}

// expectBroken waits for r's error eventfd.
func (f *testFrontend) expectBroken(r *testRing) {
	f.t.Helper()
	if _, err := r.errfd.WaitTimeout(waitLong); err != nil {
		f.t.Fatalf("queue %d: error eventfd not signalled: %v", r.index, err)
	}
}

// expectNotBroken checks that r's error eventfd has not been signalled.
func (f *testFrontend) expectNotBroken(r *testRing) {
	f.t.Helper()
	if ok, _ := r.errfd.TryWait(); ok {
		f.t.Fatalf("queue %d: error eventfd signalled", r.index)
	}
}

// openFds counts this process's open file descriptors.
func openFds(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// memfdMappings counts this process's mappings of the test memfd.
func memfdMappings(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "memfd:vrdma-backend-test")
}

// checkNoLeaks runs fn and then checks that the number of open fds and of
// guest memory mappings came back to what it was (waiting a little: closes
// in other goroutines finish after the session reports its end).
func checkNoLeaks(t *testing.T, fn func()) {
	t.Helper()
	// Warm up what the runtime opens once (netpoll).
	a, b := socketpair(t)
	a.Close()
	b.Close()
	fds, maps := openFds(t), memfdMappings(t)
	fn()
	deadline := time.Now().Add(waitLong)
	for {
		gotFds, gotMaps := openFds(t), memfdMappings(t)
		if gotFds == fds && gotMaps == maps {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the test: %d fds and %d guest memory mappings, before: %d and %d", gotFds, gotMaps, fds, maps)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor polls cond until it holds or waitLong passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
