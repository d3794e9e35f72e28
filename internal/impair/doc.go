// Package impair is a user-space impairment hop for tests: it sits in the
// middle namespace M of a netlab.MultiPath and forwards the IP packets of
// every path between A and B, impairing each direction of each path by its
// own Rule — down (drop all), loss, reordering, rate limit, delay plus
// jitter — and counting what it did (Counters). It is a router, not a
// proxy: packets leave with the addresses they came with, so the UDP
// endpoints (and later an rxe guest bridged into A or B) see each other's
// real addresses.
//
// How packets get to it. The host kernel here has no netem, nft or
// iptables, so M diverts with policy routing instead (netlab's
// MultiPath.Divert; Interpose does it for every path): path i gets two TUN
// devices, hopa<i> for what arrives from A and hopb<i> for what arrives
// from B, and two rules, "iif ma<i> → a table routing 10.200.0.0/16 and
// fd00:7672::/32 into hopa<i>" and the same for mb<i> → hopb<i>. The hop
// reads a packet from a TUN and, when its Rule lets it, writes it back into
// the same TUN; the kernel then sees it arrive on hopa<i>, where no rule
// applies, and routes it by M's main table out of the link towards its
// destination. Two TUNs per path rather than one, because a path is full
// duplex: each direction has its own queue, rate and rule, and the hop
// never parses a packet to learn its direction.
//
//	  A                               M                                  B
//	 p<i> ===veth=== ma<i>                                 mb<i> ===veth=== p<i>
//	                   | rule iif ma<i>        main table ^
//	                   v                                  |
//	               hopa<i> --read--> lane A->B --write--> hopa<i>
//	               hopb<i> --read--> lane B->A --write--> hopb<i>
//	                   ^ rule iif mb<i>         main table |
//	                   |                                  v
//	                 (from B)                          (to A, out of ma<i>)
//
//	lane: reader goroutine -> in (bounded) -> scheduler goroutine:
//	      down? -> loss? -> hold back (reorder)? -> rate -> delay line (FIFO) -> write
//
// Each direction of a path is a lane: a reader goroutine, a scheduler
// goroutine, Config.QueueLen packet buffers of Config.MTU bytes, and a
// random generator seeded from Config.Seed, the path and the direction, so
// the same packets in the same order meet the same fate. The scheduler owns
// the delay line (a ring; a packet never overtakes the one before it there,
// so jitter does not reorder) and the held-back packets (at most 64); it
// sleeps on one timer until the next packet is due. Everything is bounded:
// 4 goroutines and 2 × (QueueLen+1) buffers per path. A packet that finds
// all buffers of its lane in use is dropped and counted (QueueFull) — the
// hop never blocks the kernel, whose own TUN queue would drop silently
// (Interpose makes that queue as long as the lane's when QueueLen exceeds
// the kernel's 500 packets, so a reader kept waiting by a busy machine
// loses no more there than the lane would).
//
// Rules change at run time (SetRule, SetRuleDir; an atomic pointer the
// scheduler reads per packet); a Down rule also drops what is already
// queued. Delays are lower bounds: a packet leaves no earlier than its due
// time, later by however long the Go timer and the machine take.
//
// Non-goals: parsing or rewriting packets (no NAT, no per-flow or
// per-protocol rules, no corruption or duplication), precise timing
// (nothing here is a real-time emulator), and anything outside the test
// topology (it only reads and writes the devices it is given). M forwards
// twice per packet, so the IPv4 TTL and IPv6 hop limit drop by two.
//
// Concurrency: Hop's methods are safe for concurrent use. There are no
// locks: rules are atomic pointers, counters atomics, and a buffer belongs
// to exactly one place at a time (the lane's free list, its in channel, its
// reader, or its scheduler), which is why no channel send can block.
// Close cancels the schedulers, closes the devices (ending the readers)
// and waits for all goroutines.
package impair
