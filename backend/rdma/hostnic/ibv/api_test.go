package ibv

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
)

// exportedFuncs lists a file's exported functions and methods as
// "Recv.Name(param types) results".
func exportedFuncs(t *testing.T, file string) map[string]bool {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	typ := func(e ast.Expr) string {
		var b bytes.Buffer
		printer.Fprint(&b, fset, e)
		return b.String()
	}
	list := func(fl *ast.FieldList) string {
		if fl == nil {
			return ""
		}
		var s []string
		for _, f := range fl.List {
			n := len(f.Names)
			if n == 0 {
				n = 1
			}
			for range n {
				s = append(s, typ(f.Type))
			}
		}
		return strings.Join(s, ", ")
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || !fd.Name.IsExported() {
			continue
		}
		recv := ""
		if fd.Recv != nil {
			recv = list(fd.Recv) + "."
			if !ast.IsExported(strings.TrimPrefix(recv[:len(recv)-1], "*")) {
				continue
			}
		}
		out[recv+fd.Name.Name+"("+list(fd.Type.Params)+") "+list(fd.Type.Results)] = true
	}
	return out
}

// TestStubMatchesAPI: the CGO_ENABLED=0 stub offers exactly the cgo
// build's functions and methods, so callers build either way.
func TestStubMatchesAPI(t *testing.T) {
	if _, err := os.Stat("stub.go"); err != nil {
		t.Skipf("no sources here (a test binary run elsewhere): %v", err)
	}
	impl := exportedFuncs(t, "verbs_unsafe.go")
	stub := exportedFuncs(t, "stub.go")
	var diff []string
	for k := range impl {
		if !stub[k] {
			diff = append(diff, "stub lacks "+k)
		}
	}
	for k := range stub {
		if !impl[k] {
			diff = append(diff, "cgo build lacks "+k)
		}
	}
	sort.Strings(diff)
	for _, d := range diff {
		t.Error(d)
	}
}

// TestBuildWithoutCgo: the package builds and vets with CGO_ENABLED=0.
func TestBuildWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the package again; -short")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(gobin); err != nil {
		t.Skipf("no go command at %s", gobin)
	}
	for _, args := range [][]string{{"build", "-o", os.DevNull, "."}, {"vet", "."}} {
		cmd := exec.Command(gobin, args...)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("CGO_ENABLED=0 go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
