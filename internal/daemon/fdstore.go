package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A handover through systemd's file-descriptor store (vrdmad --fdstore):
// `systemctl restart vrdmad` keeps every guest's device. On SIGTERM the
// old process freezes and describes its devices as for an upgrade, gives
// the document (a sealed memfd named StoreStateName) and each descriptor
// of the list (named StoreFDPrefix+index) to the store with FDSTORE=1,
// and exits without closing anything; systemd passes them to the next
// start with LISTEN_FDNAMES, whose process takes the devices up as an
// upgrade's new process does, and then removes them from the store
// (FDSTOREREMOVE=1). There is no one to refuse to: a take-over that
// fails leaves the front-ends to reconnect to a vrdmad that starts
// afresh (the unit's Restart=on-failure).
//
// The store keeps one copy of an open file description: a descriptor the
// list holds twice (QEMU sends one memfd for two memory regions) would be
// dropped the second time, so the document names such a descriptor as an
// alias of its first index (Handover.Aliases) and only the first is
// stored.

// Names in the store.
const (
	StoreStateName = "vrdmad-handover"
	StoreFDPrefix  = "vrdmad-fd-"
)

// FDAlias says that list index Index is the same open file as SameAs (an
// earlier index), and was not stored.
type FDAlias struct {
	Index  int `json:"index"`
	SameAs int `json:"same_as"`
}

// StoreHandover is a frozen daemon described for the store.
type StoreHandover struct {
	// Doc is the document; FDs the list, where an alias is -1 (not
	// stored).
	Doc []byte
	FDs []int

	d   *Daemon
	f   *frozen
	fds *fdList
}

// HandOverToStore freezes every device and describes it for the store.
// Afterwards the daemon holds its lock for good: the caller stores Doc
// and FDs and exits at once, or calls Abort.
func (d *Daemon) HandOverToStore() (*StoreHandover, error) {
	if !d.upgradeMu.TryLock() {
		return nil, ErrUpgrading
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.upgradeMu.Unlock()
		return nil, ErrClosed
	}
	f := &frozen{d: d}
	h, fds, err := d.freezeLocked(f)
	s := &StoreHandover{d: d, f: f, fds: fds}
	if err != nil {
		s.Abort()
		return nil, err
	}
	if h.Aliases, err = aliases(fds.fds); err != nil {
		s.Abort()
		return nil, err
	}
	if s.Doc, err = json.Marshal(h); err != nil {
		s.Abort()
		return nil, fmt.Errorf("handover state: %w", err)
	}
	s.FDs = append([]int(nil), fds.fds...)
	for _, a := range h.Aliases {
		s.FDs[a.Index] = -1
	}
	return s, nil
}

// Abort thaws the daemon: it serves on (and may then shut down cleanly).
func (s *StoreHandover) Abort() {
	s.f.thaw()
	s.fds.close()
	s.d.mu.Unlock()
	s.d.upgradeMu.Unlock()
}

// aliases finds the descriptors of fds that are an earlier one's open file
// description (kcmp KCMP_FILE), as systemd's store tells them (same_fd).
// Without kcmp (a seccomp filter, a kernel without
// CONFIG_CHECKPOINT_RESTORE) it is an error: systemd may then fall back
// to comparing inodes and flags, which calls every two eventfds the same,
// and nobody can say which descriptors the store would keep.
func aliases(fds []int) ([]FDAlias, error) {
	var out []FDAlias
	pid := uintptr(os.Getpid())
	for i := 1; i < len(fds); i++ {
		for j := 0; j < i; j++ {
			r, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, kcmpFile, uintptr(fds[j]), uintptr(fds[i]), 0)
			if errno != 0 {
				return nil, fmt.Errorf("kcmp (which descriptors the store would keep): %w", errno)
			}
			if r == 0 {
				out = append(out, FDAlias{Index: i, SameAs: j})
				break
			}
		}
	}
	return out, nil
}

// kcmpFile is KCMP_FILE of <linux/kcmp.h>.
const kcmpFile = 0

// checkAliases checks Handover.Aliases: each names an index of the list
// and an earlier one that is no alias itself.
func (h *Handover) checkAliases() error {
	alias := make(map[int]bool, len(h.Aliases))
	for _, a := range h.Aliases {
		if a.Index <= 0 || a.Index >= h.NumFDs || a.SameAs < 0 || a.SameAs >= a.Index || alias[a.Index] || alias[a.SameAs] {
			return fmt.Errorf("alias %d of %d: not a later index of the list naming an earlier stored one", a.Index, a.SameAs)
		}
		alias[a.Index] = true
	}
	return nil
}

// storeLayout is what LISTEN_FDNAMES says of the store's entries among
// the descriptors systemd passed (position p is descriptor 3+p).
type storeLayout struct {
	// state is the document's position; -1 for none.
	state int
	// byIndex maps a list index to its position.
	byIndex map[int]int
	// ours are the names of this package's entries, each once, in order.
	ours []string
	// extra are positions of ours that nothing takes: a name seen before
	// (the first is taken), a malformed index.
	extra []int
}

// parseStoreNames reads names, LISTEN_FDNAMES split at ':' (one per
// descriptor passed). A name is ours when it is StoreStateName or
// StoreFDPrefix with an index in canonical decimal below MaxHandoverFDs.
func parseStoreNames(names []string) storeLayout {
	l := storeLayout{state: -1, byIndex: map[int]int{}}
	seen := map[string]bool{}
	for p, name := range names {
		ours := name == StoreStateName || strings.HasPrefix(name, StoreFDPrefix)
		if !ours {
			continue
		}
		if seen[name] {
			l.extra = append(l.extra, p)
			continue
		}
		seen[name] = true
		l.ours = append(l.ours, name)
		if name == StoreStateName {
			l.state = p
			continue
		}
		s := strings.TrimPrefix(name, StoreFDPrefix)
		idx, err := strconv.Atoi(s)
		if err != nil || idx < 0 || idx >= MaxHandoverFDs || strconv.Itoa(idx) != s {
			l.extra = append(l.extra, p)
			continue
		}
		l.byIndex[idx] = p
	}
	return l
}

// listenNames returns LISTEN_FDNAMES as n names (missing ones empty).
func listenNames(n int) []string {
	names := strings.Split(os.Getenv("LISTEN_FDNAMES"), ":")
	if len(names) > n {
		names = names[:n]
	}
	for len(names) < n {
		names = append(names, "")
	}
	return names
}

// receiveFromStore reads a handover systemd passed from its store: nil,
// nil when LISTEN_FDNAMES has no StoreStateName (a plain start; entries
// of ours left in the store without a document are dropped first, see
// dropStale). Every other descriptor systemd passed is closed: a socket
// unit's socket is in the list too, as a descriptor the old process
// served. A store this process cannot take over from is emptied before
// the error returns, so that the next start (Restart=) is a plain one
// rather than the same refusal again.
func receiveFromStore() (*Incoming, error) {
	if os.Getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil || n <= 0 || n > MaxHandoverFDs+1+maxListenFDs {
		return nil, nil
	}
	names := listenNames(n)
	l := parseStoreNames(names)
	if l.state < 0 {
		if len(l.ours) > 0 {
			dropStale(names)
		}
		return nil, nil
	}
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(k)
	}
	// held are the passed descriptors this function still owns.
	held := make(map[int]bool, n)
	for p := range names {
		unix.CloseOnExec(3 + p)
		held[3+p] = true
	}
	release := func(p int) {
		unix.Close(3 + p)
		delete(held, 3+p)
	}
	for p, name := range names {
		if name != StoreStateName && !strings.HasPrefix(name, StoreFDPrefix) {
			release(p)
		}
	}
	for _, p := range l.extra {
		release(p)
	}
	in := &Incoming{store: true}
	fail := func(err error) (*Incoming, error) {
		for fd := range held {
			unix.Close(fd)
		}
		for _, fd := range in.fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		in.fds = nil
		removeFromStore(l.ours)
		return nil, fmt.Errorf("handover from the store (its entries are removed: the next start is a plain one): %w", err)
	}
	delete(held, 3+l.state) // readSealed closes it
	doc, err := readSealed(3 + l.state)
	if err != nil {
		return fail(fmt.Errorf("state: %w", err))
	}
	in.Bytes = len(doc)
	h, err := DecodeHandover(doc)
	if err != nil {
		return fail(err)
	}
	in.H = h
	alias := make(map[int]int, len(h.Aliases))
	for _, a := range h.Aliases {
		alias[a.Index] = a.SameAs
	}
	in.fds = make([]int, h.NumFDs)
	for i := range in.fds {
		in.fds[i] = -1
	}
	// checkAliases: an alias names an earlier index that is no alias, so
	// in.fds[j] is set by the time index i needs it.
	for i := range in.fds {
		if j, ok := alias[i]; ok {
			if in.fds[i], err = unix.FcntlInt(uintptr(in.fds[j]), unix.F_DUPFD_CLOEXEC, 0); err != nil {
				return fail(fmt.Errorf("descriptor %d (the same as %d): %w", i, j, err))
			}
			continue
		}
		p, ok := l.byIndex[i]
		if !ok {
			return fail(fmt.Errorf("descriptor %d of %d is missing", i, h.NumFDs))
		}
		in.fds[i] = 3 + p
		delete(held, 3+p)
		delete(l.byIndex, i)
	}
	// Entries of ours the document does not name (leftovers): closed
	// and removed now, or every later start would get them again. The
	// named ones are removed once taken over (StoreNames).
	for _, p := range l.byIndex {
		release(p)
	}
	needed := make(map[string]bool, len(in.fds)+1)
	for _, name := range in.StoreNames() {
		needed[name] = true
	}
	var stale []string
	for _, name := range l.ours {
		if !needed[name] {
			stale = append(stale, name)
		}
	}
	removeFromStore(stale)
	return in, nil
}

// dropStale removes entries of ours that came without a document (a
// handover that failed halfway) from the store and from this process's
// LISTEN_FDS: the descriptors of the others (socket units') move down to
// 3… in order, so that socket activation finds them as systemd passed
// them. LISTEN_PID is this process's.
func dropStale(names []string) {
	var keep []string
	var ours []string
	seen := map[string]bool{}
	for p, name := range names {
		if name == StoreStateName || strings.HasPrefix(name, StoreFDPrefix) {
			if !seen[name] {
				seen[name] = true
				ours = append(ours, name)
			}
			continue
		}
		// 3+len(keep) <= 3+p: a descriptor of ours (replaced, closing
		// it) or one moved down already; nothing is closed before the
		// end, so no number is reused meanwhile.
		if to := 3 + len(keep); to != 3+p {
			if err := unix.Dup3(3+p, to, 0); err != nil {
				// Leave the rest as passed: activation reports it.
				return
			}
		}
		keep = append(keep, name)
	}
	for fd := 3 + len(keep); fd < 3+len(names); fd++ {
		unix.Close(fd)
	}
	if len(keep) == 0 {
		for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
			os.Unsetenv(k)
		}
	} else {
		os.Setenv("LISTEN_FDS", strconv.Itoa(len(keep)))
		os.Setenv("LISTEN_FDNAMES", strings.Join(keep, ":"))
	}
	removeFromStore(ours)
}

// removeFromStore sends FDSTOREREMOVE=1 for each name.
func removeFromStore(names []string) {
	for _, n := range names {
		NotifyWithFDs("FDSTOREREMOVE=1\nFDNAME=" + n)
	}
}

// notifyTimeout bounds how long a message to the service manager waits
// for room in its socket's queue. systemd reads its notify socket at once;
// one that is not read (a hung manager, a test's socket nobody reads any
// more) must not hold the daemon: a STATUS= update blocked there would
// keep vrdmad from ever seeing its SIGTERM.
const notifyTimeout = 2 * time.Second

// notifyStalled: a message found the manager's queue full for
// notifyTimeout. Until one gets through again, messages do not wait: a
// burst of them (a stop with --fdstore sends one per descriptor) would
// otherwise wait notifyTimeout each, and keep the daemon from exiting.
var notifyStalled atomic.Bool

// NotifyWithFDs sends state, with fds, to the service manager's
// NOTIFY_SOCKET (sd_pid_notify_with_fds); an error when there is none,
// or when its queue stays full for notifyTimeout — or is full at all
// while an earlier message found it so (notifyStalled) — and the message
// is then not sent.
func NotifyWithFDs(state string, fds ...int) error {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return errors.New("no NOTIFY_SOCKET")
	}
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sock)
	// Connected, so that poll waits for room in the manager's queue.
	if err := unix.Connect(sock, &unix.SockaddrUnix{Name: addr}); err != nil {
		return fmt.Errorf("notify socket %s: %w", addr, err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	deadline := time.Now().Add(notifyTimeout)
	for {
		err := unix.Sendmsg(sock, []byte(state), oob, nil, unix.MSG_NOSIGNAL)
		if err != unix.EAGAIN && err != unix.EINTR {
			if err == nil {
				notifyStalled.Store(false)
			}
			return err
		}
		if err == unix.EAGAIN && notifyStalled.Load() {
			return fmt.Errorf("notify socket %s: its queue is still full (the manager does not read it): message dropped", addr)
		}
		left := time.Until(deadline)
		if left <= 0 {
			notifyStalled.Store(true)
			return fmt.Errorf("notify socket %s: its queue stayed full for %v", addr, notifyTimeout)
		}
		pfd := []unix.PollFd{{Fd: int32(sock), Events: unix.POLLOUT}}
		if _, err := unix.Poll(pfd, int(left/time.Millisecond)+1); err != nil && err != unix.EINTR {
			return err
		}
	}
}

// StoreNames are the names a handover from the store used, for
// FDSTOREREMOVE once it is taken over.
func (in *Incoming) StoreNames() []string {
	if !in.store || in.H == nil {
		return nil
	}
	out := []string{StoreStateName}
	alias := make(map[int]bool, len(in.H.Aliases))
	for _, a := range in.H.Aliases {
		alias[a.Index] = true
	}
	for i := 0; i < in.H.NumFDs; i++ {
		if !alias[i] {
			out = append(out, StoreFDPrefix+strconv.Itoa(i))
		}
	}
	return out
}

// SealedState is a handover document in a sealed memfd, as the store and
// a new process's fd 3 hold it.
func SealedState(doc []byte) (*os.File, error) { return sealedMemfd(StoreStateName, doc) }
