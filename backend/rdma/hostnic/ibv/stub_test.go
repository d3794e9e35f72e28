//go:build !cgo || !linux

package ibv

import (
	"errors"
	"strings"
	"testing"
)

func TestStubSaysNoCgo(t *testing.T) {
	if err := Load(); !errors.Is(err, ErrNoCgo) || !strings.Contains(err.Error(), "CGO_ENABLED=0") {
		t.Errorf("Load = %v, want ErrNoCgo naming CGO_ENABLED=0", err)
	}
	if _, err := Open("rxe0"); !errors.Is(err, ErrNoCgo) {
		t.Errorf("Open = %v, want ErrNoCgo", err)
	}
	if _, err := Devices(); !errors.Is(err, ErrNoCgo) {
		t.Errorf("Devices = %v, want ErrNoCgo", err)
	}
}
