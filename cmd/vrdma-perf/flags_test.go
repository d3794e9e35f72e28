package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/guest/verbs"
	"github.com/vrdma/vrdma/internal/version"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestPerftestFlags: perftest's common flags are accepted with its
// spellings (short, long, clustered, glued), what a vrdma device cannot do
// is refused as "not supported" with exit 1, and a malformed value is bad
// usage (exit 2), each with a message that names the flag.
func TestPerftestFlags(t *testing.T) {
	tests := []struct {
		args  string
		code  int    // 0: parsed
		msg   string // in the error
		check func(o options) string
	}{
		{args: "-d vm1 -i 1 -x 1 -F -s 65536 -n 2000 --report_gbits 10.77.0.1", check: func(o options) string {
			if !o.twoProc || o.devices[0] != "vm1" || o.host != "10.77.0.1" || o.sizes[0] != 65536 || o.iters != 2000 || !o.gbits || o.gidIndex != 1 {
				return fmt.Sprintf("%+v", o)
			}
			return ""
		}},
		{args: "--ib-dev vm1 --ib-port 1 --mtu 1024 --connection RC --inline_size 64 --bidirectional --output bandwidth", check: func(o options) string {
			if o.devices[0] != "vm1" || o.mtu != 1024 || o.inline != 64 || !o.bidir || o.output != "bandwidth" {
				return fmt.Sprintf("%+v", o)
			}
			return ""
		}},
		{args: "--sockets a,b -m 4096 -c RC -I 0 -b", check: func(o options) string {
			if o.mtu != 4096 || !o.bidir || o.twoProc {
				return fmt.Sprintf("%+v", o)
			}
			return ""
		}},
		{args: "-d a,b -s4096 -n50 -q2 -aFb", code: exitUsage, msg: "-a (--all) and -s (--size) exclude each other"},
		{args: "-d a,b -n50 -q2 -abF", check: func(o options) string {
			if len(o.sizes) != maxAllShift || o.iters != 50 || o.qps != 2 || !o.bidir || o.twoProc || o.devices[1] != "b" {
				return fmt.Sprintf("%+v", o)
			}
			return ""
		}},
		{args: "--sockets a,b --op send", check: func(o options) string {
			if sq, rq := queueDepths(&o); o.rxDepth != defaultRxDepth || sq != defaultTxDepthBW+2 || rq != defaultRxDepth+2 {
				return fmt.Sprintf("rx depth %d, queues %d/%d", o.rxDepth, sq, rq)
			}
			return ""
		}},
		{args: "--sockets a,b --op send -r 64 -t 32", check: func(o options) string {
			if sq, rq := queueDepths(&o); o.rxDepth != 64 || sq != 34 || rq != 66 {
				return fmt.Sprintf("rx depth %d, queues %d/%d", o.rxDepth, sq, rq)
			}
			return ""
		}},
		{args: "--sockets a,b --op write -r 64", check: func(o options) string {
			if _, rq := queueDepths(&o); rq != defaultTxDepthBW+2 { // no receives to keep posted
				return fmt.Sprintf("receive queue %d", rq)
			}
			return ""
		}},
		{args: "--sockets a,b --op send -r 5000", code: exitUsage, msg: "-r 5000"},
		{args: "--sockets a,b --op write_lat --output latency", check: func(o options) string {
			if o.output != "latency" || !o.lat {
				return fmt.Sprintf("%+v", o)
			}
			return ""
		}},
		{args: "-socket a", check: func(o options) string { // Go's one-dash long flags stay what they were
			if o.socket != "a" || !o.twoProc {
				return fmt.Sprintf("%+v", o)
			}
			return ""
		}},
		// perftest's options a vrdma device cannot run: exit 1.
		{args: "--sockets a,b -c UD", code: exitFailure, msg: "not supported: -c UD: vrdma-perf runs RC QPs only"},
		{args: "--sockets a,b -c UC", code: exitFailure, msg: "not supported: -c UC"},
		{args: "--sockets a,b --connection XRC", code: exitFailure, msg: "not supported: -c XRC"},
		{args: "--sockets a,b -c DC", code: exitFailure, msg: "not supported: -c DC"},
		{args: "--sockets a,b -R", code: exitFailure, msg: "not supported: -R (rdma_cm): vrdma-perf connects through its own TCP exchange; rdma_cm runs in guests with the standard stack"},
		{args: "-d vm1 --rdma_cm 10.0.0.1", code: exitFailure, msg: "rdma_cm runs in guests"},
		{args: "--sockets a,b -i 2", code: exitFailure, msg: "not supported: -i 2: a vrdma device has one port, 1"},
		// Bad usage: exit 2.
		{args: "--sockets a,b -c TCP", code: exitUsage, msg: `-c "TCP": want RC`},
		{args: "--sockets a,b -i 0", code: exitUsage, msg: "-i 0: want 1"},
		{args: "--sockets a,b -m 9000", code: exitUsage, msg: "-m 9000: want 256, 512, 1024, 2048 or 4096"},
		{args: "--sockets a,b -m 100", code: exitUsage, msg: "-m 100"},
		{args: "--sockets a,b -I 1025", code: exitUsage, msg: "-I 1025: want 0 … 1024"},
		{args: "--sockets a,b -I 64 --op read", code: exitUsage, msg: "-I: inline data only in write and send tests"},
		{args: "--sockets a,b -I 8 --op atomic_lat", code: exitUsage, msg: "-I: inline data only in write and send tests"},
		{args: "--sockets a,b -b --op send_lat", code: exitUsage, msg: "-b: bidirectional runs are bandwidth tests"},
		{args: "--sockets a,b --output latency", code: exitUsage, msg: "--output latency: a bandwidth test's figures are bandwidth and message_rate"},
		{args: "--sockets a,b --op read_lat --output bandwidth", code: exitUsage, msg: "a latency test's figure is latency"},
		{args: "--sockets a,b --output fast", code: exitUsage, msg: `--output "fast": want bandwidth, message_rate or latency`},
		{args: "--sockets a,b --output bandwidth --json", code: exitUsage, msg: "--output and --json exclude each other"},
		{args: "-d a,b,c", code: exitUsage, msg: "-d \"a,b,c\": want one device ID"},
		{args: "-d a, 10.0.0.1", code: exitUsage, msg: "-d \"a,\""},
		{args: "-d a,b 10.0.0.1", code: exitUsage, msg: "unexpected arguments"},
		{args: "-F", code: exitUsage, msg: "give --sockets S1,S2 or -d ID1,ID2"},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			o, err := parseFlags(strings.Fields(tt.args))
			if tt.code == 0 {
				if err != nil {
					t.Fatalf("got error %v", err)
				}
				if d := tt.check(o); d != "" {
					t.Errorf("parsed wrong: %s", d)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got error %v, want one containing %q", err, tt.msg)
			}
			// The command's exit status and message.
			_, errs, code := perf(t, strings.Fields(tt.args)...)
			if code != tt.code || !strings.Contains(errs, tt.msg) || !strings.HasPrefix(errs, "vrdma-perf: ") {
				t.Errorf("got exit %d, %q; want %d and %q", code, errs, tt.code, tt.msg)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	for _, flag := range []string{"--version", "-V"} {
		out, errs, code := perf(t, flag)
		if want := "vrdma-perf " + version.String() + "\n"; code != 0 || out != want || errs != "" {
			t.Errorf("%s: got exit %d, %q, %q; want 0 and %q", flag, code, out, errs, want)
		}
	}
}

// TestLinkFor: -m is lowered to the port's active MTU (perftest's
// message), -I is cut to the device's max_inline_data (perftest's
// message) or refused as not supported on a device without inline data.
func TestLinkFor(t *testing.T) {
	port := abi.PortAttr{ActiveMTU: abi.MTU1024}
	tests := []struct {
		mtu, inline, devInline int
		wantMTU                uint32
		wantInline             int
		note                   string
		unsup                  bool
	}{
		{0, 0, 256, abi.MTU1024, 0, "", false},
		{512, 64, 256, abi.MTU512, 64, "", false},
		{4096, 0, 256, abi.MTU1024, 0, "Requested mtu is higher than active mtu \nChanging to active mtu - 1024", false},
		{0, 1000, 256, abi.MTU1024, 256, "  Actual inline-size(256) < requested inline-size(1000)", false},
		{0, 16, 0, 0, 0, "", true},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.mtu)+"/"+strconv.Itoa(tt.inline), func(t *testing.T) {
			o := &options{mtu: tt.mtu, inline: tt.inline}
			p, err := linkParamsFor(o, port, tt.devInline)
			var ue *unsupportedError
			if tt.unsup {
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), "no inline data") {
					t.Errorf("got %v, want not supported", err)
				}
				return
			}
			if err != nil || p.mtu != tt.wantMTU || p.inline != tt.wantInline || strings.Join(p.notes, "|") != tt.note {
				t.Errorf("got %+v, %v; want MTU code %d, inline %d, note %q", p, err, tt.wantMTU, tt.wantInline, tt.note)
			}
		})
	}
}

// TestWCStatusNames: failed completions name their status as libibverbs
// does.
func TestWCStatusNames(t *testing.T) {
	for _, tt := range []struct {
		s    abi.WCStatus
		want string
	}{
		{abi.WCRetryExcErr, "IBV_WC_RETRY_EXC_ERR"}, {abi.WCRemAccessErr, "IBV_WC_REM_ACCESS_ERR"},
		{abi.WCRNRRetryExcErr, "IBV_WC_RNR_RETRY_EXC_ERR"}, {abi.WCWRFlushErr, "IBV_WC_WR_FLUSH_ERR"},
		{abi.WCLocLenErr, "IBV_WC_LOC_LEN_ERR"}, {abi.WCStatus(99), "status 99"},
	} {
		if got := wcStatusName(tt.s); got != tt.want {
			t.Errorf("status %d: got %q, want %q", tt.s, got, tt.want)
		}
	}
	wc := &verbs.WC{WRID: wridRecv | 2<<wridShift | 17, Status: abi.WCRemAccessErr, VendorErr: 0x31}
	want := "server: qp 2: receive 17 completed with error IBV_WC_REM_ACCESS_ERR (status 10, vendor error 0x31)"
	if got := wcErr("server", wc).Error(); got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestLastInSlot: the responder's check of a two-process write finds, for
// each buffer, the last operation of the size that used it.
func TestLastInSlot(t *testing.T) {
	for _, tt := range []struct {
		from, to, k, slots, want uint64
		ok                       bool
	}{
		{0, 10, 0, 4, 8, true}, {0, 10, 1, 4, 9, true}, {0, 10, 2, 4, 6, true}, {0, 10, 3, 4, 7, true},
		{0, 3, 3, 4, 0, false},                          // fewer operations than buffers
		{8, 10, 0, 4, 8, true}, {8, 10, 2, 4, 0, false}, // an earlier size's operations do not count
		{0, 0, 0, 4, 0, false}, {5, 5, 1, 4, 0, false}, // none
		{0, 1, 0, 1, 0, true}, {0, 10, 4, 4, 0, false}, // one buffer; no such buffer
	} {
		got, ok := lastInSlot(tt.from, tt.to, tt.k, tt.slots)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("lastInSlot(%d, %d, %d, %d): got %d, %v; want %d, %v", tt.from, tt.to, tt.k, tt.slots, got, ok, tt.want, tt.ok)
		}
	}
}
