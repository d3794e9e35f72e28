package main

import (
	"fmt"
	"io"
	"strings"
)

// usage prints the help text: generated from the flag definitions, in the
// form help2man turns into the manual page.
func usage(w io.Writer) {
	fs := newFlagSet(&options{}, &rawFlags{})
	fmt.Fprint(w, `Usage: vrdma-perf --sockets S1,S2 | -d ID1,ID2 [OPTIONS]
       vrdma-perf --socket S | -d ID [OPTIONS]          (server)
       vrdma-perf --socket S | -d ID [OPTIONS] HOST     (client)

Measure vrdma devices as perftest measures RNICs: open them on a running
vrdmad as virtio-user front-ends, connect RC QPs and run ib_write_bw,
ib_read_bw, ib_send_bw, ib_atomic_bw or a latency test (ib_write_lat,
ib_send_lat, ib_read_lat, ib_atomic_lat), printing perftest's table.
perftest's flags keep their spelling, meaning and defaults, so its command
lines run as they are. With --sockets (or -d ID1,ID2) one process runs both
sides; with --socket (or -d ID) it runs one side, as perftest's server (no
HOST) or client (HOST), exchanging QPNs, PSNs, GID, rkey and buffer over
TCP (--port). Devices named with -d are looked up in vrdmad's control API.

Options:
`)
	for _, d := range flagDocs {
		var names []string
		for _, n := range d.names {
			if len(n) == 1 {
				names = append(names, "-"+n)
			} else {
				names = append(names, "--"+n)
			}
		}
		head := strings.Join(names, ", ")
		if d.arg != "" {
			head += " " + d.arg
		}
		help := "print this help and exit"
		if f := fs.Lookup(d.names[len(d.names)-1]); f != nil {
			help = f.Usage
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
				help += " (default " + f.DefValue + ")"
			}
		}
		fmt.Fprintf(w, "  %s\n      %s\n", head, help)
	}
	fmt.Fprint(w, `
Bandwidth is measured from the first post to the last completion (perftest's
BW average). BW peak is perftest's: the message size over the least time per
operation of any run of consecutive operations, from the post of its first
to the completion of its last (0 with -D or beyond 20000 iterations, as
perftest). Latency tests run one operation at a time on one QP: write_lat
and send_lat ping-pong between the two devices and report half the round
trip, read_lat and atomic_lat the time from post to completion, as perftest
does. A failed work completion is reported with its status's name
(IBV_WC_RETRY_EXC_ERR, IBV_WC_REM_ACCESS_ERR, ...).

Exit status: 0 success; 1 failure (a device, a work completion, --verify,
the peer) or a perftest option a vrdma device does not support (-c UC, UD,
XRC or DC, -R, -i 2, -I on a device without inline data); 2 bad usage.

Examples:
  vrdma-perf --sockets /run/vrdma/a.sock,/run/vrdma/b.sock -s 65536 -D 5 --report_gbits
  vrdma-perf -d vm1,vm2 --op read -a -F
  vrdma-perf --sockets A,B --op write_lat -s 64 -n 10000
  vrdma-perf --sockets A,B --op send -q 4 -b --verify --json
  vrdma-perf -d vm2 -i 1 -F -s 65536 -n 2000 --report_gbits             # server
  vrdma-perf -d vm1 -i 1 -F -s 65536 -n 2000 --report_gbits 127.0.0.1   # client
`)
}
