// Package rdma is the para-virtual RDMA device type: its ABI (config space,
// control commands, statuses; docs/spec.md is the normative text and tests
// hold the two together) and, on top of it, the driver-side verbs library.
//
// The ABI is little-endian and fixed-size. Wire structures are plain Go
// structs of fixed-size fields in declaration order, so encoding/binary
// lays them out exactly as the specification's tables do.
package rdma
