package backend

import (
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// nullDevice is the smallest Device: one queue, no config, no work.
type nullDevice struct{}

func (nullDevice) Features() uint64              { return 1 << 32 }
func (nullDevice) NumQueues() int                { return 1 }
func (nullDevice) MaxQueueSize() int             { return 256 }
func (nullDevice) ConfigSize() int               { return 0 }
func (nullDevice) ReadConfig(int, []byte) error  { return nil }
func (nullDevice) WriteConfig(int, []byte) error { return nil }
func (nullDevice) Attach(Host)                   {}
func (nullDevice) MemoryChanged()                {}
func (nullDevice) HandleQueue(*Queue) error      { return nil }
func (nullDevice) Reset()                        {}
func (nullDevice) Detach()                       {}

func serve(t *testing.T, cfg Config) *Server {
	t.Helper()
	s, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(t.Context())
	t.Cleanup(func() { s.Close() })
	return s
}

// connectedWithin reports whether the server shows a front-end within d.
func connectedWithin(s *Server, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if s.Connected() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return false
}

func TestSocketModeAndOwner(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	serve(t, Config{Socket: sock, Device: nullDevice{}, Owner: &Owner{UID: 65534, GID: 65534}})
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 65534 || st.Gid != 65534 {
		t.Errorf("socket owner %d:%d, want 65534:65534", st.Uid, st.Gid)
	}
}

func TestPeerAllowlist(t *testing.T) {
	dir := t.TempDir()
	me := uint32(os.Getuid())
	for _, tc := range []struct {
		name  string
		allow []uint32
		want  bool
	}{
		{"no list", nil, true},
		{"listed", []uint32{12345, me}, true},
		{"not listed", []uint32{me + 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := serve(t, Config{Socket: filepath.Join(dir, tc.name+".sock"), Device: nullDevice{}, AllowUIDs: tc.allow})
			c, err := net.Dial("unix", s.Socket())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := connectedWithin(s, 500*time.Millisecond); got != tc.want {
				t.Fatalf("connected = %v, want %v", got, tc.want)
			}
			if !tc.want && s.Stats().Refused != 1 {
				t.Fatalf("refused count %d, want 1", s.Stats().Refused)
			}
		})
	}
}

func TestSecondFrontendRefused(t *testing.T) {
	s := serve(t, Config{Socket: filepath.Join(t.TempDir(), "s.sock"), Device: nullDevice{}})
	a, err := net.Dial("unix", s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if !connectedWithin(s, time.Second) {
		t.Fatal("first front-end not served")
	}
	if p, ok := s.Peer(); !ok || !p.Known || p.PID != int32(os.Getpid()) || p.UID != uint32(os.Getuid()) || time.Since(p.Since) > time.Minute {
		t.Errorf("peer %+v (connected %v), want this process, connected just now", p, ok)
	}
	b, err := net.Dial("unix", s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.SetReadDeadline(time.Now().Add(handoverWait + 2*time.Second))
	var buf [1]byte
	if n, err := b.Read(buf[:]); n != 0 || err == nil {
		t.Fatalf("second front-end: read %d, %v; want the connection closed", n, err)
	}
	if s.Stats().Refused != 1 {
		t.Fatalf("refused %d, want 1", s.Stats().Refused)
	}
	a.Close()
	deadline := time.Now().Add(time.Second)
	for s.Connected() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if p, ok := s.Peer(); ok || p != (Peer{}) {
		t.Errorf("after the front-end left: peer %+v, connected %v; want none", p, ok)
	}
}
