package abi

import "testing"

func TestAtomicAccessors(t *testing.T) {
	b := make([]byte, 16)
	StoreUint16(b, 2, 0xbeef)
	if got := LoadUint16(b, 2); got != 0xbeef {
		t.Fatalf("LoadUint16 = %#x, want 0xbeef", got)
	}
	if b[2] != 0xef || b[3] != 0xbe || b[0] != 0 || b[4] != 0 {
		t.Fatalf("StoreUint16 wrote %x, want little-endian at offset 2 only", b)
	}
	StoreUint32(b, 4, 0x11223344)
	if got := LoadUint32(b, 4); got != 0x11223344 {
		t.Fatalf("LoadUint32 = %#x", got)
	}
	StoreUint64(b, 8, 0x1122334455667788)
	if got := LoadUint64(b, 8); got != 0x1122334455667788 {
		t.Fatalf("LoadUint64 = %#x", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("LoadUint16 past the end did not panic")
		}
	}()
	LoadUint16(b, 15)
}
