package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeInfo is a stat answer with the owner, group and mode a test wants.
type fakeInfo struct {
	name string
	mode fs.FileMode
	st   syscall.Stat_t
}

func (f fakeInfo) Name() string       { return f.name }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return &f.st }

func TestAccessHint(t *testing.T) {
	const sock = "/run/vrdma/control.sock"
	names := map[int]string{0: "root", 64055: "vrdma", 993: "kvm"}
	group := func(gid int) string { return names[gid] }
	entry := func(mode fs.FileMode, uid, gid uint32) fakeInfo {
		return fakeInfo{mode: mode, st: syscall.Stat_t{Uid: uid, Gid: gid}}
	}
	tests := []struct {
		name   string
		tree   map[string]fakeInfo
		id     Identity
		want   string
		absent string
	}{
		{
			name: "not in the socket's group",
			tree: map[string]fakeInfo{"/run/vrdma": entry(fs.ModeDir|0o755, 64055, 64055), sock: entry(fs.ModeSocket|0o660, 0, 64055)},
			id:   Identity{UID: 1000, Groups: []int{1000}},
			want: "join group vrdma: usermod -aG vrdma $USER, then log in again",
		},
		{
			name: "added to the group, session too old",
			tree: map[string]fakeInfo{"/run/vrdma": entry(fs.ModeDir|0o755, 64055, 64055), sock: entry(fs.ModeSocket|0o660, 0, 64055)},
			id:   Identity{UID: 1000, Groups: []int{1000}, Configured: []int{1000, 64055}},
			want: "log in again, or run newgrp vrdma",
		},
		{
			name: "the directory denies",
			tree: map[string]fakeInfo{"/run/vrdma": entry(fs.ModeDir|0o750, 0, 993), sock: entry(fs.ModeSocket|0o666, 0, 0)},
			id:   Identity{UID: 1000, Groups: []int{1000}},
			want: "join group kvm",
		},
		{
			name:   "group has no access",
			tree:   map[string]fakeInfo{"/run/vrdma": entry(fs.ModeDir|0o755, 0, 0), sock: entry(fs.ModeSocket|0o600, 0, 0)},
			id:     Identity{UID: 1000, Groups: []int{1000}},
			want:   "is mode 0600, owner root, group root: only root may use it",
			absent: "join group",
		},
		{
			name: "nothing in the modes denies",
			tree: map[string]fakeInfo{"/run/vrdma": entry(fs.ModeDir|0o755, 0, 0), sock: entry(fs.ModeSocket|0o666, 0, 0)},
			id:   Identity{UID: 1000, Groups: []int{1000}},
			want: "security module",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stat := func(p string) (fs.FileInfo, error) {
				if fi, ok := tt.tree[p]; ok {
					return fi, nil
				}
				return entry(fs.ModeDir|0o755, 0, 0), nil // "/" and "/run"
			}
			got := AccessHint(sock, tt.id, stat, group)
			if !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want it to hold %q", got, tt.want)
			}
			if tt.absent != "" && strings.Contains(got, tt.absent) {
				t.Errorf("got %q, want no %q", got, tt.absent)
			}
		})
	}
}

// TestSocketAccessRealSocket gives AccessHint a real socket (stat by the
// OS) whose group the identity is not in, and checks the message vrdmactl
// prints from a connect's EACCES.
func TestSocketAccessRealSocket(t *testing.T) {
	dir := t.TempDir()
	// t.TempDir's parent is 0700: the hint would (rightly) name it.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, "control.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chmod(path, 0o660); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	gid := int(fi.Sys().(*syscall.Stat_t).Gid)
	// Someone else: not the owner, not in the socket's group.
	id := Identity{UID: 4242, Groups: []int{4242}}
	hint := AccessHint(path, id, os.Stat, groupName)
	want := fmt.Sprintf("join group %s: usermod -aG %s $USER, then log in again", groupName(gid), groupName(gid))
	if hint != want {
		t.Errorf("got %q, want %q", hint, want)
	}
	connectErr := &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.EACCES)}
	err = &AccessError{Path: path, Hint: hint, Err: connectErr}
	if got := err.Error(); got != path+": permission denied ("+want+")" {
		t.Errorf("got %q", got)
	}
	if !errors.Is(err, syscall.EACCES) {
		t.Error("the connect error is lost")
	}
	// Any other error passes through SocketAccess untouched.
	other := &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	if got := SocketAccess(path, other); got != error(other) {
		t.Errorf("got %v, want the error unchanged", got)
	}
	var ae *AccessError
	if got := SocketAccess(path, connectErr); !errors.As(got, &ae) || ae.Path != path {
		t.Errorf("got %v, want an *AccessError for %s", got, path)
	}
}
