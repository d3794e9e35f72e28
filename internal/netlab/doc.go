// Package netlab builds network topologies out of Linux network namespaces
// for tests: "hosts" that are namespaces, joined by veth pairs, bridges and
// routes, with tap devices for a QEMU guest and TUN devices for a
// user-space hop (package impair). It shells out to iproute2's ip, the
// operator's tool, so a failing step reads as the command line that failed
// plus its standard error (*CmdError).
//
// A Lab (New, or NewT in a test) owns namespaces named
// <prefix>-<pid>-<seq>-<label> ("vrdmalab-4242-3-m"); Close deletes them,
// and with them everything made inside. Sweep deletes the namespaces of a
// prefix whose pid is dead — what a crashed run left — and NewT runs it
// once per process.
//
// Inside a namespace: NS.Do runs a Go function on a fresh OS thread that
// has entered it (sockets and TUNs opened there stay in it), NS.Command
// runs a program there (ip netns exec), NS.ListenUDP opens a socket there.
// The typed helpers (AddAddr, AddRoute, ...) accept only addresses inside
// Range4 (10.200.0.0/16) and Range6 (fd00:7672::/32): a lab never
// configures, and so its tests never reach, any other address. NS.IP is
// the raw escape hatch and checks nothing.
//
// MultiPath is the topology of multipath tests: hosts A and B joined by N
// parallel paths through a middle namespace M. Path i is its own pair of
// veths and its own address pair, routed so that A's address i reaches B's
// address i over path i only:
//
//	      A                          M                            B
//	+-------------+      +------------------------+      +----------------+
//	| p0 10.200.0.1 |====| ma0 .0.2      .0.130 mb0 |====| p0 10.200.0.129 |
//	| p1 10.200.1.1 |====| ma1 .1.2      .1.130 mb1 |====| p1 10.200.1.129 |
//	|  ...          |    |   ip_forward=1         |    |  ...            |
//	+-------------+      +------------------------+      +----------------+
//	  10.200.i.128/25 via 10.200.i.2      10.200.i.0/25 via 10.200.i.130
//	  (and fd00:7672:i:a::1/64 ... fd00:7672:i:b::1/64 the same way)
//
// M forwards in the kernel. MultiPath.SetPathUp takes both of M's links of
// a path down (A and B lose carrier and drop what they send on it).
// MultiPath.Divert hands a path to user space instead: two TUNs in M and
// policy rules (ip rule iif ma<i> → a table whose only route is via
// hopa<i>; likewise mb<i> → hopb<i>); a packet written back into a TUN
// matches no rule and leaves by M's main table, addresses untouched.
//
// Facts of this kernel the code relies on (measured on 6.18): a veth end
// can be created directly in a named namespace (ip link add ... netns X
// type veth peer ... netns Y), so a crash never leaves one in the caller's
// namespace; a sender whose path goes down loses its dynamic neighbour
// entries and queues what it sends for the neighbour to resolve, then
// delivers it seconds later when the path is back — so MultiPath gives
// every link end its peer as a permanent neighbour (fixed MACs), and a
// packet sent while down is dropped at once; a device created in M while
// IPv6 forwarding is its default sends MLD reports of the all-routers
// groups, so Divert makes M's default IPv6 forwarding off before it
// creates the TUNs (forwarding through them still works: the global
// setting governs it) and gives them no multicast and no link-local
// address: M itself writes nothing into them.
//
// Non-goals: impairing traffic (package impair does), nftables, iptables
// or netem (absent here), anything in the caller's namespace (only the
// names under /run/netns appear there), addresses outside the two ranges,
// a general network manager (routes, rules and links are added, never
// edited; a Lab is torn down whole).
//
// Concurrency: the methods of Lab and NS are safe for concurrent use; each
// runs its own ip command, so the caller orders steps that depend on one
// another. Lab.mu protects the list of namespaces; no lock is held while a
// command runs, and there is no other lock.
//
// Cleanup: a namespace outlives its name while something holds it — a TUN
// or socket opened inside (NS.Do, OpenTUN, ListenUDP), or a process in it.
// Lab.Close kills the commands of NS.Command; close the rest before the
// Lab (a hop or socket made after NewT is closed first by t.Cleanup).
package netlab
