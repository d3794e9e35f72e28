package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// AccessError is a unix socket the caller may not connect to, with what
// to do about it.
type AccessError struct {
	// Path is the socket.
	Path string
	// Hint says what grants access ("join group vrdma: usermod -aG vrdma
	// $USER, then log in again").
	Hint string
	// Err is the connect error (EACCES or EPERM inside).
	Err error
}

func (e *AccessError) Error() string {
	return fmt.Sprintf("%s: permission denied (%s)", e.Path, e.Hint)
}

// Unwrap returns the connect error.
func (e *AccessError) Unwrap() error { return e.Err }

// Identity is who connects: the uid and the groups of this session
// (getgroups and the gid), and the groups the user database gives the
// user, which a session started before usermod -aG lacks.
type Identity struct {
	UID        int
	Groups     []int
	Configured []int
}

// CurrentIdentity is this process's identity.
func CurrentIdentity() Identity {
	id := Identity{UID: os.Geteuid()}
	if gs, err := unix.Getgroups(); err == nil {
		id.Groups = gs
	}
	id.Groups = append(id.Groups, os.Getegid())
	if u, err := user.LookupId(strconv.Itoa(id.UID)); err == nil {
		if gids, err := u.GroupIds(); err == nil {
			for _, g := range gids {
				if n, err := strconv.Atoi(g); err == nil {
					id.Configured = append(id.Configured, n)
				}
			}
		}
	}
	return id
}

// SocketAccess turns err, the failure to connect to the unix socket at
// path, into an *AccessError that says which group to join when it is a
// permission error; any other error is returned as it is.
func SocketAccess(path string, err error) error {
	if !errors.Is(err, syscall.EACCES) && !errors.Is(err, syscall.EPERM) {
		return err
	}
	hint := AccessHint(path, CurrentIdentity(), os.Stat, groupName)
	return &AccessError{Path: path, Hint: hint, Err: err}
}

// groupName is the name of group gid, or the number.
func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return strconv.Itoa(gid)
}

// AccessHint says what lets id connect to the socket at path: it finds
// the first entry on the way (a directory without search permission, else
// the socket without write permission) that id may not use and names the
// group that may, or says only its owner may. stat and group are
// os.Stat and the group database (tests pass their own).
func AccessHint(path string, id Identity, stat func(string) (fs.FileInfo, error), group func(gid int) string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		abs = path
	}
	// The directories from the root down, then the socket.
	var chain []string
	for p := abs; ; p = filepath.Dir(p) {
		chain = append(chain, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	slices.Reverse(chain)
	for i, p := range chain {
		fi, err := stat(p)
		if err != nil {
			continue // not ours to see; the next entry may tell
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		var need fs.FileMode = 0o1 // search a directory
		what := "directory " + p
		if i == len(chain)-1 {
			need, what = 0o2, p // write the socket (connect(2))
		}
		if permits(fi.Mode().Perm(), int(st.Uid), int(st.Gid), need, id) {
			continue
		}
		return hintFor(what, fi.Mode().Perm(), int(st.Uid), int(st.Gid), need, id, group)
	}
	return "ask whoever runs vrdmad for access to the socket (its mode allows you, a security module or a mount may not)"
}

// permits reports whether the mode grants id the need bit (0o1 search,
// 0o2 write) as the kernel decides it: by the owner's bits for the owner,
// else the group's for a member, else the others'. Root passes (it has
// CAP_DAC_OVERRIDE unless something took it away).
func permits(mode fs.FileMode, uid, gid int, need fs.FileMode, id Identity) bool {
	switch {
	case id.UID == 0:
		return true
	case id.UID == uid:
		return mode&(need<<6) != 0
	case slices.Contains(id.Groups, gid):
		return mode&(need<<3) != 0
	}
	return mode&need != 0
}

// hintFor says what would grant access to an entry that denies id.
func hintFor(what string, mode fs.FileMode, uid, gid int, need fs.FileMode, id Identity, group func(int) string) string {
	g := group(gid)
	switch {
	case id.UID != uid && mode&(need<<3) != 0 && slices.Contains(id.Configured, gid):
		return fmt.Sprintf("you are in group %s, but this session started before you were added: log in again, or run newgrp %s", g, g)
	case id.UID != uid && mode&(need<<3) != 0:
		return fmt.Sprintf("join group %s: usermod -aG %s $USER, then log in again", g, g)
	}
	owner := strconv.Itoa(uid)
	if u, err := user.LookupId(owner); err == nil {
		owner = u.Username
	}
	if id.UID == uid {
		return fmt.Sprintf("%s is mode %04o and denies even its owner, you: have the administrator fix its mode", what, mode)
	}
	return fmt.Sprintf("%s is mode %04o, owner %s, group %s: only %s may use it; run as %s, or have the administrator give the group access", what, mode, owner, g, owner, owner)
}
