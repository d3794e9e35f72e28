package layout

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/vrdma/vrdma"

// memmapUsers are the packages outside backend/... and cmd/... that may
// import memmap, each for a reason of its own. memmap is host memory
// (the vhost-user memory table, the PVDMA pinner): it sits under the
// backend, and the guest never sees it.
var memmapUsers = map[string]string{
	"vmm/frontend":     "it plays QEMU: it creates the guest memory (memfd) and maps it as the front-end does",
	"internal/daemon":  "vrdmad's device manager hands each device its pin configuration and the daemon-wide pin accounting",
	"internal/metrics": "it exports the pinner's statistics (memmap.PinStats)",
	"tests":            "integration tests build guest memory and pin configurations as a front-end and a daemon do",
}

// guestInTests are the host-side packages whose tests (only) may import a
// package under guest/, each for a reason of its own. Their code never
// does: the device side is not built on the driver side, and the two meet
// at virtio/rdma/abi alone.
var guestInTests = map[string]string{
	"backend/rdma": "the handover and migration tests drive devices with the guest's own verbs library, " +
		"the real other end of the ABI, across a change of process or of host",
}

// rule is one import rule: check returns why the edge from → to (paths
// relative to the module, "." for its root) is not allowed, or "".
type rule struct {
	name  string
	check func(from, to string) string
}

// under reports whether p is dir or a package below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

var rules = []rule{
	{"the device ABI is a leaf", func(from, to string) string {
		if from == "virtio/rdma/abi" {
			return "virtio/rdma/abi imports no package of the module: both sides import it"
		}
		return ""
	}},
	{"the guest stays off the host", func(from, to string) string {
		if under(from, "guest") && (to == "memmap" || under(to, "backend") || under(to, "vmm")) {
			return "nothing under guest/ may import memmap, backend/... or vmm/... (the guest never imports the host's code)"
		}
		return ""
	}},
	{"the host stays off the guest", func(from, to string) string {
		if (under(from, "backend") || from == "memmap" || under(from, "virtio")) && under(to, "guest") {
			return "nothing under backend/, memmap or virtio/ may import guest/... (the device side never imports the driver side)"
		}
		return ""
	}},
	{"memmap under the backend only", func(from, to string) string {
		if to != "memmap" || under(from, "backend") || under(from, "cmd") || from == "memmap" {
			return ""
		}
		if _, ok := memmapUsers[from]; ok {
			return ""
		}
		return "memmap is imported only by backend/..., cmd/... and " + strings.Join(sortedKeys(memmapUsers), ", ") +
			" (host memory stays under the backend; the guest's address type and ring atomics are in virtio/rdma/abi)"
	}},
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// pkg is what the test needs of `go list -json`.
type pkg struct {
	ImportPath   string
	Dir          string
	GoFiles      []string // non-test files of the build (generated ones too)
	Imports      []string
	TestImports  []string
	XTestImports []string
	Error        *struct{ Err string }
}

// violations checks every import of pkgs against the rules and returns one
// line per offending edge: "from imports to: rule: why".
func violations(pkgs []pkg) []string {
	var out []string
	rel := func(p string) (string, bool) {
		switch {
		case p == module:
			return ".", true
		case strings.HasPrefix(p, module+"/"):
			return strings.TrimPrefix(p, module+"/"), true
		}
		return "", false
	}
	for _, p := range pkgs {
		from, ok := rel(p.ImportPath)
		if !ok {
			continue
		}
		edges := []struct {
			imports []string
			how     string
		}{{p.Imports, ""}, {p.TestImports, " (in its tests)"}, {p.XTestImports, " (in its tests)"}}
		seen := map[string]bool{}
		for _, e := range edges {
			for _, imp := range e.imports {
				to, ok := rel(imp)
				if !ok || to == from || seen[to] {
					continue
				}
				if _, allowed := guestInTests[from]; allowed && e.how != "" && under(to, "guest") {
					continue
				}
				for _, r := range rules { // the first rule an edge breaks names it
					if why := r.check(from, to); why != "" {
						seen[to] = true
						out = append(out, fmt.Sprintf("%s imports %s%s: %s: %s", from, to, e.how, r.name, why))
						break
					}
				}
			}
		}
	}
	return out
}

func goCommand() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// listModule returns every package of the module, tests' imports included.
func listModule(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command(goCommand(), "list", "-e", "-json", module+"/...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		if p.Error != nil {
			t.Errorf("go list: %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestImportRules(t *testing.T) {
	pkgs := listModule(t)
	// The rules name these packages; if one moved, the rules must follow.
	have := map[string]bool{}
	for _, p := range pkgs {
		have[p.ImportPath] = true
	}
	for _, p := range []string{"virtio/rdma/abi", "guest/verbs", "guest/virtiopci", "memmap", "backend", "virtio"} {
		if !have[module+"/"+p] {
			t.Errorf("package %s is gone: update the rules of this test", p)
		}
	}
	for u := range memmapUsers {
		if !have[module+"/"+u] {
			t.Errorf("memmapUsers lists %s, which is gone", u)
		}
	}
	for _, v := range violations(pkgs) {
		t.Error(v)
	}
}

// TestRulesCatch feeds made-up import graphs to the checker: each must
// be reported with its edge, and allowed ones must not.
func TestRulesCatch(t *testing.T) {
	m := func(p string) string { return module + "/" + p }
	tests := []struct {
		name string
		from string
		imp  []string
		test []string
		want string // "" for allowed
	}{
		{"abi imports memmap", "virtio/rdma/abi", []string{m("memmap")}, nil, "virtio/rdma/abi imports memmap: the device ABI is a leaf"},
		{"abi imports the stdlib", "virtio/rdma/abi", []string{"encoding/binary", "sync/atomic"}, nil, ""},
		{"verbs imports memmap", "guest/verbs", []string{m("memmap")}, nil, "guest/verbs imports memmap: the guest stays off the host"},
		{"verbs test imports vmm", "guest/verbs", nil, []string{m("vmm/frontend")}, "guest/verbs imports vmm/frontend (in its tests): the guest stays off the host"},
		{"virtiopci imports backend", "guest/virtiopci", []string{m("backend/rdma")}, nil, "guest/virtiopci imports backend/rdma: the guest stays off the host"},
		{"verbs imports abi", "guest/verbs", []string{m("virtio/rdma/abi")}, nil, ""},
		{"engine imports verbs", "backend/rdma/engine", []string{m("guest/verbs")}, nil, "backend/rdma/engine imports guest/verbs: the host stays off the guest"},
		{"virtio imports virtiopci", "virtio", []string{m("guest/virtiopci")}, nil, "virtio imports guest/virtiopci: the host stays off the guest"},
		{"memmap imports verbs", "memmap", []string{m("guest/verbs")}, nil, "memmap imports guest/verbs: the host stays off the guest"},
		{"virtio imports memmap", "virtio", []string{m("memmap")}, nil, "virtio imports memmap: memmap under the backend only"},
		{"vmm/qemu imports memmap", "vmm/qemu", []string{m("memmap")}, nil, "vmm/qemu imports memmap: memmap under the backend only"},
		{"frontend imports memmap", "vmm/frontend", []string{m("memmap")}, nil, ""},
		{"frontend imports verbs", "vmm/frontend", []string{m("guest/verbs")}, nil, ""},
		{"rdma imports verbs", "backend/rdma", []string{m("guest/verbs")}, nil, "backend/rdma imports guest/verbs: the host stays off the guest"},
		{"rdma test imports verbs", "backend/rdma", nil, []string{m("guest/verbs")}, ""},
		{"backend test imports verbs", "backend", nil, []string{m("guest/verbs")}, "backend imports guest/verbs (in its tests): the host stays off the guest"},
		{"backend imports memmap", "backend/rdma", []string{m("memmap")}, nil, ""},
		{"cmd imports anything", "cmd/vrdma-guest", []string{m("memmap"), m("guest/verbs"), m("backend/rdma")}, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := violations([]pkg{{ImportPath: m(tc.from), Imports: tc.imp, TestImports: tc.test}})
			switch {
			case tc.want == "" && len(got) != 0:
				t.Errorf("got %q, want no violation", got)
			case tc.want != "" && (len(got) != 1 || !strings.HasPrefix(got[0], tc.want)):
				t.Errorf("got %q, want one violation starting %q", got, tc.want)
			}
		})
	}
}

// maxLines bounds a non-test Go file: past it, a file holds more than one
// idea (issue 15). Generated files say so in their first line and are
// exempt.
const maxLines = 600

func TestFileLength(t *testing.T) {
	for _, p := range listModule(t) {
		for _, f := range p.GoFiles {
			b, err := os.ReadFile(filepath.Join(p.Dir, f))
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := bytes.Cut(b, []byte("\n"))
			if bytes.HasPrefix(first, []byte("// Code generated ")) {
				continue
			}
			if n := bytes.Count(b, []byte("\n")); n > maxLines {
				t.Errorf("%s/%s: %d lines, more than %d: split it by idea", p.ImportPath, f, n, maxLines)
			}
		}
	}
}
