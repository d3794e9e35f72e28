// Package layout holds no code: its test checks the module's import graph
// against the layering the project is built on, so that a misplaced import
// fails `go test ./...` naming the offending edge.
//
// The rules (layout_test.go lists them with their reasons):
//
//   - virtio/rdma/abi, the device ABI, is a leaf: it imports no package of
//     the module. Both sides import it.
//   - Nothing under guest/ (the driver side: verbs library, virtio-pci
//     transport) imports memmap, backend/... or vmm/....
//   - Nothing under backend/, memmap or virtio/ (the device side and the
//     virtio basics) imports anything under guest/.
//   - memmap (host memory: the table, the pinner) is imported only by
//     backend/..., cmd/... and a short list of host-side packages, each
//     with its reason.
//   - cmd/... may import anything.
//
// The rules apply to test imports too. Non-goals: rules inside a side (which
// backend package may import which), and anything about non-Go files.
package layout
