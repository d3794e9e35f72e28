package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/vmm/qemu/qemutest"
)

// TestFakeVirshHelper is the fake virsh of qemutest.InstallFakeVirsh when
// this test binary runs as one; in a test run it skips.
func TestFakeVirshHelper(t *testing.T) { qemutest.FakeVirshHelper(t) }

func startControl(t *testing.T) (string, *daemon.Daemon) {
	t.Helper()
	l := logrus.New()
	l.SetOutput(io.Discard)
	d := daemon.New(logrus.NewEntry(l), daemon.Config{})
	// A short directory: sun_path holds 107 bytes and t.TempDir is long.
	dir, err := os.MkdirTemp("", "vrdmactl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	control := filepath.Join(dir, "control.sock")
	if err := d.ServeControl(control); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return control, d
}

// ctl runs vrdmactl with --control and returns its standard output,
// standard error and exit status.
func ctl(control string, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(append([]string{"--control", control}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

func TestDeviceLifecycle(t *testing.T) {
	control, d := startControl(t)
	sock := filepath.Join(filepath.Dir(control), "vm1.sock")
	out, errs, code := ctl(control, "device", "add", "vm1", "--socket", sock, "--max-qps", "32", "--max-pinned", "64M", "--guid", "0211:2233:4455:6677", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var info daemon.DeviceInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("device add --json: %q: %v", out, err)
	}
	if info.ID != "vm1" || info.Socket != sock || info.Limits.MaxQPs != 32 || info.Limits.MaxPinnedBytes != 64<<20 || info.GUID != "0211:2233:4455:6677" {
		t.Errorf("device add: got %+v", info)
	}
	// Default socket: ID.sock next to the control socket; flags after the ID.
	if _, errs, code := ctl(control, "device", "add", "vm2"); code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if dv, ok := d.Device("vm2"); !ok || dv.Server.Socket() != filepath.Join(filepath.Dir(control), "vm2.sock") {
		t.Errorf("device add vm2: got %v, want a socket beside the control socket", ok)
	}
	out, _, code = ctl(control, "device", "ls")
	if code != 0 || !strings.Contains(out, "vm1") || !strings.Contains(out, "vm2") {
		t.Errorf("device ls: got %q, exit %d", out, code)
	}
	out, _, code = ctl(control, "device", "show", "vm1")
	if code != 0 || !strings.Contains(out, "max_qps") || !strings.Contains(out, "32") {
		t.Errorf("device show: got %q, exit %d", out, code)
	}
	for _, id := range []string{"vm1", "vm2"} {
		if out, errs, code := ctl(control, "device", "rm", id); code != 0 || out != "removed "+id+"\n" {
			t.Errorf("device rm %s: got %q, exit %d: %s", id, out, code, errs)
		}
	}
	if n := len(d.Devices()); n != 0 {
		t.Errorf("after rm: got %d devices, want 0", n)
	}
}

// TestExitCodes checks the documented exit statuses, and that an error is
// one JSON object on standard error with --json.
func TestExitCodes(t *testing.T) {
	control, _ := startControl(t)
	dir := filepath.Dir(control)
	if _, errs, code := ctl(control, "device", "add", "vm1", "--socket", filepath.Join(dir, "vm1.sock")); code != 0 {
		t.Fatalf("device add: exit %d: %s", code, errs)
	}
	missing := filepath.Join(dir, "nobody.sock")
	tests := []struct {
		control string
		args    []string
		code    int
		want    string // in the error message
	}{
		{control, []string{"device", "add", "vm1", "--socket", filepath.Join(dir, "x.sock")}, exitConflict, "409"},
		{control, []string{"device", "add", "vm3", "--socket", filepath.Join(dir, "vm1.sock")}, exitConflict, "socket path in use"},
		{control, []string{"device", "add", "vm3", "--max-qps", "70000"}, exitUsage, "limits.max_qps"},
		{control, []string{"device", "add"}, exitUsage, "needs ID"},
		{control, []string{"device", "add", "a", "b"}, exitUsage, "needs ID"},
		{control, []string{"device", "add", "vm4", "--max-pinned", "lots"}, exitUsage, "--max-pinned"},
		{control, []string{"device", "rm", "nope"}, exitNotFound, "404"},
		{control, []string{"device", "show", "nope"}, exitNotFound, "no such device"},
		{control, []string{"device", "ls", "extra"}, exitUsage, "unexpected arguments"},
		{control, []string{"device", "frob"}, exitUsage, "unknown command"},
		{control, []string{"device"}, exitUsage, "needs a command"},
		{control, []string{"frob"}, exitUsage, "unknown command"},
		{control, []string{}, exitUsage, "missing command"},
		{control, []string{"--nope", "device", "ls"}, exitUsage, "nope"},
		{control, []string{"device", "ls", "--nope"}, exitUsage, "nope"},
		{control, []string{"vm", "attach", "--device", "vm1"}, exitUsage, "--qmp"},
		{control, []string{"vm", "attach", "--qmp", "q", "--libvirt", "d", "--device", "vm1"}, exitUsage, "exclude"},
		{control, []string{"vm", "pci", "--qmp", "q", "--connect", "qemu:///system"}, exitUsage, "--connect"},
		{control, []string{"vm", "attach", "--qmp", "/nonexistent/qmp.sock", "--device", "nope"}, exitNotFound, "no such device"},
		{control, []string{"vm", "attach", "--qmp", "/nonexistent/qmp.sock", "--device", "vm1"}, exitFailure, "qmp /nonexistent/qmp.sock"},
		{control, []string{"vm", "detach", "--qmp", "/nonexistent/qmp.sock"}, exitUsage, "--device"},
		{control, []string{"completion", "fish"}, exitUsage, "bash or zsh"},
		{missing, []string{"device", "ls"}, exitUnreachable, "nobody.sock"},
		{missing, []string{"device", "add", "vm5"}, exitUnreachable, "unreachable"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, errs, code := ctl(tt.control, tt.args...)
			if code != tt.code || !strings.Contains(errs, tt.want) {
				t.Errorf("got exit %d, %q; want %d and an error with %q", code, errs, tt.code, tt.want)
			}
			_, errs, code = ctl(tt.control, append(tt.args, "--json")...)
			var e struct {
				Error    string `json:"error"`
				ExitCode int    `json:"exit_code"`
			}
			if err := json.Unmarshal([]byte(errs), &e); err != nil || e.ExitCode != tt.code || code != tt.code || e.Error == "" {
				t.Errorf("--json: got exit %d, stderr %q (%v); want exit %d and {\"error\":…,\"exit_code\":%d}", code, errs, err, tt.code, tt.code)
			}
		})
	}
}

// fakeQEMU answers the QMP commands of vm attach, detach and pci.
func fakeQEMU(t *testing.T, sock string) *qemutest.QMPServer {
	return qemutest.NewQMPServer(t, func(cmd string, args map[string]any) (any, error) {
		switch cmd {
		case "query-version":
			return map[string]any{"qemu": map[string]int{"major": 10, "minor": 0, "micro": 2}, "package": ""}, nil
		case "qom-list-types":
			return []map[string]string{{"name": "vhost-user-device-pci"}}, nil
		case "query-memdev":
			return []map[string]any{{"id": "mem", "share": true, "size": 1 << 30}}, nil
		case "query-chardev":
			return []map[string]string{{"label": "vm1-chr", "filename": "unix:" + sock}}, nil
		case "query-pci":
			return []map[string]any{{"bus": 0, "devices": []map[string]any{
				{"bus": 0, "slot": 0, "function": 0, "class_info": map[string]any{"class": 1536, "desc": "Host bridge"},
					"id": map[string]int{"vendor": 0x8086, "device": 0x29c0}, "qdev_id": ""},
				{"bus": 0, "slot": 3, "function": 0, "class_info": map[string]any{"class": 255},
					"id": map[string]int{"vendor": 0x1af4, "device": 0x106a}, "qdev_id": "vm1"},
			}}}, nil
		case "qom-list":
			return []map[string]string{}, nil
		case "chardev-add", "device_add", "device_del", "chardev-remove":
			return map[string]any{}, nil
		}
		return nil, errors.New("unknown command " + cmd)
	})
}

// TestJSON checks that every command that prints takes --json, after the
// command or before it, and prints one JSON document.
func TestJSON(t *testing.T) {
	control, _ := startControl(t)
	dir := filepath.Dir(control)
	sock := filepath.Join(dir, "vm1.sock")
	qmpSrv := fakeQEMU(t, sock)
	qemutest.InstallFakeVirsh(t, "TestFakeVirshHelper", "dom1", qmpSrv.Socket)
	tests := []struct {
		args  []string
		check func(any) bool
	}{
		{[]string{"device", "add", "vm1", "--socket", sock}, func(v any) bool { return v.(map[string]any)["id"] == "vm1" }},
		{[]string{"device", "ls"}, func(v any) bool { return len(v.([]any)) == 1 }},
		{[]string{"device", "show", "vm1"}, func(v any) bool { return v.(map[string]any)["socket"] == sock }},
		{[]string{"vm", "pci", "--qmp", qmpSrv.Socket}, func(v any) bool { return len(v.([]any)) == 2 }},
		{[]string{"vm", "pci", "--libvirt", "dom1"}, func(v any) bool { return len(v.([]any)) == 2 }},
		{[]string{"vm", "attach", "--qmp", qmpSrv.Socket, "--device", "vm1", "--bus", "rp0"}, func(v any) bool {
			m := v.(map[string]any)
			return m["action"] == "attached" && m["bus"] == "rp0" && m["socket"] == sock
		}},
		{[]string{"vm", "detach", "--libvirt", "dom1", "--device", "vm1"}, func(v any) bool { return v.(map[string]any)["action"] == "detached" }},
		{[]string{"vm", "attach", "--libvirt", "dom1", "--device", "vm1", "--bus", "rp0"}, func(v any) bool { return v.(map[string]any)["action"] == "attached" }},
		{[]string{"device", "rm", "vm1"}, func(v any) bool { return v.(map[string]any)["removed"] == true }},
	}
	for i, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			args := append(append([]string{}, tt.args...), "--json")
			if i%2 == 1 {
				args = append([]string{"--json"}, tt.args...) // the global flag
			}
			out, errs, code := ctl(control, args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			var v any
			dec := json.NewDecoder(strings.NewReader(out))
			if err := dec.Decode(&v); err != nil || dec.More() {
				t.Fatalf("output is not one JSON document (%v): %q", err, out)
			}
			if !tt.check(v) {
				t.Errorf("unexpected JSON: %s", out)
			}
		})
	}
}

// TestHelp checks that every command's --help exits 0 with its usage on
// standard output and nothing on standard error.
func TestHelp(t *testing.T) {
	cases := [][]string{{"--help"}, {"-h"}, {"help"}, {"help", "device", "add"}, {"device", "--help"}, {"vm", "--help"}}
	for _, c := range commands {
		cases = append(cases, append(strings.Fields(c.path), "--help"))
	}
	for _, args := range cases {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(args, &out, &errb)
			if code != 0 || errb.Len() != 0 || !strings.HasPrefix(out.String(), "Usage: vrdmactl") {
				t.Errorf("got exit %d, stdout %.80q, stderr %q; want 0, the usage, nothing", code, out.String(), errb.String())
			}
		})
	}
	var out bytes.Buffer
	run([]string{"--help"}, &out, io.Discard)
	for _, want := range []string{"Exit status:", "3  no such device", "5  vrdmad unreachable", "completion bash"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	for _, c := range commands {
		if !strings.Contains(out.String(), "vrdmactl "+c.path) {
			t.Errorf("--help lacks the command %q", c.path)
		}
	}
}

// TestCompletion checks the bash script with bash -n, sources it and runs
// the completion function as bash would (COMP_WORDS), device IDs
// included, which the script asks a built vrdmactl for. Where zsh is
// installed, the zsh script must pass zsh -n and complete the same words
// as _vrdmactl autoloaded from $fpath (as compinit loads the packaged
// /usr/share/zsh/vendor-completions/_vrdmactl), and register itself with
// compdef when sourced.
func TestCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("bash not found")
	}
	var script bytes.Buffer
	if code := run([]string{"completion", "bash"}, &script, io.Discard); code != 0 {
		t.Fatalf("completion bash: exit %d", code)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "vrdmactl.bash")
	if err := os.WriteFile(file, script.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bash, "-n", file).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}

	bin := filepath.Join(dir, "vrdmactl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	control, _ := startControl(t)
	for _, id := range []string{"alpha", "beta"} {
		if _, errs, code := ctl(control, "device", "add", id); code != 0 {
			t.Fatalf("device add: %s", errs)
		}
	}
	complete := func(t *testing.T, words ...string) string {
		t.Helper()
		sh := `source "$1"; shift; complete -p vrdmactl; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _vrdmactl; echo "${COMPREPLY[*]}"`
		cmd := exec.Command(bash, append([]string{"--norc", "-c", sh, "bash", file}, words...)...)
		cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash: %v\n%s", err, out)
		}
		first, rest, _ := strings.Cut(string(out), "\n")
		if first != "complete -F _vrdmactl vrdmactl" || strings.Count(rest, "\n") != 1 {
			t.Fatalf("complete -p vrdmactl, then the words: got %q", out)
		}
		return strings.TrimSuffix(rest, "\n")
	}
	cases := []struct {
		words []string
		want  string
	}{
		{[]string{"vrdmactl", ""}, "completion daemon device help resource version vm"},
		{[]string{"vrdmactl", "d"}, "daemon device"},
		{[]string{"vrdmactl", "daemon", ""}, "status ack upgrade"},
		{[]string{"vrdmactl", "v"}, "version vm"},
		{[]string{"vrdmactl", "device", ""}, "add set rm ls show qps cqs mrs pds srqs mws"},
		{[]string{"vrdmactl", "resource", ""}, "show"},
		{[]string{"vrdmactl", "resource", "show", ""}, "qp cq mr pd srq mw"},
		{[]string{"vrdmactl", "resource", "show", "s"}, "srq"},
		{[]string{"vrdmactl", "--control", control, "device", "qps", "a"}, "alpha"},
		{[]string{"vrdmactl", "device", "set", "x", "--w"}, "--weight"},
		{[]string{"vrdmactl", "device", "add", "x", "--max-b"}, "--max-bytes-per-s"},
		{[]string{"vrdmactl", "--control", control, "device", "set", "b"}, "beta"},
		{[]string{"vrdmactl", "vm", "a"}, "attach"},
		{[]string{"vrdmactl", "--"}, "--control --json --help"},
		{[]string{"vrdmactl", "device", "add", "x", "--max-p"}, "--max-pinned"},
		{[]string{"vrdmactl", "vm", "attach", "--li"}, "--libvirt"},
		{[]string{"vrdmactl", "completion", ""}, "bash zsh"},
		{[]string{"vrdmactl", "--control", control, "device", "rm", ""}, "alpha beta"},
		{[]string{"vrdmactl", "--control", control, "device", "show", "a"}, "alpha"},
		{[]string{"vrdmactl", "--control", control, "vm", "attach", "--qmp", "/q.sock", "--device", "b"}, "beta"},
		{[]string{"vrdmactl", "--control", control, "device", "rm", "alpha", ""}, ""},
	}
	for _, tt := range cases {
		t.Run(strings.Join(tt.words, " "), func(t *testing.T) {
			if got := complete(t, tt.words...); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}

	t.Run("zsh", func(t *testing.T) {
		var z bytes.Buffer
		if code := run([]string{"completion", "zsh"}, &z, io.Discard); code != 0 || !strings.HasPrefix(z.String(), "#compdef vrdmactl\n") {
			t.Fatalf("completion zsh: exit %d, %.100q; want a #compdef vrdmactl first line", code, z.String())
		}
		zsh, err := exec.LookPath("zsh")
		if err != nil {
			t.Skip("zsh not found")
		}
		fdir := t.TempDir()
		f := filepath.Join(fdir, "_vrdmactl")
		if err := os.WriteFile(f, z.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(zsh, "-n", f).CombinedOutput(); err != nil {
			t.Fatalf("zsh -n: %v\n%s", err, out)
		}
		// compadd, _files and compdef exist only inside zsh's completion
		// system: these stand-ins print what would be offered, matched
		// against the word being completed as compadd matches it.
		const stubs = `compadd() {
	local -a out
	while (($#)); do
		case $1 in
		(-a) shift; out+=(${(P)1}) ;;
		(--|-) shift; out+=("$@"); break ;;
		esac
		shift
	done
	print -r -- "${(M)out[@]:#${words[CURRENT]}*}"
}
_files() { print -r -- FILES; }
compdef() { print -r -- "compdef $*"; }
`
		zshRun := func(t *testing.T, script string, args ...string) string {
			t.Helper()
			cmd := exec.Command(zsh, append([]string{"-f", "-c", stubs + script, "zsh"}, args...)...)
			cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("zsh: %v\n%s", err, out)
			}
			return string(out)
		}
		if got := zshRun(t, `source "$1"`, f); got != "compdef _vrdmactl vrdmactl\n" {
			t.Errorf("sourced: got %q, want it to call compdef _vrdmactl vrdmactl", got)
		}
		for _, tt := range cases {
			t.Run(strings.Join(tt.words, " "), func(t *testing.T) {
				// The first completion runs the autoloaded file, which
				// defines _vrdmactl and completes; the second the function.
				out := zshRun(t, `fpath=("$1" $fpath); autoload -Uz _vrdmactl; shift
words=("$@"); CURRENT=$#; _vrdmactl; print @@; _vrdmactl; true`, append([]string{fdir}, tt.words...)...)
				first, second, ok := strings.Cut(out, "@@\n")
				for i, got := range []string{first, second} {
					if got = strings.Join(strings.Fields(got), " "); !ok || got != tt.want {
						t.Errorf("completion %d: got %q, want %q (output %q)", i+1, got, tt.want, out)
					}
				}
			})
		}
	})
}
