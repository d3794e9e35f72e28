package memmap

import (
	"errors"
	"reflect"
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"
)

// A front-end that shrinks the file behind a region makes the next access
// raise SIGBUS; Guard turns it into an error and the process goes on.
func TestGuardSIGBUS(t *testing.T) {
	r := mapNew(t, "shrink", 0x2000, RegionSpec{GuestAddr: 0x1000, Size: 0x2000})
	defer r.Release()
	b := r.Bytes()
	if err := Guard(func() { b[0] = 1; b[0x1fff] = 2 }); err != nil {
		t.Fatalf("Guard on good memory: %v", err)
	}
	if err := unix.Ftruncate(r.fd, 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		off  int
		fn   func(i int)
	}{
		{"write", 0x100, func(i int) { b[i] = 3 }},
		{"read", 0x1800, func(i int) { _ = LoadUint64(b, i) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Guard(func() { tc.fn(tc.off) })
			if !errors.Is(err, ErrFault) {
				t.Fatalf("got %v, want ErrFault", err)
			}
			var fe *FaultError
			if !errors.As(err, &fe) {
				t.Fatalf("got %T, want *FaultError", err)
			}
			if want := reflect.ValueOf(&b[tc.off]).Pointer(); fe.Addr != want {
				t.Errorf("got fault address %#x, want %#x", fe.Addr, want)
			}
		})
	}
	// Still alive, and the fault mode was restored.
	if prev := debug.SetPanicOnFault(false); prev {
		t.Error("SetPanicOnFault left on after Guard")
	}
}

func TestGuardRestoresSetting(t *testing.T) {
	debug.SetPanicOnFault(true)
	_ = Guard(func() {})
	if prev := debug.SetPanicOnFault(false); !prev {
		t.Error("Guard did not restore SetPanicOnFault(true)")
	}
}

func TestGuardPropagatesOtherPanics(t *testing.T) {
	tests := []struct {
		name string
		fn   func()
	}{
		{"value", func() { panic("boom") }},
		{"nil dereference", func() {
			var p *int
			_ = *p
		}},
		{"index", func() {
			var s []byte
			i := 3
			_ = s[i]
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("panic was swallowed, want it propagated")
				}
				if prev := debug.SetPanicOnFault(false); prev {
					t.Error("SetPanicOnFault left on after a propagated panic")
				}
			}()
			err := Guard(tt.fn)
			t.Errorf("Guard returned %v, want a panic", err)
		})
	}
}
