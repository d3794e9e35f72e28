package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseInterop(t *testing.T) {
	testParse(t, parseInterop, []parseCase[interopFlags]{
		{nil, interopFlags{op: "write", size: 65536, iters: 64}, true},
		{[]string{"--op", "atomic"}, interopFlags{op: "atomic", size: 8, iters: 200}, true},
		{[]string{"--op", "write_lat", "--reverse"}, interopFlags{op: "write_lat", size: 64, iters: 200, reverse: true}, true},
		{[]string{"--op", "read", "--size", "4096", "--iters", "10", "--pcap", "x.pcap"},
			interopFlags{op: "read", size: 4096, iters: 10, pcap: "x.pcap"}, true},
		{[]string{"--op", "send", "--reverse", "--tshark", "/t"}, interopFlags{op: "send", size: 65536, iters: 64, reverse: true, tshark: "/t"}, true},
		{[]string{"--op", "atomic", "--size", "16"}, interopFlags{}, false},
		{[]string{"--op", "read_lat"}, interopFlags{}, false},
		{[]string{"--iters", "4"}, interopFlags{}, false},
		{[]string{"--size", "-1"}, interopFlags{}, false},
		{[]string{"--size", "65536", "--iters", "100000"}, interopFlags{}, false}, // 6.5 GB
		{[]string{"extra"}, interopFlags{}, false},
		{[]string{"--bogus"}, interopFlags{}, false},
	})
}

func TestInteropUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"interop", "--help"}, &out, &errOut); code != 0 {
		t.Fatalf("interop --help: exit %d, want 0", code)
	}
	if !strings.Contains(errOut.String()+out.String(), "--reverse") {
		t.Fatalf("interop --help does not describe --reverse:\n%s%s", out.String(), errOut.String())
	}
	if code := run([]string{"interop", "--op", "nop"}, &out, &errOut); code != 2 {
		t.Fatalf("interop --op nop: exit %d, want 2", code)
	}
}
