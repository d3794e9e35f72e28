package memmap

import (
	"errors"
	"reflect"
	"runtime/debug"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// A front-end that shrinks the file behind a region makes the next access
// raise SIGBUS; Guard turns it into an error and the process goes on.
func TestGuardSIGBUS(t *testing.T) {
	r, file := mapNewFile(t, "shrink", 0x2000, RegionSpec{GuestAddr: 0x1000, Size: 0x2000})
	defer r.Release()
	b := r.Bytes()
	if err := Guard(func() { b[0] = 1; b[0x1fff] = 2 }); err != nil {
		t.Fatalf("Guard on good memory: %v", err)
	}
	if err := unix.Ftruncate(file, 0); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		off  int
		fn   func(i int)
	}{
		{"write", 0x100, func(i int) { b[i] = 3 }},
		{"read", 0x1800, func(i int) { _ = abi.LoadUint64(b, i) }},
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

// A handler that touches two guests' memories attributes a fault by the
// address: FaultAddr gives it, MapsHost says whose mapping holds it.
func TestFaultAttribution(t *testing.T) {
	ra, fileA := mapNewFile(t, "guest-a", 0x3000, RegionSpec{GuestAddr: 0, Size: 0x3000, UserAddr: 0x10000})
	rb, fileB := mapNewFile(t, "guest-b", 0x2000, RegionSpec{GuestAddr: 0x1000, Size: 0x2000, UserAddr: 0x20000})
	ta, err := NewTable([]*Region{ra})
	if err != nil {
		t.Fatal(err)
	}
	defer ta.Release()
	tb, err := NewTable([]*Region{rb})
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Release()
	ra.Release()
	rb.Release()
	a, err := ta.Slice(0, 0x3000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tb.Slice(0x1000, 0x2000)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Ftruncate(fileB, 0x1000); err != nil { // b's second page goes
		t.Fatal(err)
	}
	// What a multi-guest handler does: recover, attribute, re-panic what
	// is not its own to handle.
	attribute := func(fn func()) (owner string) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			addr, ok := FaultAddr(v)
			switch {
			case !ok:
				panic(v)
			case tb.MapsHost(addr) && !ta.MapsHost(addr):
				owner = "b"
			case ta.MapsHost(addr) && !tb.MapsHost(addr):
				owner = "a"
			default:
				panic(v)
			}
		}()
		fn()
		return "none"
	}
	var owner string
	err = Guard(func() {
		owner = attribute(func() {
			copy(a[0x2000:0x2800], b[0:0x800])       // b's first page is still there
			copy(a[0x1000:0x2000], b[0x1000:0x2000]) // b's second page faults
		})
	})
	if err != nil || owner != "b" {
		t.Fatalf("fault reading guest b: owner %q, Guard error %v; want owner b, no error", owner, err)
	}
	if err := Guard(func() { owner = attribute(func() { copy(a, a[1:2]) }) }); err != nil || owner != "none" {
		t.Fatalf("no fault: owner %q, error %v", owner, err)
	}
	if !ta.MapsHost(reflect.ValueOf(a).Pointer()+0x2fff) || ta.MapsHost(reflect.ValueOf(b).Pointer()) {
		t.Error("MapsHost confuses the two tables")
	}
	if ta.MapsHost(0) || EmptyTable().MapsHost(reflect.ValueOf(a).Pointer()) || (*Table)(nil).MapsHost(1) {
		t.Error("MapsHost claims an address no region maps")
	}
	// A fault the handler re-panics still reaches Guard as a FaultError.
	if err := unix.Ftruncate(fileA, 0); err != nil {
		t.Fatal(err)
	}
	tc := EmptyTable()
	defer tc.Release()
	err = Guard(func() {
		defer func() {
			v := recover()
			if addr, ok := FaultAddr(v); ok && tc.MapsHost(addr) {
				t.Error("empty table claims the fault")
			}
			panic(v)
		}()
		a[0] = 1
	})
	if !errors.Is(err, ErrFault) {
		t.Fatalf("re-panicked fault: got %v, want ErrFault", err)
	}
}

func TestFaultAddrOtherPanics(t *testing.T) {
	for _, v := range []any{nil, "boom", errors.New("x"), ErrFault, &FaultError{Addr: 4096}} {
		if _, ok := FaultAddr(v); ok {
			t.Errorf("FaultAddr(%#v) = true, want false", v)
		}
	}
	func() {
		defer func() {
			if _, ok := FaultAddr(recover()); ok {
				t.Error("a nil dereference is no fault at an address")
			}
		}()
		prev := debug.SetPanicOnFault(true)
		defer debug.SetPanicOnFault(prev)
		var p *int
		_ = *p
	}()
}
