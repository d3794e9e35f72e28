// Package tests holds the integration tests: a real vrdma daemon (in
// process, or the built binary) driven over real unix sockets by the Go
// front-end in vmm/frontend, which replays QEMU 10's message order, and
// end-to-end tests with the patched QEMU.
package tests
