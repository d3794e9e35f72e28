// Package guestresult is the schema of the VRDMA-RESULT line: the
// machine-readable result a guest program prints on its console and the
// host harnesses parse. A line is the prefix, one space and one JSON
// object:
//
//	VRDMA-RESULT {"role":"client","op":"write","size":4096,...,"verified":true}
//
// The guest side (cmd/vrdma-guest) writes lines with Write; the host side
// (vmm/guestvm, cmd/vrdma-vmtest, cmd/vrdma-compare, tests/) parses their
// payloads with Parse (the keys every role shares, Result) or Decode (a
// role's own type: Hotplug, Restart), and follows a step program with
// DecodeStep. guest/perftest-jobs prints the same lines from the shell
// (the keys of Result, and a few of its own).
//
// Roles and their keys:
//
//	probe      role, config, device, port, gid
//	selftest   role, op, verified, us (one line per verb, then op "all")
//	server     Result (internal/perftest.Result, which the guest prints;
//	           max_gap_ms and bytes when it measured them, e.g. a
//	           --duration stream across a live migration)
//	client     Result, as server
//	hotplug    Hotplug: a Step per event (waiting, usable, attached, detached)
//	restart    Restart: a Step per event (ready, device_fatal, not_found, reset, recovered)
//
// Non-goals: the rest of the console protocol (VRDMA-EXIT, VRDMA-EXCHANGE
// and the others; vmm/guestvm classifies lines), and transporting lines.
//
// This package imports only the standard library: the guest program,
// which must not import the host's back-end, memmap or vmm, imports it as
// well as the host.
//
// Invariants: a line's payload is trusted no more than any guest output:
// Parse, Decode and DecodeStep accept exactly one JSON object, fail on a
// known key of the wrong type, and leave a zero value on error.
package guestresult
