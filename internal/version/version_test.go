package version

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	s := String()
	if !strings.HasPrefix(s, Version) {
		t.Fatalf("String() = %q, want it to start with Version %q", s, Version)
	}
	if r := Revision(); r != "" && !strings.Contains(s, "(revision "+r+")") {
		t.Fatalf("String() = %q lacks revision %q", s, r)
	}
	if Revision() != Revision() {
		t.Fatal("Revision is not stable")
	}
}

// TestLinkedRevision builds a program with the revision linked in, as
// make build does, and runs it.
func TestLinkedRevision(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds a program")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "prog")
	ld := "-X github.com/vrdma/vrdma/internal/version.Version=1.2.3 -X github.com/vrdma/vrdma/internal/version.linkedRevision=abc123"
	if out, err := exec.Command("go", "build", "-ldflags", ld, "-o", bin, "./testdata/printversion").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), "1.2.3 (revision abc123)"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
