package backend

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/internal/eventfd"
	"github.com/vrdma/vrdma/memmap"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
	vu "github.com/vrdma/vrdma/virtio/vhostuser"
)

// Adopt builds a Server in this process from the state of a Server frozen
// in another (Freeze) and the descriptors its indexes name. cfg is as for
// Listen or FromListener: the listener's bound path must equal cfg.Socket
// (an empty Socket becomes it); Mode and Owner are not applied (the socket
// file exists already).
//
// Adopt takes ownership of every fd of fds that st names and closes them
// on error; fds it does not name stay the caller's. It validates st as
// hostile input: descriptor indexes in range, each named once, of the
// right kind (the listener a listening unix stream socket, the connection
// and backend channel connected ones, kick/call/err eventfds, regions
// mappable regular files); the ring count against Device.NumQueues, ring
// sizes as SET_VRING_NUM, a started ring's size, addresses and kick;
// features as SET_FEATURES and SET_PROTOCOL_FEATURES; the memory table as
// SET_MEM_TABLE (at most memmap.MaxRegions regions, no overlap, none past
// the end of its file).
//
// With a session it maps the memory table, configures the rings (started
// rings get their device queues, at the indices st carries, but no
// worker), and calls Device.Attach and then MemoryChanged, so that the
// caller can restore the device's own state before Serve; it starts
// nothing and sends nothing. Serve starts the session and the accept loop.
// Host.Resumed stays as it was in the frozen server: the ring indices are
// this back-end's own.
func Adopt(cfg Config, st *ServerState, fds []int, opts ...Option) (*Server, error) {
	a := &adoption{fds: fds, named: map[int]string{}, values: map[int]int{}, taken: map[int]bool{}}
	s, err := a.adopt(cfg, st, opts)
	if err != nil {
		for i := len(a.undo) - 1; i >= 0; i-- {
			a.undo[i]()
		}
		a.closeRest(st)
		return nil, fmt.Errorf("backend: adopt: %w", err)
	}
	return s, nil
}

// adoption is one Adopt's bookkeeping: which indexes st names, which fds
// have passed to an owner (that closes them on its own error), and what to
// release when a later step fails.
type adoption struct {
	fds    []int
	named  map[int]string // index -> what it is
	values map[int]int    // fd -> index naming it
	taken  map[int]bool   // index -> ownership passed on
	undo   []func()
}

// name records that idx names what; -1 is "none" where optional.
func (a *adoption) name(idx int, what string, optional bool) error {
	if idx == -1 && optional {
		return nil
	}
	if idx < 0 || idx >= len(a.fds) {
		return fmt.Errorf("%s: fd index %d out of range [0, %d)", what, idx, len(a.fds))
	}
	if prev, ok := a.named[idx]; ok {
		return fmt.Errorf("%s: fd index %d also names %s", what, idx, prev)
	}
	fd := a.fds[idx]
	if fd < 0 {
		return fmt.Errorf("%s: fd %d at index %d", what, fd, idx)
	}
	if prev, ok := a.values[fd]; ok {
		return fmt.Errorf("%s: fd %d (index %d) is also at index %d", what, fd, idx, prev)
	}
	a.named[idx], a.values[fd] = what, idx
	return nil
}

// closeRest closes, once each, every fd that st refers to (valid or not
// as a name) and that was not passed on.
func (a *adoption) closeRest(st *ServerState) {
	if st == nil {
		return
	}
	taken := map[int]bool{}
	for idx := range a.taken {
		taken[a.fds[idx]] = true
	}
	for _, idx := range st.indexes() {
		if idx < 0 || idx >= len(a.fds) || a.fds[idx] < 0 || taken[a.fds[idx]] {
			continue
		}
		unix.Close(a.fds[idx])
		taken[a.fds[idx]] = true
	}
}

// indexes lists every descriptor index st refers to.
func (st *ServerState) indexes() []int {
	out := []int{st.Listener}
	if ss := st.Session; ss != nil {
		out = append(out, ss.Conn, ss.Backend)
		for _, r := range ss.Regions {
			out = append(out, r.FD)
		}
		for _, r := range ss.Rings {
			out = append(out, r.Kick, r.Call, r.Err)
		}
	}
	return out
}

// take passes the fd at idx (named) on to the caller.
func (a *adoption) take(idx int) int {
	a.taken[idx] = true
	return a.fds[idx]
}

func (a *adoption) adopt(cfg Config, st *ServerState, opts []Option) (*Server, error) {
	if st == nil {
		return nil, errors.New("no state")
	}
	// Name every descriptor first: on any error all of them are closed.
	if err := a.name(st.Listener, "listener", false); err != nil {
		return nil, err
	}
	if ss := st.Session; ss != nil {
		if err := a.nameSession(ss, cfg.Device); err != nil {
			return nil, err
		}
	}
	if cfg.Device == nil {
		return nil, errors.New("a device is required")
	}
	if ss := st.Session; ss != nil {
		if err := checkSession(ss, cfg.Device); err != nil {
			return nil, err
		}
	}

	ln, err := a.listener(st.Listener)
	if err != nil {
		return nil, err
	}
	if addr := ln.Addr().String(); cfg.Socket == "" {
		cfg.Socket = addr
	} else if addr != cfg.Socket {
		return nil, fmt.Errorf("listener is bound to %q, not %q", addr, cfg.Socket)
	}
	s := newServer(cfg, opts)
	s.ln = ln
	s.unlink = st.UnlinkOnClose
	ln.SetUnlinkOnClose(st.UnlinkOnClose)
	s.restoreStats(st.Stats)
	if st.Session != nil {
		sess, peer, err := a.session(s, st.Session)
		if err != nil {
			return nil, err
		}
		// Everything is in place: hand the host to the device. From here
		// on nothing fails.
		sess.dev.Attach(sess)
		sess.dev.MemoryChanged()
		s.active, s.pending, s.peer = sess, sess, peer
	}
	return s, nil
}

// nameSession names the session's descriptors.
func (a *adoption) nameSession(ss *SessionState, dev Device) error {
	if err := a.name(ss.Conn, "connection", false); err != nil {
		return err
	}
	if err := a.name(ss.Backend, "backend channel", true); err != nil {
		return err
	}
	if len(ss.Regions) > memmap.MaxRegions {
		return fmt.Errorf("%d regions, at most %d", len(ss.Regions), memmap.MaxRegions)
	}
	for i, r := range ss.Regions {
		if err := a.name(r.FD, fmt.Sprintf("region %d", i), false); err != nil {
			return err
		}
	}
	if dev != nil && len(ss.Rings) != dev.NumQueues() {
		return fmt.Errorf("%d rings, the device has %d queues", len(ss.Rings), dev.NumQueues())
	}
	for i, r := range ss.Rings {
		for _, f := range []struct {
			idx  int
			what string
		}{{r.Kick, "kick"}, {r.Call, "call"}, {r.Err, "err"}} {
			if err := a.name(f.idx, fmt.Sprintf("ring %d %s", i, f.what), true); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSession validates the session's values as the messages that set
// them are validated (session.go).
func checkSession(ss *SessionState, dev Device) error {
	offered := dev.Features() | vu.FeatureProtocolFeatures
	if ss.Features&^offered != 0 {
		return fmt.Errorf("features %#x not offered (offered %#x)", ss.Features&^offered, offered)
	}
	if ss.Protocol&^ProtocolFeatures != 0 {
		return fmt.Errorf("protocol features %#x not offered", ss.Protocol&^ProtocolFeatures)
	}
	if !ss.ProtocolSet && ss.Protocol != 0 {
		return errors.New("protocol features without SET_PROTOCOL_FEATURES")
	}
	if ss.Backend != -1 && ss.Protocol&vu.ProtocolBackendReq == 0 {
		return errors.New("a backend channel without BACKEND_REQ")
	}
	max := dev.MaxQueueSize()
	for i, r := range ss.Rings {
		if r.Num != 0 && (int(r.Num) > max || int(r.Num) > virtio.MaxQueueSize || r.Num&(r.Num-1) != 0) {
			return fmt.Errorf("ring %d: size %d is not a power of two in [1, %d]", i, r.Num, max)
		}
		if r.Started && (r.Num == 0 || !r.AddrSet || r.Kick == -1) {
			return fmt.Errorf("ring %d: started without size, addresses or kick", i)
		}
		if len(r.Broken) > maxBrokenLen {
			return fmt.Errorf("ring %d: broken reason of %d bytes", i, len(r.Broken))
		}
		if r.Call != -1 {
			if in, ok := dev.(Interrupter); ok && !in.Interrupts(i) {
				return fmt.Errorf("ring %d: a call eventfd for a queue that never interrupts", i)
			}
		}
	}
	return nil
}

// checkSocket checks that fd is a unix stream socket, listening or not.
func checkSocket(fd int, listening bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("fstat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("fd %d is not a socket (mode %#o)", fd, st.Mode)
	}
	accept, what := 0, "connected"
	if listening {
		accept, what = 1, "listening"
	}
	for _, o := range []struct {
		opt, want int
		what      string
	}{
		{unix.SO_DOMAIN, unix.AF_UNIX, "unix"},
		{unix.SO_TYPE, unix.SOCK_STREAM, "stream"},
		{unix.SO_ACCEPTCONN, accept, what},
	} {
		v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, o.opt)
		if err != nil {
			return fmt.Errorf("getsockopt: %w", err)
		}
		if v != o.want {
			return fmt.Errorf("fd %d is not a %s socket", fd, o.what)
		}
	}
	return nil
}

// listener takes the listening socket at idx.
func (a *adoption) listener(idx int) (*net.UnixListener, error) {
	fd := a.take(idx)
	if err := checkSocket(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("listener: %w", err)
	}
	f := os.NewFile(uintptr(fd), "vhost-user-listener")
	l, err := net.FileListener(f) // dups
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("listener: %w", err)
	}
	ln, ok := l.(*net.UnixListener)
	if !ok {
		l.Close()
		return nil, errors.New("listener is not a unix socket")
	}
	ln.SetUnlinkOnClose(false)
	a.undo = append(a.undo, func() { ln.Close() })
	return ln, nil
}

// conn takes the connected socket at idx.
func (a *adoption) conn(idx int, what string) (*net.UnixConn, error) {
	fd := a.take(idx)
	if err := checkSocket(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	f := os.NewFile(uintptr(fd), what)
	c, err := net.FileConn(f) // dups
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("%s is not a unix socket", what)
	}
	a.undo = append(a.undo, func() { uc.Close() })
	return uc, nil
}

// eventfd takes the eventfd at idx (-1: none).
func (a *adoption) eventfd(idx int, what string) (*eventfd.EventFD, error) {
	if idx == -1 {
		return nil, nil
	}
	e, err := eventfd.FromFd(a.take(idx)) // closes it on error
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	a.undo = append(a.undo, func() { e.Close() })
	return e, nil
}

// session builds the adopted session of s: connection, backend channel,
// memory table and rings, paused.
func (a *adoption) session(s *Server, ss *SessionState) (*session, Peer, error) {
	uc, err := a.conn(ss.Conn, "connection")
	if err != nil {
		return nil, Peer{}, err
	}
	var bc *net.UnixConn
	if ss.Backend != -1 {
		if bc, err = a.conn(ss.Backend, "backend channel"); err != nil {
			return nil, Peer{}, err
		}
	}
	regions := make([]*memmap.Region, 0, len(ss.Regions))
	defer func() {
		for _, r := range regions {
			r.Release() // the table holds its own references
		}
	}()
	for i, rs := range ss.Regions {
		r, err := memmap.MapRegion(a.take(rs.FD), memmap.RegionSpec{
			GuestAddr: abi.GPA(rs.GuestAddr), Size: rs.Size, UserAddr: memmap.UVA(rs.UserAddr), MmapOffset: rs.MmapOffset,
		})
		if err != nil {
			return nil, Peer{}, fmt.Errorf("region %d: %w", i, err)
		}
		regions = append(regions, r)
	}
	table, err := memmap.NewTable(regions)
	if err != nil {
		return nil, Peer{}, err
	}
	a.undo = append(a.undo, func() { table.Release() })
	files := make([][3]*eventfd.EventFD, len(ss.Rings))
	for i, rs := range ss.Rings {
		for j, idx := range []int{rs.Kick, rs.Call, rs.Err} {
			if files[i][j], err = a.eventfd(idx, fmt.Sprintf("ring %d", i)); err != nil {
				return nil, Peer{}, err
			}
		}
	}

	// Nothing fails from here on: the session owns what was taken.
	cred, credErr := PeerCredentials(uc)
	log := s.log.WithField("session", s.stats.sessions.Load())
	if credErr == nil {
		log = log.WithFields(logrus.Fields{"pid": cred.Pid, "uid": cred.Uid, "gid": cred.Gid})
	}
	sess := newSession(uc, s.cfg.Device, log, &s.stats)
	sess.features, sess.protocol, sess.protocolSet = ss.Features, ss.Protocol, ss.ProtocolSet
	sess.owner, sess.status = ss.Owner, ss.Status
	sess.resumed.Store(ss.Resumed)
	if bc != nil {
		sess.backendConn = vu.NewConn(bc)
	}
	// Until Serve the device's config changes are recorded (handover.go).
	sess.backendFrozen, sess.configPending = true, ss.ConfigChangePending
	sess.mem.Swap(table)
	for i, r := range sess.rings {
		r.adopt(ss.Rings[i], files[i])
	}
	return sess, peerOf(cred, ss.Since), nil
}

// restoreStats sets the counters from a snapshot.
func (s *Server) restoreStats(st StatsSnapshot) {
	s.stats.sessions.Store(st.Sessions)
	s.stats.refused.Store(st.Refused)
	s.stats.messages.Store(st.Messages)
	s.stats.protocolErrors.Store(st.ProtocolErrors)
	s.stats.ringErrors.Store(st.RingErrors)
	s.stats.interrupts.Store(st.Interrupts)
	s.stats.memTables.Store(st.MemTables)
}

// adopt configures the ring from rs and its eventfds (kick, call, err): a
// started ring gets its device queue at rs's indices and is left paused,
// without a worker, until the session runs (runAdopted). Precondition: the
// session's memory table is installed; nothing else runs yet.
func (r *vring) adopt(rs RingState, files [3]*eventfd.EventFD) {
	r.num, r.desc, r.avail, r.used, r.addrSet = rs.Num, memmap.UVA(rs.Desc), memmap.UVA(rs.Avail), memmap.UVA(rs.Used), rs.AddrSet
	r.base, r.ours = rs.Base, rs.BaseOurs
	r.kick, r.call, r.errfd = files[0], files[1], files[2]
	r.enabled.Store(rs.Enabled)
	if rs.Broken != "" {
		err := errors.New(rs.Broken)
		r.brokenAt.Store(&err)
	}
	if !rs.Started {
		return
	}
	r.started, r.paused = true, true
	r.stopping.Store(true)
	cfg := virtio.DeviceQueueConfig{
		Index:       r.q.index,
		Size:        r.num,
		EventIdx:    r.s.features&virtio.FeatureEventIdx != 0,
		Indirect:    r.s.features&virtio.FeatureIndirectDesc != 0,
		LastAvail:   rs.LastAvail,
		UsedIdx:     rs.UsedIdx,
		KeepUsedIdx: rs.Broken == "", // a broken ring's queue may never have been made
	}
	t := r.s.mem.Acquire()
	rings, err := r.translate(t)
	var vq *virtio.DeviceQueue
	if err == nil {
		if gerr := memmap.Guard(func() { vq, err = virtio.NewDeviceQueue(cfg, rings) }); gerr != nil {
			vq, err = nil, gerr
		}
	}
	r.gen = r.s.mem.Generation()
	t.Release()
	r.q.vq = vq
	r.wakeFd.Store(r.kick)
	if err != nil && rs.Broken == "" {
		// As its next run would have in the old process (the table no
		// longer covers the ring): it breaks when the session runs.
		r.adoptErr = fmt.Errorf("start ring: %w", err)
	}
}

// runAdopted is the goroutine of an adopted session (Serve): it breaks the
// rings Adopt could not set up, resumes the rest (each looks at its ring
// once) and sends a config change recorded while frozen, then serves.
func (s *session) runAdopted() error {
	for _, r := range s.rings {
		if r.adoptErr != nil {
			r.breakRing(r.adoptErr)
			r.adoptErr = nil
		}
	}
	s.thaw()
	return s.run()
}
