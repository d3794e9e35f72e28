package main

import (
	"fmt"
	"io"
	"strings"
)

// perftest's output, copied from perftest 4.5 (Debian 12's perftest
// 4.5+0.17: src/perftest_parameters.h and ctx_print_test_info in
// src/perftest_parameters.c). testdata/ holds real ib_*_bw and ib_*_lat
// output the tests compare the table against.
const (
	resultLine = "---------------------------------------------------------------------------------------\n"
	// RESULT_FMT, RESULT_FMT_G, RESULT_FMT_LAT, RESULT_FMT_LAT_DUR.
	resultFmt       = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
	resultFmtG      = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
	resultFmtLat    = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
	resultFmtLatDur = " #bytes        #iterations       t_avg[usec]    tps average"
	// REPORT_FMT, REPORT_FMT_EXT (Gb/sec below 0.1), REPORT_FMT_LAT,
	// REPORT_FMT_LAT_DUR; each followed by REPORT_EXT, "\n".
	reportFmt       = " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n"
	reportFmtExt    = " %-7d    %d           %-7.6f            %-7.6f            %-7.6f\n"
	reportFmtLat    = " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n"
	reportFmtLatDur = " %-7d       %d            %-7.2f        %-7.2f\n"
	// The test parameters' indent.
	bannerIndent = "                    "
)

// Bandwidth units: MB/sec is perftest's 0x100000 bytes a second, Gb/sec
// 10^9 bits (its format_factor).
const (
	mbPerSec   = 0x100000
	gbitPerSec = 125000000
)

// qpAddr is one QP's line of perftest's address block.
type qpAddr struct {
	lid, qpn, psn, rkey uint32
	vaddr               uint64
	gid                 [16]byte
}

// testInfo is what the header shows besides the options.
type testInfo struct {
	device        string
	linkLayer     uint32 // ibv_link_layer: 1 InfiniBand, 2 Ethernet
	mtu, outReads int
	inline        int // max inline data
	local, remote []qpAddr
	exchange      string // how the sides exchanged their QPs: "Ethernet" (TCP, as perftest), or "" for in-process
}

// reporter prints perftest's table, or with --output only the figure it
// names, one per size (perftest's "%lf\n").
type reporter struct {
	w  io.Writer
	o  *options
	ti testInfo
}

func newReporter(w io.Writer, o *options, ti testInfo) *reporter {
	return &reporter{w: w, o: o, ti: ti}
}

// cHex formats v as C's printf("%#0*x", width, v): "0x" and zero padding
// to width characters in all, but no "0x" for zero.
func cHex(v uint64, width int) string {
	if v == 0 {
		return strings.Repeat("0", width)
	}
	return fmt.Sprintf("0x%0*x", max(width-2, 0), v)
}

var testsStr = map[string]string{"send": "Send", "write": "RDMA_Write", "read": "RDMA_Read", "atomic": "Atomic"}

func linkLayerStr(l uint32) string {
	switch l {
	case 0, 1:
		return "IB"
	case 2:
		return "Ethernet"
	}
	return "Unknown"
}

// header prints ctx_print_test_info's block (a client's, with the
// parameters vrdma-perf uses), each QP's addresses and the column header.
func (r *reporter) header() {
	o, ti := r.o, r.ti
	if o.output != "" {
		return
	}
	var b strings.Builder
	b.WriteString(resultLine)
	b.WriteString(bannerIndent + testsStr[o.op] + " ")
	if o.op == "atomic" {
		b.WriteString("FETCH_AND_ADD ")
	}
	switch {
	case o.lat:
		b.WriteString("Latency ")
	case o.bidir:
		b.WriteString("Bidirectional BW ")
	default:
		b.WriteString("BW ")
	}
	b.WriteString("Test\n")
	fmt.Fprintf(&b, " Dual-port       : %s\t\tDevice         : %s\n", "OFF", ti.device)
	fmt.Fprintf(&b, " Number of qps   : %d\t\tTransport type : %s\n", o.qps, "IB")
	fmt.Fprintf(&b, " Connection type : %s\t\tUsing SRQ      : %s\n", "RC", "OFF")
	fmt.Fprintf(&b, " PCIe relax order: %s\n", "Unsupported") // a para-virtual device: no PCIe ordering
	fmt.Fprintf(&b, " ibv_wr* API     : %s\n", "OFF")
	fmt.Fprintf(&b, " TX depth        : %d\n", o.txDepth)
	if o.op == "send" && !o.lat {
		fmt.Fprintf(&b, " RX depth        : %d\n", o.rxDepth)
	}
	if !o.lat {
		fmt.Fprintf(&b, " CQ Moderation   : %d\n", 1) // every work request is signaled
	}
	fmt.Fprintf(&b, " Mtu             : %d[B]\n", ti.mtu)
	fmt.Fprintf(&b, " Link type       : %s\n", linkLayerStr(ti.linkLayer))
	gids := ti.linkLayer == 2 // perftest uses a GID (-x, default 0) on Ethernet, none on InfiniBand
	if gids {
		fmt.Fprintf(&b, " GID index       : %d\n", o.gidIndex)
	}
	if o.op == "read" || o.op == "atomic" {
		fmt.Fprintf(&b, " Outstand reads  : %d\n", ti.outReads)
	} else {
		fmt.Fprintf(&b, " Max inline data : %d[B]\n", ti.inline)
	}
	fmt.Fprintf(&b, " rdma_cm QPs\t : %s\n", "OFF")
	ex := ti.exchange
	if ex == "" {
		ex = "in-process"
	}
	fmt.Fprintf(&b, " Data ex. method : %s\n", ex)
	b.WriteString(resultLine)
	for _, side := range []struct {
		name  string
		addrs []qpAddr
	}{{"local", ti.local}, {"remote", ti.remote}} {
		for _, a := range side.addrs {
			fmt.Fprintf(&b, " %s address: LID %s QPN %s PSN %s", side.name, cHex(uint64(a.lid), 4), cHex(uint64(a.qpn), 6), cHex(uint64(a.psn), 6))
			switch o.op {
			case "read":
				fmt.Fprintf(&b, " OUT %s", cHex(uint64(ti.outReads), 4))
				fallthrough
			case "write":
				fmt.Fprintf(&b, " RKey %s VAddr %s", cHex(uint64(a.rkey), 8), cHex(a.vaddr, 16))
			}
			b.WriteString("\n")
			if gids {
				b.WriteString(" GID: ")
				for i, x := range a.gid {
					if i > 0 {
						b.WriteString(":")
					}
					fmt.Fprintf(&b, "%02d", x)
				}
				b.WriteString("\n")
			}
		}
	}
	b.WriteString(resultLine)
	switch {
	case o.lat && o.duration != 0:
		b.WriteString(resultFmtLatDur)
	case o.lat:
		b.WriteString(resultFmtLat)
	case o.gbits:
		b.WriteString(resultFmtG)
	default:
		b.WriteString(resultFmt)
	}
	b.WriteString("\n")
	io.WriteString(r.w, b.String())
}

// row prints one result row (a *bwResult or a *latResult).
func (r *reporter) row(v any) {
	switch x := v.(type) {
	case *bwResult:
		f := float64(mbPerSec)
		if r.o.gbits {
			f = gbitPerSec
		}
		avg, peak, rate := x.bps/f, x.peak/f, x.mps/1e6
		switch r.o.output {
		case "bandwidth":
			fmt.Fprintf(r.w, "%f\n", avg)
			return
		case "message_rate":
			fmt.Fprintf(r.w, "%f\n", rate)
			return
		}
		format := reportFmt
		if r.o.gbits && avg < 0.1 {
			format = reportFmtExt
		}
		fmt.Fprintf(r.w, format, x.size, x.iters, peak, avg, rate)
	case *latResult:
		if r.o.output == "latency" {
			fmt.Fprintf(r.w, "%f\n", x.avg)
			return
		}
		if x.duration {
			fmt.Fprintf(r.w, reportFmtLatDur, x.size, x.iters, x.avg, x.tps)
			return
		}
		fmt.Fprintf(r.w, reportFmtLat, x.size, x.iters, x.min, x.max, x.typical, x.avg, x.stdev, x.p99, x.p999)
	}
}

// footer closes the table.
func (r *reporter) footer() {
	if r.o.output == "" {
		io.WriteString(r.w, resultLine)
	}
}
