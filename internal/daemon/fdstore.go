package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"

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
	h.Aliases = aliases(fds.fds)
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
// description (kcmp KCMP_FILE), where the kernel can tell.
func aliases(fds []int) []FDAlias {
	var out []FDAlias
	pid := os.Getpid()
	for i := 1; i < len(fds); i++ {
		for j := 0; j < i; j++ {
			r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid), uintptr(pid), kcmpFile, uintptr(fds[j]), uintptr(fds[i]), 0)
			if errno != 0 {
				return out // no kcmp: store everything
			}
			if r == 0 {
				out = append(out, FDAlias{Index: i, SameAs: j})
				break
			}
		}
	}
	return out
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

// receiveFromStore reads a handover systemd passed from its store: nil,
// nil when LISTEN_FDNAMES has no StoreStateName (a plain start). Every
// other descriptor systemd passed is closed: a socket unit's socket is in
// the list too, as a descriptor the old process served.
func receiveFromStore() (*Incoming, error) {
	if os.Getenv("LISTEN_PID") != strconv.Itoa(os.Getpid()) {
		return nil, nil
	}
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil || n <= 0 || n > MaxHandoverFDs {
		return nil, nil
	}
	names := strings.Split(os.Getenv("LISTEN_FDNAMES"), ":")
	stateFD := -1
	for i, name := range names {
		if i < n && name == StoreStateName {
			stateFD = 3 + i
		}
	}
	if stateFD < 0 {
		return nil, nil
	}
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(k)
	}
	in := &Incoming{store: true}
	byIndex := map[int]int{}
	for i := 0; i < n; i++ {
		fd := 3 + i
		unix.CloseOnExec(fd)
		name := ""
		if i < len(names) {
			name = names[i]
		}
		idx, err := strconv.Atoi(strings.TrimPrefix(name, StoreFDPrefix))
		switch {
		case fd == stateFD:
		case strings.HasPrefix(name, StoreFDPrefix) && err == nil && idx >= 0 && idx < MaxHandoverFDs && byIndex[idx] == 0:
			byIndex[idx] = fd
		default:
			unix.Close(fd)
		}
	}
	doc, err := readSealed(stateFD)
	if err != nil {
		return in, fmt.Errorf("handover state from the store: %w", err)
	}
	in.Bytes = len(doc)
	h, err := DecodeHandover(doc)
	if err != nil {
		return in, err
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
	for i := range in.fds {
		if j, ok := alias[i]; ok {
			src, ok := byIndex[j]
			if !ok {
				return in, fmt.Errorf("handover from the store: descriptor %d (the same as %d) is missing", i, j)
			}
			if in.fds[i], err = unix.FcntlInt(uintptr(src), unix.F_DUPFD_CLOEXEC, 0); err != nil {
				return in, fmt.Errorf("handover from the store: descriptor %d: %w", i, err)
			}
			continue
		}
		fd, ok := byIndex[i]
		if !ok {
			return in, fmt.Errorf("handover from the store: descriptor %d of %d is missing", i, h.NumFDs)
		}
		in.fds[i] = fd
		delete(byIndex, i)
	}
	for _, fd := range byIndex {
		unix.Close(fd)
	}
	return in, nil
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
