// Package sched is the daemon's engine pool: a bounded set of workers
// (vrdmad --engine-threads, default the CPUs the daemon may use) that
// serves the doorbell queues of every device of the daemon, instead of a
// goroutine per queue that runs and spins on its own.
//
// # Why
//
// Until this package, each doorbell queue had its own engine goroutine: it
// ran the queue's QPs while there was work and then kept polling for a
// spin window (up to 50 µs, adaptive) before it slept. `make bench` showed
// the aggregate of N busy pairs of devices at 0.48× one pair's bandwidth
// with 2 pairs, 0.24× with 4 and 0.09× with 8. An execution trace of that
// benchmark (vrdma-bench --only scaling --spin-clients --trace, read with
// go tool trace) found the cause in the benchmark's clients, not the
// engine: they are virtio-user front-ends in the daemon's own process and
// busy-polled their CQs without ever blocking, so each held a Go P until
// the runtime's preemption after 10 ms, while the engine goroutines waited
// runnable for up to 55 ms (0.83 s of waiting in a 1 s row at 4 pairs). A
// guest's vCPU is a host thread the kernel time-slices; the clients now
// yield when their CQ is empty, as such a vCPU does, and with them the
// per-queue goroutines held 1.1–1.3× one pair at 2–8 pairs, 0.55–0.97× at
// 32 and 0.55–0.86× at 128 (the run-to-run range on this 2-core machine).
//
// What the per-queue design could not give is what a shared engine must:
// at 128 pairs the pairs' shares were unequal (Jain's index 0.73–0.985),
// nothing bounded how many queues spun at once or let an operator give one
// tenant more or less of the engine, and the engine's concurrency was the
// number of busy queues, not the cores the daemon is given. The work has
// the shape an RNIC's scheduler has: many queues, few engines. So the
// design is an RNIC's: a fixed number of workers, a run queue of queues
// with work, and a turn of bounded size per visit. With it (same rig,
// 2 workers): 1.1× at 8 pairs, 0.83× at 32, 0.68× at 128, Jain's index
// ≥ 0.99 at every N.
//
// # Design
//
//   - A Task is one doorbell queue. Its kick eventfd still wakes a goroutine
//     parked in Go's netpoller (epoll): that goroutine only marks the task
//     runnable (Task.Wake) and goes back to waiting, so an idle device costs
//     no processor and no worker.
//   - Workers take runnable tasks from one FIFO in turn and run one visit
//     each. A visit is bounded by a Budget; a task that still has work, or
//     is spinning on its driver's next post (the used-ring NO_NOTIFY flag
//     stays set, so its driver does not kick), goes to the back of the
//     queue. Spinning is therefore a revisit after everyone else's turn,
//     not a processor held. A task without work clears NO_NOTIFY, looks
//     once more and goes idle until its next kick.
//   - Fairness is deficit round robin over engine time: a turn grants
//     Quantum × the task's weight, a work request costs its payload plus
//     OpCost, and a message larger than what is left still runs and leaves
//     a debt that the task's next turns repay while others wait (the engine
//     never splits a message). Within a device, the engine starts each visit
//     at a different QP, so QPs share a budget that runs out midway.
//   - A turn is large (DefaultQuantum, 2 MiB of engine time, at most
//     DefaultOps work requests): a visit costs a lock, a memory-table
//     reference and a run-queue round trip, and 128 busy pairs of 64 KiB
//     WRITE moved 0.50× one pair's bandwidth with 128 KiB turns, 0.65× with
//     1 MiB and 0.68× with 2 MiB (vrdma-bench --only scaling, same run). A
//     device waits at most one turn of each busy device ahead of it while
//     all workers are busy: ~60 µs for a 2 MiB turn of 64 KiB WRITEs here,
//     ~15 µs for 64 small ones.
//   - Workers park on a condition variable after a short spin (Config.Spin,
//     one worker at a time) when the run queue is empty, and yield the
//     processor to the rest of the process after yieldEvery (1 ms) of
//     back-to-back visits: a kick's goroutine and the control API must not
//     wait for the runtime's 10 ms preemption. More often costs the engine
//     its share when the process is oversubscribed (a victim's p99 beside a
//     flooding neighbour went from 2 µs to 14–55 µs with 50 µs).
//   - The goroutine that receives a kick runs the task's turns itself
//     (Task.Kick) when nothing is queued, so a lightly loaded daemon pays
//     no hand-off per message: perftest ib_write_lat between two TCG guests
//     took 46 µs with the hand-off and 17–21 µs without (25 µs with the
//     per-queue goroutines before the pool). One such caller at a time:
//     at most Workers+1 visits run at once.
//   - Optional pinning (Config.CPUs, vrdmad --engine-cpus) locks each
//     worker to an OS thread with its CPU affinity set, for operators who
//     dedicate cores to the engine.
//
// A device's rate bounds (rdma.Share) narrow the budget of its visits and,
// when its tokens run out, put its queues to sleep until they refill
// (Next.At), without a kick.
//
// # Ownership and locking
//
// A task is visited by one worker at a time (Task.runMu); its run function
// owns whatever it keeps between visits. Task state moves idle → queued →
// running → idle with compare-and-swap, and a Wake during a visit
// (running → rewoken) makes the worker queue the task again after the
// visit, so a kick is never lost. Stop marks the task stopped and waits
// out a visit in progress; a stopped task found in the run queue is
// dropped. Pool.mu guards the run queue only and is a leaf.
package sched
