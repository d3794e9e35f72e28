package guestvm

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/vrdma/vrdma/vmm/qemu"
)

func validConfig() Config {
	return Config{QEMU: "/q", Kernel: "/k", Initrd: "/i", Run: "client",
		Args: []string{"--op", "write", "--size", "65536"}}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Config)
		field string // "" = valid
	}{
		{"valid", func(*Config) {}, ""},
		{"no qemu", func(c *Config) { c.QEMU = "" }, "QEMU"},
		{"no kernel", func(c *Config) { c.Kernel = "" }, "Kernel"},
		{"no initrd", func(c *Config) { c.Initrd = "" }, "Initrd"},
		{"no run", func(c *Config) { c.Run = "" }, "Run"},
		{"run with space", func(c *Config) { c.Run = "a b" }, "Run"},
		{"run with equals", func(c *Config) { c.Run = "a=b" }, "Run"},
		{"bad name", func(c *Config) { c.Name = "a/b" }, "Name"},
		{"arg with comma", func(c *Config) { c.Args = []string{"a,b"} }, "Args[0]"},
		{"arg with space", func(c *Config) { c.Args = []string{"x", "a b"} }, "Args[1]"},
		{"arg with quote", func(c *Config) { c.Args = []string{`"x`} }, "Args[0]"},
		{"arg with newline", func(c *Config) { c.Args = []string{"x\n"} }, "Args[0]"},
		{"arg with non-ascii", func(c *Config) { c.Args = []string{"é"} }, "Args[0]"},
		{"empty arg", func(c *Config) { c.Args = []string{""} }, "Args[0]"},
		{"too many args", func(c *Config) { c.Args = strings.Split(strings.Repeat("abcdefgh ", 300), " ")[:300] }, "Args"},
		{"negative hugepages", func(c *Config) { c.HugePages = -1 }, "HugePages"},
		{"hugepages exceed ram", func(c *Config) { c.MemoryMiB = 256; c.HugePages = 128 }, "HugePages"},
		{"negative memory", func(c *Config) { c.MemoryMiB = -1 }, "MemoryMiB"},
		{"append newline", func(c *Config) { c.Append = "a\nb" }, "Append"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.edit(&c)
			err := c.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("got %v, want a *ConfigError", err)
			}
			if ce.Field != tt.field {
				t.Fatalf("got field %q, want %q (%v)", ce.Field, tt.field, err)
			}
		})
	}
}

func TestAppendLine(t *testing.T) {
	c := validConfig()
	c.Append = "loglevel=7"
	got := c.withDefaults().appendLine()
	want := "console=ttyS0 quiet panic=-1 no_timer_check vrdma.console=ttyS1 vrdma.hugepages=64 vrdma.run=client vrdma.args=--op,write,--size,65536 loglevel=7"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	c.Args = nil
	c.HugePages = 8
	c.Append = ""
	got = c.withDefaults().appendLine()
	want = "console=ttyS0 quiet panic=-1 no_timer_check vrdma.console=ttyS1 vrdma.hugepages=8 vrdma.run=client"
	if got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestClassify(t *testing.T) {
	tests := []struct {
		line    string
		kind    Kind
		payload string
	}{
		{`VRDMA-RESULT {"a":1}`, KindResult, `{"a":1}`},
		{`VRDMA-RESULT  {"a":1} `, KindResult, `{"a":1}`},
		{`VRDMA-RESULTS {"a":1}`, KindOther, `VRDMA-RESULTS {"a":1}`},
		{`VRDMA-EXCHANGE {"qpn":3}`, KindExchange, `{"qpn":3}`},
		{`VRDMA-PEER {}`, KindPeer, `{}`},
		{`VRDMA-ERROR no device found`, KindError, `no device found`},
		{`VRDMA-ERROR`, KindError, ``},
		{`VRDMA-EXIT 0`, KindExit, `0`},
		{`VRDMA-INIT 6.1.0`, KindInit, `6.1.0`},
		{`[    1.0] random kernel line`, KindOther, `[    1.0] random kernel line`},
		{``, KindOther, ``},
		{` VRDMA-EXIT 0`, KindOther, ` VRDMA-EXIT 0`},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			k, p := Classify(tt.line)
			if k != tt.kind || p != tt.payload {
				t.Fatalf("got (%d, %q), want (%d, %q)", k, p, tt.kind, tt.payload)
			}
		})
	}
}

func TestParseResult(t *testing.T) {
	r, err := ParseResult(`{"role":"client","op":"write","size":65536,"iters":10,"gbytes_per_s":1.5,"mops":0.02,"lat_us_p50":3.5,"lat_us_p99":9,"verified":true,"extra":[1,2]}`)
	if err != nil {
		t.Fatal(err)
	}
	want := Result{Role: "client", Op: "write", Size: 65536, Iters: 10, GBytesPerS: 1.5, Mops: 0.02, LatP50: 3.5, LatP99: 9, Verified: true}
	r2 := r
	r2.Raw = nil
	if r2.Role != want.Role || r2.Op != want.Op || r2.Size != want.Size || r2.Iters != want.Iters ||
		r2.GBytesPerS != want.GBytesPerS || r2.Mops != want.Mops || r2.LatP50 != want.LatP50 || r2.LatP99 != want.LatP99 || !r2.Verified {
		t.Fatalf("got %+v, want %+v", r2, want)
	}
	if !strings.Contains(string(r.Raw), `"extra":[1,2]`) {
		t.Fatalf("got raw %s, want every key kept", r.Raw)
	}
	for _, bad := range []string{``, `[]`, `"x"`, `{`, `{"size":-1}`, `{"verified":"yes"}`, `{} {}`, `{"iters":1e99}`, `null`} {
		t.Run(bad, func(t *testing.T) {
			r, err := ParseResult(bad)
			if err == nil {
				t.Fatalf("got nil error, want one")
			}
			if r.Role != "" || r.Raw != nil || r.Verified || r.Size != 0 {
				t.Fatalf("got %+v on error, want zero", r)
			}
		})
	}
}

func TestParseExit(t *testing.T) {
	tests := []struct {
		in   string
		code int
		ok   bool
	}{
		{"0", 0, true}, {"1", 1, true}, {" 255 ", 255, true}, {"256", 0, false}, {"-1", 0, false},
		{"+1", 0, false}, {"", 0, false}, {"x", 0, false}, {"0001", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			code, err := ParseExit(tt.in)
			if (err == nil) != tt.ok || code != tt.code {
				t.Fatalf("got (%d, %v), want (%d, ok=%v)", code, err, tt.code, tt.ok)
			}
		})
	}
}

func TestReadLines(t *testing.T) {
	long := strings.Repeat("x", maxLine+100)
	in := "a\r\nb\x00c\n" + long + "\nlast"
	l := newLineLog()
	readLines(strings.NewReader(in), l)
	var got []string
	for i := 0; ; {
		s, n, err := l.next(context.Background(), nil, i)
		if errors.Is(err, errLogClosed) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got, i = append(got, s), n
	}
	if len(got) != 4 || got[0] != "a" || got[1] != "bc" || got[3] != "last" {
		t.Fatalf("got %q", got)
	}
	if len(got[2]) > maxLine+20 || !strings.HasSuffix(got[2], "[line cut]") {
		t.Fatalf("got a %d-byte long line, want it cut at %d", len(got[2]), maxLine)
	}
}

func TestLineLogBounded(t *testing.T) {
	l := newLineLog()
	line := strings.Repeat("y", 1<<20)
	for range 40 {
		l.append(line)
	}
	l.mu.Lock()
	size, dropped := l.size, l.dropped
	l.mu.Unlock()
	if size > maxLog || dropped == 0 {
		t.Fatalf("got %d bytes kept and %d dropped, want at most %d kept", size, dropped, maxLog)
	}
	// A cursor behind the dropped lines skips to the oldest kept one.
	s, n, err := l.next(context.Background(), nil, 0)
	if err != nil || s != line || n != dropped+1 {
		t.Fatalf("got (%d bytes, %d, %v), want the oldest kept line", len(s), n, err)
	}
}

// fakeGuest is a Guest without QEMU whose console is the given text.
func fakeGuest(console string) *Guest {
	g := &Guest{name: "g", line: newLineLog(), done: make(chan struct{})}
	readLines(strings.NewReader(console), g.line)
	return g
}

func TestWaitResult(t *testing.T) {
	tests := []struct {
		name     string
		console  string
		results  int
		sentinel error // nil = success
		msg      string
	}{
		{"success", "VRDMA-INIT 6.1\nVRDMA-RESULT {\"role\":\"probe\",\"verified\":true}\nVRDMA-EXIT 0\n", 1, nil, ""},
		{"stops at exit", "VRDMA-RESULT {}\nVRDMA-EXIT 0\nVRDMA-ERROR later\n", 1, nil, ""},
		{"error line", "VRDMA-ERROR no device found\nVRDMA-EXIT 1\n", 0, ErrGuestFailed, "no device found"},
		{"error and exit 0", "VRDMA-ERROR odd\nVRDMA-EXIT 0\n", 0, ErrGuestFailed, "odd"},
		{"bad exit code", "VRDMA-EXIT 3\n", 0, ErrGuestFailed, "exit 3"},
		{"unparsable exit", "VRDMA-EXIT x\n", 0, ErrGuestFailed, "unparsable VRDMA-EXIT"},
		{"bad result", "VRDMA-RESULT {oops\nVRDMA-EXIT 0\n", 0, ErrGuestFailed, "unparsable VRDMA-RESULT"},
		{"gone", "VRDMA-INIT 6.1\nVRDMA-RESULT {}\n", 1, ErrGuestGone, "console closed before VRDMA-EXIT"},
		{"gone with error", "VRDMA-ERROR peer vanished\n", 0, ErrGuestGone, "peer vanished"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := fakeGuest(tt.console)
			res, err := g.WaitResult(context.Background())
			if len(res) != tt.results {
				t.Errorf("got %d results, want %d", len(res), tt.results)
			}
			if tt.sentinel == nil {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			var ge *GuestError
			if !errors.Is(err, tt.sentinel) || !errors.As(err, &ge) {
				t.Fatalf("got %v, want a *GuestError matching %v", err, tt.sentinel)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("got %q, want it to hold %q", err, tt.msg)
			}
		})
	}
}

func TestWaitResultContext(t *testing.T) {
	g := &Guest{name: "g", line: newLineLog(), done: make(chan struct{})}
	g.line.append(`VRDMA-RESULT {"role":"server"}`)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	res, err := g.WaitResult(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || len(res) != 1 {
		t.Fatalf("got (%d results, %v), want 1 result and the deadline", len(res), err)
	}
}

func TestLinesIndependentReaders(t *testing.T) {
	pr, pw := io.Pipe()
	g := &Guest{name: "g", line: newLineLog(), done: make(chan struct{})}
	go readLines(pr, g.line)
	a, b := g.Lines(), g.Lines()
	go func() {
		io.WriteString(pw, "one\ntwo\n")
		pw.Close()
	}()
	for _, ch := range []<-chan string{a, b} {
		var got []string
		for s := range ch {
			got = append(got, s)
		}
		if strings.Join(got, ",") != "one,two" {
			t.Fatalf("got %q, want [one two]", got)
		}
	}
	// A reader that stops reading is released by Close (g.done).
	pr2, pw2 := io.Pipe()
	defer pw2.Close()
	g2 := &Guest{name: "g", line: newLineLog(), done: make(chan struct{})}
	go readLines(pr2, g2.line)
	ch := g2.Lines()
	close(g2.done)
	select {
	case _, ok := <-ch:
		for ok {
			_, ok = <-ch
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lines did not end when the guest was closed")
	}
}

func TestGuestErrorIs(t *testing.T) {
	tests := []struct {
		e          GuestError
		gone, fail bool
	}{
		{GuestError{ExitCode: -1}, true, false},
		{GuestError{ExitCode: -1, Messages: []string{"x"}}, true, true},
		{GuestError{ExitCode: 1}, false, true},
		{GuestError{ExitCode: 0, Messages: []string{"x"}}, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.e.Error(), func(t *testing.T) {
			if got := errors.Is(&tt.e, ErrGuestGone); got != tt.gone {
				t.Errorf("Is(ErrGuestGone): got %v, want %v", got, tt.gone)
			}
			if got := errors.Is(&tt.e, ErrGuestFailed); got != tt.fail {
				t.Errorf("Is(ErrGuestFailed): got %v, want %v", got, tt.fail)
			}
		})
	}
}

func TestBootRejectsBadConfigWithoutQEMU(t *testing.T) {
	c := validConfig()
	c.Args = []string{"a,b"}
	c.Devices = []qemu.VhostUserDevice{{ID: "d", Socket: "/nonexistent"}}
	g, err := Boot(context.Background(), c)
	if g != nil || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("got (%v, %v), want (nil, ErrInvalidConfig)", g, err)
	}
}
