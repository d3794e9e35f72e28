// Package vrdmadproc runs the vrdmad binary as a child process for the
// programs and tests that drive it from outside: cmd/vrdma-vmtest,
// cmd/vrdma-compare and the end-to-end tests in tests/. Start launches
// vrdmad with a control socket (--control) and one --socket per named
// device, captures its standard error, and returns once the control API
// answers GET /v1/devices; Stop sends SIGTERM, waits for the exit and
// reports an unclean one; Kill ends it with SIGKILL, as a crash would. A
// start that fails (vrdmad exits, or does not answer in time) stops the
// process and returns an *Error that carries the log.
//
// Non-goals: restarting vrdmad, parsing its log, or wrapping the control
// API beyond listing and adding devices (Client, a controlapi.Client, has
// the rest).
//
// State: vrdmad keeps the devices added through the control API in its
// --state-dir; Start gives it Dir/state unless told otherwise
// (Config.StateDir), so a harness's daemon never writes the host's
// /var/lib/vrdma nor contends for its lock. AddDevice wraps POST
// /v1/devices. The child runs in its own process group, so a terminal's
// ^C reaches only the caller, which stops the daemon after what uses it.
//
// Invariants: a Proc's child is always reaped (one goroutine waits for it
// from Start on; Stop kills it after Config.StopTimeout); the captured log
// is bounded by Config.LogLimit; a directory Start created is removed by
// Stop or Kill, a directory the caller gave is left alone. The child gets SIGKILL
// if this process dies first (Pdeathsig).
//
// Concurrency: every method is safe for concurrent use. The log buffer is
// protected by its own mutex; Stop and Kill share one sync.Once, so the
// process is ended once and later calls return the first result. There is
// no lock order: no method holds two locks.
package vrdmadproc
