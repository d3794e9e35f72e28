package hostniclab

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/roceinterop"
)

func TestNewcRoundTrip(t *testing.T) {
	files := []File{
		{Name: "extra/job.sh", Mode: 0o755, Data: []byte(JobScript)},
		{Name: "/extra/sub/odd", Mode: 0o644, Data: []byte("abc")},
		{Name: "top", Mode: 0o600},
	}
	var plain bytes.Buffer
	if err := WriteNewc(&plain, files); err != nil {
		t.Fatal(err)
	}
	if plain.Len()%4 != 0 {
		t.Errorf("archive of %d bytes is not 4-byte aligned", plain.Len())
	}
	want := []string{"extra", "extra/job.sh", "extra/sub", "extra/sub/odd", "top"}
	names, _, err := ListNewc(bytes.NewReader(plain.Bytes()))
	if err != nil || !slices.Equal(names, want) {
		t.Fatalf("ListNewc = %q, %v; want %q", names, err, want)
	}
	// A gzip'd archive, as bin/rxe/initramfs.img.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	WriteNewc(zw, []File{{Name: "init", Mode: 0o755, Data: []byte("#!/bin/sh\n")}})
	zw.Close()
	if names, _, err := ListNewc(&gz); err != nil || !slices.Equal(names, []string{"init"}) {
		t.Fatalf("gzip'd: %q, %v", names, err)
	}
	// Two plain archives, one after the other.
	var two bytes.Buffer
	WriteNewc(&two, []File{{Name: "init", Mode: 0o755, Data: []byte("x")}})
	two.Write(plain.Bytes())
	names, _, err = ListNewc(&two)
	if err != nil || !slices.Equal(names, append([]string{"init"}, want...)) {
		t.Fatalf("concatenated: %q, %v", names, err)
	}
	for _, bad := range []string{"..", "../x", "."} {
		if err := WriteNewc(&bytes.Buffer{}, []File{{Name: bad}}); err == nil {
			t.Errorf("WriteNewc(%q): no error", bad)
		}
	}
	if _, _, err := ListNewc(strings.NewReader("070701zz")); err == nil {
		t.Error("ListNewc of a short header: no error")
	}
}

func FuzzListNewc(f *testing.F) {
	var b bytes.Buffer
	WriteNewc(&b, []File{{Name: "a/b", Mode: 0o644, Data: []byte("hi")}})
	f.Add(b.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		ListNewc(bytes.NewReader(data)) // never panics
	})
}

func TestParseCounts(t *testing.T) {
	out := "0: rxe0: pd 2 cq 3 qp 2 cm_id 0 mr 1 ctx 1 srq 0\n1: other: pd 9\n"
	c, ok := ParseCounts(out, "rxe0")
	want := Counts{"pd": 2, "cq": 3, "qp": 2, "cm_id": 0, "mr": 1, "ctx": 1, "srq": 0}
	if !ok || !c.Equal(want) {
		t.Fatalf("ParseCounts = %v, %t; want %v", c, ok, want)
	}
	if _, ok := ParseCounts(out, "rxe1"); ok {
		t.Error("rxe1 found")
	}
	base := Counts{"pd": 1, "cq": 3, "qp": 1, "cm_id": 0, "mr": 0, "ctx": 0, "srq": 0}
	if got := strings.Join(c.Above(base), ", "); got != "ctx +1, mr +1, pd +1, qp +1" {
		t.Errorf("Above = %q", got)
	}
	mrs := ParseMRs("dev rxe0 mrn 3 rkey 0x1 lkey 0x1 mrlen 4096 pdn 2 pid 7 comm vrdmad\ndev rxe1 mrn 1\n", "rxe0")
	if len(mrs) != 1 || !strings.Contains(mrs[0], "comm vrdmad") {
		t.Errorf("ParseMRs = %q", mrs)
	}
}

func TestRNICArgs(t *testing.T) {
	for _, c := range []struct {
		rnic, dev, rxe string
		ok             bool
	}{
		{"soft", "", "off", true}, {"verbs:rxe0", "rxe0", "on", true}, {"verbs:rxe0:1", "rxe0", "on", true},
		{"verbs:", "", "", false}, {"hard", "", "", false}, {"verbs:a/b", "", "", false},
	} {
		_, dev, rxe, err := RNICArgs(c.rnic)
		if (err == nil) != c.ok || dev != c.dev || rxe != c.rxe {
			t.Errorf("RNICArgs(%q) = %q, %q, %v", c.rnic, dev, rxe, err)
		}
	}
}

// TestExpect checks the model on a write job against a memory built by
// hand.
func TestExpect(t *testing.T) {
	job, err := roceinterop.ParseJob("write_bw:16:5")
	if err != nil {
		t.Fatal(err)
	}
	mem := func(n int, seed byte) []byte {
		m := make([]byte, n)
		for i := range m {
			m[i] = roceinterop.Fill(seed, i)
		}
		return m
	}
	s, c := mem(128, seedServer), mem(128, seedClient)
	copy(s[:16], c[64:80])
	sum := func(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }
	gs, gc, err := Expect(job, ClientResult{MemLen: 128, Seed: seedServer}, ClientResult{MemLen: 128, Seed: seedClient})
	if err != nil || gs != sum(s) || gc != sum(c) {
		t.Errorf("Expect = %s, %s, %v", gs, gc, err)
	}
	if _, _, err := Expect(job, ClientResult{MemLen: 8}, ClientResult{MemLen: 8}); err == nil {
		t.Error("Expect with tiny memories: no error")
	}
}
