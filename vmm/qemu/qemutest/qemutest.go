// Package qemutest has fakes for testing code that drives QEMU without
// the real thing around it: a QMP server on a unix socket whose answers a
// test function gives (QMPServer), and a virsh that forwards
// `virsh qemu-monitor-command` to any QMP socket (FakeVirsh), a real
// QEMU's or a QMPServer's, so libvirt hot-plug runs without a libvirtd.
//
// The fake virsh is the test binary itself, started through a small shell
// script put first in $PATH: the calling test package declares one helper
// test that hands the process over,
//
//	func TestFakeVirshHelper(t *testing.T) { qemutest.FakeVirshHelper(t) }
//
// and names it to InstallFakeVirsh. In a normal test run that helper just
// skips.
//
// Non-goals: QMP events (virsh does not deliver them either), HMP, virsh
// commands other than qemu-monitor-command.
package qemutest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment of a fake virsh process (set by InstallFakeVirsh).
const (
	envHelper = "VRDMA_FAKE_VIRSH"        // "1": this process is the fake virsh
	envQMP    = "VRDMA_FAKE_VIRSH_QMP"    // the QMP socket of the domain
	envDomain = "VRDMA_FAKE_VIRSH_DOMAIN" // the one domain that exists
	envURI    = "VRDMA_FAKE_VIRSH_URI"    // if set, the only URI accepted
	envLog    = "VRDMA_FAKE_VIRSH_LOG"    // file that gets one JSON argv per run
	envHang   = "VRDMA_FAKE_VIRSH_HANG"   // "1": never answer (timeouts)
)

// FakeVirsh is a virsh first in $PATH for the rest of a test.
type FakeVirsh struct {
	// Dir holds the virsh script and the log.
	Dir string
	log string
}

// InstallFakeVirsh puts a fake virsh first in $PATH until t ends (t.Setenv:
// not for parallel tests). It knows one running domain, whose QEMU
// monitor is the QMP socket qmpSocket; helper is the name of the calling
// package's test that calls FakeVirshHelper.
func InstallFakeVirsh(t testing.TB, helper, domain, qmpSocket string) *FakeVirsh {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := fmt.Sprintf("#!/bin/sh\n%s=1 exec %s -test.run='^%s$' -test.count=1 -- \"$@\"\n",
		envHelper, shellQuote(exe), helper)
	if err := os.WriteFile(filepath.Join(dir, "virsh"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	f := &FakeVirsh{Dir: dir, log: filepath.Join(dir, "calls.log")}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv(envQMP, qmpSocket)
	t.Setenv(envDomain, domain)
	t.Setenv(envLog, f.log)
	t.Setenv(envURI, "")
	t.Setenv(envHang, "")
	return f
}

// RequireURI makes the fake virsh refuse any connection but uri (virsh -c).
func (f *FakeVirsh) RequireURI(t testing.TB, uri string) { t.Setenv(envURI, uri) }

// Hang makes the fake virsh never answer, until it is killed.
func (f *FakeVirsh) Hang(t testing.TB) { t.Setenv(envHang, "1") }

// Calls returns the arguments of every virsh run so far, in order.
func (f *FakeVirsh) Calls() [][]string {
	b, _ := os.ReadFile(f.log)
	var out [][]string
	for _, line := range bytes.Split(b, []byte("\n")) {
		var args []string
		if json.Unmarshal(line, &args) == nil {
			out = append(out, args)
		}
	}
	return out
}

// FakeVirshHelper runs the fake virsh when this process was started as one
// (by InstallFakeVirsh's script) and exits; otherwise it skips t.
func FakeVirshHelper(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process for qemutest.InstallFakeVirsh")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(runVirsh(args, os.Stdout, os.Stderr))
}

// runVirsh is the fake virsh: what real virsh 9 prints and exits with, for
// qemu-monitor-command on one domain.
func runVirsh(args []string, stdout, stderr io.Writer) int {
	if p := os.Getenv(envLog); p != "" {
		if f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			b, _ := json.Marshal(args)
			f.Write(append(b, '\n'))
			f.Close()
		}
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "error: "+format+"\n", a...)
		return 1
	}
	uri := ""
	i := 0
	for ; i < len(args) && strings.HasPrefix(args[i], "-"); i++ {
		switch args[i] {
		case "-c", "--connect":
			if i+1 == len(args) {
				return fail("option '-c' requires an argument")
			}
			i++
			uri = args[i]
		case "-q", "--quiet":
		default:
			return fail("unsupported option '%s'", args[i])
		}
	}
	if i == len(args) {
		return fail("no command")
	}
	if args[i] != "qemu-monitor-command" {
		return fail("unknown command: '%s'", args[i])
	}
	var domain string
	var words []string
	for rest := args[i+1:]; len(rest) > 0; rest = rest[1:] {
		switch {
		case rest[0] == "--domain" && len(rest) > 1:
			domain = rest[1]
			rest = rest[1:]
		case rest[0] == "--pretty":
		case domain == "" && !strings.HasPrefix(rest[0], "-"):
			domain = rest[0]
		default:
			words = append(words, rest[0])
		}
	}
	if want := os.Getenv(envURI); want != "" && uri != want {
		return fail("failed to connect to the hypervisor\nerror: no connection driver available for %s", uri)
	}
	if domain == "" || len(words) == 0 {
		return fail("command 'qemu-monitor-command' requires <domain> and <cmd> options")
	}
	if domain != os.Getenv(envDomain) {
		return fail("failed to get domain '%s'", domain)
	}
	if os.Getenv(envHang) == "1" {
		time.Sleep(time.Hour)
	}
	reply, err := forwardQMP(os.Getenv(envQMP), strings.Join(words, " "))
	if errors.Is(err, errNotRunning) {
		return fail("Requested operation is not valid: domain is not running")
	}
	if err != nil {
		return fail("internal error: %v", err)
	}
	// virsh prints libvirt's compact copy of QEMU's reply, error replies
	// included, and exits 0.
	fmt.Fprintf(stdout, "%s\n\n", reply)
	return 0
}

var errNotRunning = errors.New("domain is not running")

// forwardQMP runs one command on the QMP socket: greeting, qmp_capabilities,
// the command with an id as libvirt adds one, and the reply to it (events
// in between are dropped, as libvirt does for this API).
func forwardQMP(socket, command string) ([]byte, error) {
	var cmd map[string]any
	if err := json.Unmarshal([]byte(command), &cmd); err != nil {
		return nil, fmt.Errorf("cannot parse json %s: %v", command, err)
	}
	conn, err := net.DialTimeout("unix", socket, 5*time.Second)
	if err != nil {
		return nil, errNotRunning
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	dec := json.NewDecoder(bufio.NewReader(conn))
	var greeting map[string]json.RawMessage
	if err := dec.Decode(&greeting); err != nil || greeting["QMP"] == nil {
		return nil, fmt.Errorf("no QMP greeting: %v", err)
	}
	next := func(send map[string]any) (json.RawMessage, error) {
		b, _ := json.Marshal(send)
		if _, err := conn.Write(append(b, '\n')); err != nil {
			return nil, err
		}
		for {
			var raw json.RawMessage
			if err := dec.Decode(&raw); err != nil {
				return nil, err
			}
			var probe struct {
				Event string `json:"event"`
			}
			if json.Unmarshal(raw, &probe) == nil && probe.Event != "" {
				continue
			}
			return raw, nil
		}
	}
	if _, err := next(map[string]any{"execute": "qmp_capabilities"}); err != nil {
		return nil, err
	}
	cmd["id"] = fmt.Sprintf("libvirt-%d", os.Getpid())
	return next(cmd)
}

// Handler answers one QMP command: the value of "return", or an error whose
// text becomes the reply's "desc".
type Handler func(execute string, args map[string]any) (any, error)

// QMPServer is a fake QEMU monitor on a unix socket, one client at a time
// like QEMU's: it greets, takes qmp_capabilities, and answers every other
// command with its handler (commands run one at a time).
type QMPServer struct {
	// Socket is the server's unix socket.
	Socket string

	ln     net.Listener
	handle Handler

	mu   sync.Mutex
	cmds []string // protected by mu
	wg   sync.WaitGroup
}

// NewQMPServer serves handle on a socket in t's temporary directory until t
// ends.
func NewQMPServer(t testing.TB, handle Handler) *QMPServer {
	t.Helper()
	// A short directory: sun_path holds 107 bytes and t.TempDir is long.
	dir, err := os.MkdirTemp("", "qmp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s := &QMPServer{Socket: filepath.Join(dir, "qmp.sock"), handle: handle}
	s.ln, err = net.Listen("unix", s.Socket)
	if err != nil {
		t.Fatal(err)
	}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		s.ln.Close()
		s.wg.Wait()
	})
	return s
}

// Commands returns the commands executed so far (qmp_capabilities left
// out), in order.
func (s *QMPServer) Commands() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.cmds...)
}

func (s *QMPServer) serve() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.session(conn)
	}
}

func (s *QMPServer) session(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(time.Minute))
	enc := json.NewEncoder(conn)
	enc.Encode(map[string]any{"QMP": map[string]any{
		"version":      map[string]any{"qemu": map[string]int{"major": 10, "minor": 0, "micro": 2}, "package": ""},
		"capabilities": []string{"oob"},
	}})
	dec := json.NewDecoder(conn)
	for {
		var c struct {
			Execute string         `json:"execute"`
			Args    map[string]any `json:"arguments"`
			ID      any            `json:"id"`
		}
		if err := dec.Decode(&c); err != nil {
			return
		}
		reply := map[string]any{}
		if c.ID != nil {
			reply["id"] = c.ID
		}
		if c.Execute == "qmp_capabilities" {
			reply["return"] = map[string]any{}
		} else {
			s.mu.Lock()
			s.cmds = append(s.cmds, c.Execute)
			s.mu.Unlock()
			ret, err := s.handle(c.Execute, c.Args)
			if err != nil {
				reply["error"] = map[string]string{"class": "GenericError", "desc": err.Error()}
			} else {
				if ret == nil {
					ret = map[string]any{}
				}
				reply["return"] = ret
			}
		}
		if err := enc.Encode(reply); err != nil {
			return
		}
	}
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
