// Package controlapi is vrdmad's control API as both sides see it: the
// wire types (the JSON bodies of /v1/devices and /v1/health), which the
// daemon's handler (internal/daemon) writes and reads, and Client, the one
// HTTP-over-unix-socket client that vrdmactl, internal/vrdmadproc and the
// tests use to call it.
//
// Routes (internal/daemon.Handler serves them):
//
//	GET    /v1/devices        []DeviceInfo                 Client.Devices
//	POST   /v1/devices        AddRequest -> 201 DeviceInfo Client.AddDevice
//	GET    /v1/devices/{id}   DeviceInfo                   Client.Device
//	PATCH  /v1/devices/{id}   PatchRequest -> DeviceInfo   Client.SetShare
//	DELETE /v1/devices/{id}   Removed                      Client.RemoveDevice
//	GET    /v1/health         Health                       Client.Health
//	GET    /v1/devices/{id}/{kind}  []QPInfo, []CQInfo, …  Client.QPs, CQs, MRs, PDs, SRQs, MWs
//	GET    /v1/resources            []ResourceCount         Client.Resources
//	GET    /v1/resources/{kind}     every device's objects  Client.QPs(ctx, "") …
//
// The resource views (kind: qps, cqs, mrs, pds, srqs, mws) are paged
// (limit, after, a Link rel="next" header; resources.go).
//
// Every other answer is an ErrorAnswer with a 4xx or 5xx status; Client
// returns it as a *StatusError, which errors.Is matches against
// ErrBadRequest (400), ErrNotFound (404) and ErrConflict (409). A request
// that gets no answer at all (no socket, nobody accepting, a timeout)
// fails with an *UnreachableError, which matches ErrUnreachable.
//
// Non-goals: validating requests (the daemon does; internal/daemon
// DecodeAddRequest and DecodePatchRequest are the checks), retrying, and
// hot-plug (that is QEMU's QMP, package vmm/qemu, not this API). The daemon's --metrics
// endpoint is not part of the control API; HTTPClient reaches a unix
// metrics socket all the same.
//
// This package imports nothing of the project: the daemon, the command
// line tools and the harnesses all import it.
//
// Concurrency: a Client is immutable after New and safe for concurrent
// use.
package controlapi
