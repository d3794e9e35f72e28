package version

import (
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
