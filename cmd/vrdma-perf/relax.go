package main

import (
	"runtime"
	"syscall"
)

// spinBeforeYield is how many empty polls in a row a polling loop makes
// before each further one gives the CPU away.
//
// What a loop waits for is work of other threads: the engine's workers in
// vrdmad and, in two processes, the peer's loop. perftest busy-polls
// without a pause, and so did vrdma-perf: with both sides in one process
// that is one busy thread, but two processes are two, and with the
// engine's workers they outnumber the CPUs of a small machine, where the
// kernel then runs each poller for its whole time slice while the thread
// it waits for cannot run (on 2 CPUs: ib_send_bw 0.4× and ib_write_lat 30×
// slower in two processes than in one). A short spin keeps the latency of
// a quick answer; past it, sched_yield lets the others run first, and on a
// machine with idle CPUs it returns at once.
const spinBeforeYield = 256

// relax is what a polling loop does after its spins-th empty poll in a row:
// let the process's other goroutines run (the exchange's reader) and,
// past spinBeforeYield, the machine's other threads.
func relax(spins int) {
	if spins >= spinBeforeYield {
		syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
		return
	}
	runtime.Gosched()
}
