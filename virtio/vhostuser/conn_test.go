package vhostuser

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// connFromFd wraps one end of a socketpair in a *net.UnixConn.
func connFromFd(t *testing.T, fd int) *net.UnixConn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socketpair")
	c, err := net.FileConn(f)
	f.Close() // FileConn dups
	if err != nil {
		t.Fatalf("FileConn: %v", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		t.Fatalf("got %T, want *net.UnixConn", c)
	}
	return uc
}

// pair returns two Conns on a unix stream socketpair.
func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	a, b := NewConn(connFromFd(t, fds[0])), NewConn(connFromFd(t, fds[1]))
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// rawPair returns a Conn and the raw, blocking fd of its peer, for tests
// that must send what a well-behaved writer never would.
func rawPair(t *testing.T) (*Conn, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socketpair: %v", err)
	}
	c := NewConn(connFromFd(t, fds[0]))
	t.Cleanup(func() { c.Close(); unix.Close(fds[1]) })
	return c, fds[1]
}

func countFds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents)
}

func eventfds(t *testing.T, n int) []int {
	t.Helper()
	fds := make([]int, n)
	for i := range fds {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatalf("eventfd: %v", err)
		}
		fds[i] = fd
	}
	t.Cleanup(func() { closeFds(fds) })
	return fds
}

func sameFile(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		t.Fatalf("fstat %d: %v", a, err)
	}
	if err := unix.Fstat(b, &sb); err != nil {
		t.Fatalf("fstat %d: %v", b, err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func sendRaw(t *testing.T, fd int, b []byte, fds []int) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, err := unix.SendmsgN(fd, b, oob, nil, 0)
	if err != nil || n != len(b) {
		t.Fatalf("sendmsg: got %d, %v; want %d, nil", n, err, len(b))
	}
}

func wantProtocol(t *testing.T, m *Message, err error) {
	t.Helper()
	if m != nil {
		m.CloseFds()
		t.Errorf("got message %+v, want nil", m.Header)
	}
	var me *MessageError
	if !errors.Is(err, ErrProtocol) || !errors.As(err, &me) {
		t.Fatalf("got error %v, want *MessageError wrapping ErrProtocol", err)
	}
}

func TestConnRoundTripFds(t *testing.T) {
	a, b := pair(t)
	sent := eventfds(t, 3)
	payload := memTable(3)
	if err := a.WriteMessage(Header{Request: uint32(SetMemTable), Flags: FlagNeedReply}, payload, sent); err != nil {
		t.Fatalf("WriteMessage: %v", err)
	}
	m, err := b.ReadMessage()
	if err != nil {
		t.Fatalf("ReadMessage: %v", err)
	}
	defer m.CloseFds()
	if got, want := m.Header, (Header{Request: uint32(SetMemTable), Flags: FlagVersion | FlagNeedReply, Size: uint32(len(payload))}); got != want {
		t.Errorf("header: got %+v, want %+v", got, want)
	}
	if !bytes.Equal(m.Payload, payload) {
		t.Errorf("payload: got % x, want % x", m.Payload, payload)
	}
	if !m.NeedReply() || m.Req() != SetMemTable {
		t.Errorf("got Req %v NeedReply %v, want SET_MEM_TABLE true", m.Req(), m.NeedReply())
	}
	if err := Check(m); err != nil {
		t.Errorf("Check: %v", err)
	}
	if got, want := len(m.Fds), len(sent); got != want {
		t.Fatalf("fds: got %d, want %d", got, want)
	}
	for i, fd := range m.Fds {
		if !sameFile(t, fd, sent[i]) {
			t.Errorf("fd %d: got a different file than sent fd %d", fd, sent[i])
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("fd %d: got F_GETFD %#x, %v; want FD_CLOEXEC set", fd, flags, err)
		}
	}

	// TakeFd transfers ownership; CloseFds closes only the rest.
	kept, err := m.TakeFd(1)
	if err != nil {
		t.Fatalf("TakeFd: %v", err)
	}
	if _, err := m.TakeFd(1); !errors.Is(err, ErrInvalid) {
		t.Errorf("TakeFd twice: got %v, want ErrInvalid", err)
	}
	if _, err := m.TakeFd(3); !errors.Is(err, ErrInvalid) {
		t.Errorf("TakeFd out of range: got %v, want ErrInvalid", err)
	}
	others := []int{m.Fds[0], m.Fds[2]}
	m.CloseFds()
	m.CloseFds() // idempotent
	for _, fd := range others {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
			t.Errorf("fd %d after CloseFds: got %v, want EBADF", fd, err)
		}
	}
	if _, err := unix.FcntlInt(uintptr(kept), unix.F_GETFD, 0); err != nil {
		t.Errorf("taken fd %d after CloseFds: got %v, want open", kept, err)
	}
	unix.Close(kept)
}

func TestConnSequence(t *testing.T) {
	a, b := pair(t)
	msgs := []struct {
		r   Request
		p   []byte
		fds int
	}{
		{GetFeatures, nil, 0},
		{SetVringCall, EncodeU64(EncodeVringFile(0, false)), 1},
		{SetVringNum, VringState{0, 64}.Encode(), 0},
		{SetVringKick, EncodeU64(EncodeVringFile(0, false)), 1},
		{GetConfig, ConfigMsg{Size: MaxConfigSize}.Encode(), 0},
		{CreateCryptoSession, make([]byte, MaxPayloadSize), 0},
	}
	go func() {
		for _, m := range msgs {
			var fds []int
			if m.fds > 0 {
				fd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
				fds = []int{fd}
			}
			a.WriteMessage(Header{Request: uint32(m.r)}, m.p, fds)
			closeFds(fds)
		}
	}()
	for _, want := range msgs {
		m, err := b.ReadMessage()
		if err != nil {
			t.Fatalf("%v: ReadMessage: %v", want.r, err)
		}
		if m.Req() != want.r || !bytes.Equal(m.Payload, want.p) || len(m.Fds) != want.fds {
			t.Errorf("got %v with %d bytes and %d fds, want %v with %d bytes and %d fds",
				m.Req(), len(m.Payload), len(m.Fds), want.r, len(want.p), want.fds)
		}
		if err := Check(m); err != nil {
			t.Errorf("%v: Check: %v", want.r, err)
		}
		m.CloseFds()
	}
}

func TestConnEOF(t *testing.T) {
	hdr := Header{Request: uint32(SetVringNum), Flags: FlagVersion, Size: 8}.Encode()
	tests := []struct {
		name   string
		send   []byte
		wantIO bool // clean io.EOF rather than ErrProtocol
	}{
		{"at message boundary", nil, true},
		{"inside header", hdr[:5], false},
		{"after header", hdr, false},
		{"inside payload", append(append([]byte{}, hdr...), 1, 2, 3), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, peer := rawPair(t)
			if len(tt.send) > 0 {
				sendRaw(t, peer, tt.send, nil)
			}
			unix.Shutdown(peer, unix.SHUT_WR)
			m, err := c.ReadMessage()
			if tt.wantIO {
				if m != nil || err != io.EOF {
					t.Fatalf("got %v, %v; want nil, io.EOF", m, err)
				}
				return
			}
			wantProtocol(t, m, err)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("got %v, want it to wrap io.ErrUnexpectedEOF", err)
			}
		})
	}
}

// TestConnBadStreamClosesFds sends messages that must be refused with
// ErrProtocol, and checks that every fd received was closed.
func TestConnBadStreamClosesFds(t *testing.T) {
	good := func(r Request, size uint32) []byte {
		b := Header{Request: uint32(r), Flags: FlagVersion, Size: size}.Encode()
		return append(b, make([]byte, size)...)
	}
	type step struct {
		b   []byte
		fds int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"huge size", []step{{Header{Request: uint32(SetMemTable), Flags: FlagVersion, Size: MaxPayloadSize + 1}.Encode(), 2}}},
		{"size 0xffffffff", []step{{Header{Request: 1, Flags: FlagVersion, Size: 0xffffffff}.Encode(), 1}}},
		{"version 0", []step{{Header{Request: uint32(SetVringKick), Flags: 0, Size: 8}.Encode(), 1}}},
		{"version 2", []step{{Header{Request: uint32(SetVringKick), Flags: 2, Size: 0}.Encode(), 1}}},
		{"version 3", []step{{Header{Request: uint32(SetVringKick), Flags: 3 | FlagReply, Size: 0}.Encode(), 0}}},
		{"more than MaxFds fds", []step{{good(SetMemTable, 8), MaxFds + 1}}},
		{"far more than MaxFds fds", []step{{good(SetMemTable, 8), 200}}},
		{"fds with the payload", []step{
			{Header{Request: uint32(SetVringCall), Flags: FlagVersion, Size: 8}.Encode(), 0},
			{EncodeU64(0), 1},
		}},
		{"fds with header and payload", []step{
			{Header{Request: uint32(SetMemTable), Flags: FlagVersion, Size: 40}.Encode(), 1},
			{memTable(1)[:20], 2},
		}},
		{"fds in two batches within the header", []step{
			{Header{Request: uint32(SetVringCall), Flags: FlagVersion, Size: 8}.Encode()[:4], 1},
			{append(Header{Request: uint32(SetVringCall), Flags: FlagVersion, Size: 8}.Encode()[4:], EncodeU64(0)...), 1},
		}},
		{"fds with the payload, too many", []step{
			{Header{Request: uint32(SetVringCall), Flags: FlagVersion, Size: 8}.Encode(), 0},
			{EncodeU64(0), MaxFds + 5},
		}},
		{"eof after fds", []step{
			{Header{Request: uint32(SetVringCall), Flags: FlagVersion, Size: 8}.Encode(), 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, peer := rawPair(t)
			maxFds := 0
			for _, s := range tt.steps {
				maxFds = max(maxFds, s.fds)
			}
			src := eventfds(t, 1)[0]
			dups := make([]int, maxFds)
			for i := range dups {
				d, err := unix.FcntlInt(uintptr(src), unix.F_DUPFD_CLOEXEC, 0)
				if err != nil {
					t.Fatalf("dup: %v", err)
				}
				dups[i] = d
			}
			t.Cleanup(func() { closeFds(dups) })
			before := countFds(t)
			for _, s := range tt.steps {
				sendRaw(t, peer, s.b, dups[:s.fds])
			}
			unix.Shutdown(peer, unix.SHUT_WR)
			m, err := c.ReadMessage()
			wantProtocol(t, m, err)
			if after := countFds(t); after != before {
				t.Errorf("open fds: got %d after, want %d (as before)", after, before)
			}
		})
	}
}

// TestConnFdsWithLaterHeaderBytes: fds attached to the second part of a
// header still belong to the header.
func TestConnFdsWithLaterHeaderBytes(t *testing.T) {
	c, peer := rawPair(t)
	fd := eventfds(t, 1)[0]
	h := Header{Request: uint32(SetVringCall), Flags: FlagVersion, Size: 8}.Encode()
	sendRaw(t, peer, h[:4], nil)
	sendRaw(t, peer, append(h[4:], EncodeU64(0)...), []int{fd})
	m, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("ReadMessage: %v", err)
	}
	defer m.CloseFds()
	if err := Check(m); err != nil || len(m.Fds) != 1 || !sameFile(t, m.Fds[0], fd) {
		t.Fatalf("got %d fds, Check %v; want the one fd sent", len(m.Fds), err)
	}
}

func TestConnReadAfterTimeoutKeepsStream(t *testing.T) {
	a, b := pair(t)
	b.UnixConn().SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := b.ReadMessage(); err == nil || errors.Is(err, ErrProtocol) {
		t.Fatalf("got %v, want a timeout that is not ErrProtocol", err)
	}
	b.UnixConn().SetReadDeadline(time.Time{})
	if err := a.WriteMessage(Header{Request: uint32(GetFeatures)}, nil, nil); err != nil {
		t.Fatal(err)
	}
	m, err := b.ReadMessage()
	if err != nil || m.Req() != GetFeatures {
		t.Fatalf("got %v, %v; want GET_FEATURES", m, err)
	}
}

func TestWriteMessageErrors(t *testing.T) {
	a, _ := pair(t)
	tests := []struct {
		name    string
		h       Header
		payload []byte
		fds     []int
	}{
		{"payload too large", Header{Request: 1}, make([]byte, MaxPayloadSize+1), nil},
		{"too many fds", Header{Request: 1}, nil, fakeFds(MaxFds + 1)},
		{"bad version", Header{Request: 1, Flags: 2}, nil, nil},
		{"negative fd", Header{Request: 1}, nil, []int{-1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := a.WriteMessage(tt.h, tt.payload, tt.fds); !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
}

// backend answers requests on c like a minimal back-end would.
func backend(c *Conn, done chan<- error) {
	for {
		m, err := c.ReadMessage()
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			done <- err
			return
		}
		if err := Check(m); err != nil {
			m.CloseFds()
			done <- err
			return
		}
		switch m.Req() {
		case GetFeatures:
			err = c.ReplyU64(GetFeatures, FeatureProtocolFeatures|1<<32)
		case GetVringBase:
			s, _ := DecodeVringState(m.Payload)
			err = c.Reply(GetVringBase, VringState{Index: s.Index, Num: 42}.Encode(), nil)
		case GetInflightFd:
			fd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
			err = c.Reply(GetInflightFd, InflightInfo{MmapSize: 4096}.Encode(), []int{fd})
			unix.Close(fd)
		case GetStatus:
			// A broken back-end: replies to the wrong request.
			err = c.ReplyU64(GetFeatures, 0)
		default:
			if m.NeedReply() {
				err = c.ReplyU64(m.Req(), 0)
			}
		}
		m.CloseFds()
		if err != nil {
			done <- err
			return
		}
	}
}

func TestCall(t *testing.T) {
	fe, be := pair(t)
	done := make(chan error, 1)
	go backend(be, done)

	m, err := fe.Call(GetFeatures, nil, nil, true)
	if err != nil {
		t.Fatalf("GET_FEATURES: %v", err)
	}
	if v, err := DecodeU64(m.Payload); err != nil || v != FeatureProtocolFeatures|1<<32 {
		t.Errorf("GET_FEATURES: got %#x, %v; want %#x", v, err, FeatureProtocolFeatures|1<<32)
	}
	m, err = fe.Call(GetVringBase, VringState{Index: 3}.Encode(), nil, true)
	if err != nil {
		t.Fatalf("GET_VRING_BASE: %v", err)
	}
	if s, _ := DecodeVringState(m.Payload); s != (VringState{3, 42}) {
		t.Errorf("GET_VRING_BASE: got %+v, want {3 42}", s)
	}
	// REPLY_ACK: need_reply is set for a request that does not always reply.
	m, err = fe.Call(SetVringNum, VringState{0, 64}.Encode(), nil, true)
	if err != nil {
		t.Fatalf("SET_VRING_NUM: %v", err)
	}
	if v, _ := DecodeU64(m.Payload); v != 0 {
		t.Errorf("SET_VRING_NUM ack: got %d, want 0", v)
	}
	if m, err := fe.Call(SetOwner, nil, nil, false); m != nil || err != nil {
		t.Errorf("SET_OWNER without reply: got %v, %v; want nil, nil", m, err)
	}
	m, err = fe.Call(GetInflightFd, InflightInfo{NumQueues: 1, QueueSize: 64}.Encode(), nil, true)
	if err != nil {
		t.Fatalf("GET_INFLIGHT_FD: %v", err)
	}
	if len(m.Fds) != 1 {
		t.Errorf("GET_INFLIGHT_FD: got %d fds, want 1", len(m.Fds))
	}
	m.CloseFds()
	if _, err := fe.Call(GetStatus, nil, nil, true); !errors.Is(err, ErrInvalid) {
		t.Errorf("GET_STATUS answered as GET_FEATURES: got %v, want ErrInvalid", err)
	}
	fe.Close()
	if err := <-done; err != nil {
		t.Errorf("backend: %v", err)
	}
}

func TestConnConcurrentWriters(t *testing.T) {
	a, b := pair(t)
	const writers, each = 4, 50
	for w := range writers {
		go func() {
			for i := range each {
				a.WriteMessage(Header{Request: uint32(SetVringNum)}, VringState{uint32(w), uint32(i)}.Encode(), nil)
			}
		}()
	}
	next := make([]uint32, writers)
	for range writers * each {
		m, err := b.ReadMessage()
		if err != nil {
			t.Fatalf("ReadMessage: %v", err)
		}
		s, err := DecodeVringState(m.Payload)
		if err != nil || s.Index >= writers || s.Num != next[s.Index] {
			t.Fatalf("got %+v, %v; want writer < %d in order", s, err, writers)
		}
		next[s.Index]++
	}
}
