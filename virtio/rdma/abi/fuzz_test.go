package abi

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// FuzzUnmarshal decodes arbitrary bytes as each wire structure the device
// or the driver receives: a buffer of the wrong size is an error and leaves
// the structure zero; one of the right size decodes and encodes back to the
// same bytes (the layout has no padding and no field is reinterpreted).
func FuzzUnmarshal(f *testing.F) {
	f.Add(uint8(0), Marshal(&CQE{WRID: 7, Opcode: WCOpRecv, ByteLen: 3}))
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		types := []func() any{ // the seed's structure first
			func() any { return &CQE{} }, func() any { return &Config{} },
			func() any { return &CmdHeader{} }, func() any { return &RespHeader{} },
			func() any { return &DeviceAttr{} }, func() any { return &PortAttr{} },
			func() any { return &RegMR{} }, func() any { return &CreateCQ{} },
			func() any { return &CreateQP{} }, func() any { return &QPAttr{} },
			func() any { return &SendWQE{} }, func() any { return &RecvWQE{} },
			func() any { return &Event{} }, func() any { return &GIDEntry{} },
		}
		v := types[int(which)%len(types)]()
		zero := Marshal(v)
		if err := Unmarshal(b, v); err != nil {
			if got := Marshal(v); !bytes.Equal(got, zero) {
				t.Fatalf("%T: error %v with a non-zero result %x", v, err, got)
			}
			if len(b) == binary.Size(v) {
				t.Fatalf("%T: %d bytes, the right size, rejected: %v", v, len(b), err)
			}
			return
		}
		if got := Marshal(v); !bytes.Equal(got, b) {
			t.Fatalf("%T: decoded %x, encodes back to %x", v, b, got)
		}
	})
}
