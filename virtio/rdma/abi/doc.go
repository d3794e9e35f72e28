// Package abi is the vrdma device's ABI, what the device side and the
// driver side both compile against: the virtio device ID and queue indices,
// the config space, control command opcodes and statuses, the wire
// structures of commands, responses, WQEs, CQEs, doorbell records and
// events, and the numbers they carry (access flags, QP states and attribute
// masks, send and completion opcodes, completion statuses). docs/spec.md is
// the normative text; tests hold it, this package and
// guest/include/vrdma-abi.h (the C definition the guest's kernel driver and
// rdma-core provider include) together.
//
// It also holds what both sides need to touch memory they share: GPA, the
// guest-physical address type, and the atomic accessors for ring and
// record fields (LoadUint16 … StoreUint64, Fence, CompareAndSwapUint64,
// AddUint64), which the virtio rings, the device's engine and the verbs
// library use.
//
// The ABI is little-endian and fixed-size. Wire structures are plain Go
// structs of fixed-size fields in declaration order, so encoding/binary
// lays them out exactly as the specification's tables do; Marshal and
// Unmarshal encode and decode them.
//
// Non-goals: behaviour and either side's code. The package is a leaf: it
// imports no package of the module (internal/layout's test enforces it).
// The device (backend/rdma, backend/rdma/engine) and the driver
// (guest/verbs, the C parts under guest/) implement the semantics
// docs/spec.md describes; translating a GPA into host memory is memmap's,
// on the host only.
//
// Invariants:
//   - Numbers are ABI: an opcode, status, flag or offset never changes its
//     meaning; new ones take new numbers.
//   - The size constants (ConfigSize, CmdHeaderSize, DeviceAttrSize,
//     SGESize, CQESize, …) equal the structures' encoded sizes and the
//     spec's (abi_test.go).
//   - The atomic accessors panic with an index-out-of-range error if the
//     field does not lie wholly inside the slice, and need natural
//     alignment; a store is sequentially consistent (a full barrier on
//     amd64), as notification suppression needs between publishing an
//     index and reading the other side's flags or event index. The only
//     unsafe and assembly of the package are theirs (atomic_unsafe.go,
//     atomic_amd64.s).
package abi
