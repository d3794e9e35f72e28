package cli

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/version"
)

// testFlags is a flag set with one flag of each kind the programs use.
func testFlags() *flag.FlagSet {
	fs := New("prog")
	fs.Uint("max-qps", 0, "most QPs (0: the default)")
	fs.Bool("json", false, "print JSON")
	fs.String("control", "/run/vrdma/control.sock", "the control socket `PATH`")
	var size int
	fs.IntVar(&size, "s", 65536, "message size")
	fs.IntVar(&size, "size", 65536, "message size")
	fs.Func("address", "assign `ADDR`", func(string) error { return errors.New("not an address") })
	return fs
}

func TestParseErrorGNU(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--frob"}, "unknown option --frob"},
		{[]string{"-frob"}, "unknown option --frob"},
		{[]string{"-x"}, "unknown option -x"},
		{[]string{"--max-qps", "many"}, `--max-qps: invalid value "many": parse error`},
		{[]string{"--max-qps=-1"}, `--max-qps: invalid value "-1": parse error`},
		{[]string{"-s", "big"}, `-s: invalid value "big": parse error`},
		{[]string{"--json=maybe"}, `--json: invalid boolean value "maybe": parse error`},
		{[]string{"--control"}, "option --control needs a value"},
		{[]string{"--address", "x"}, `--address: invalid value "x": not an address`},
		{[]string{"---json"}, "bad option syntax: ---json"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			err := Parse(testFlags(), tt.args)
			if err == nil {
				t.Fatal("no error")
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if !errors.Is(err, ErrUsage) {
				t.Errorf("%v does not match ErrUsage", err)
			}
			if strings.Contains(err.Error(), " -max") || strings.Contains(err.Error(), "flag ") {
				t.Errorf("%q still has the flag package's spelling", err)
			}
		})
	}
	if err := Parse(testFlags(), []string{"--help"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("--help: got %v, want flag.ErrHelp", err)
	}
	if err := Parse(testFlags(), []string{"--json", "--size=4"}); err != nil {
		t.Errorf("good flags: %v", err)
	}
}

func TestPrintDefaults(t *testing.T) {
	var b bytes.Buffer
	PrintDefaults(&b, testFlags())
	got := b.String()
	for _, want := range []string{
		"  --max-qps N\n      most QPs (0: the default)\n",
		"  --json\n      print JSON\n",
		"  --control PATH\n      the control socket PATH (default: /run/vrdma/control.sock)\n",
		"  -s, --size N\n      message size (default: 65536)\n",
		"  --address ADDR\n      assign ADDR\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("help lacks %q:\n%s", want, got)
		}
	}
	for _, line := range strings.Split(got, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "-") && !strings.HasPrefix(line, "  --") && !strings.HasPrefix(line, "  -s,") {
			t.Errorf("flag line %q is not GNU", line)
		}
		if len(line) > helpWidth {
			t.Errorf("line of %d columns: %q", len(line), line)
		}
	}
	if strings.Count(got, "--size") != 1 {
		t.Errorf("alias listed twice:\n%s", got)
	}
}

func TestWrap(t *testing.T) {
	long := strings.Repeat("word ", 40)
	for _, l := range wrap(long, 30) {
		if len(l) > 30 {
			t.Errorf("line %q longer than 30", l)
		}
	}
	if got := wrap("a-very-long-unbreakable-token", 5); len(got) != 1 {
		t.Errorf("got %q, want the token alone", got)
	}
}

func TestInterleaved(t *testing.T) {
	tests := []struct {
		args []string
		pos  string
		json bool
	}{
		{[]string{"vm1", "--json"}, "vm1", true},
		{[]string{"--json", "vm1"}, "vm1", true},
		{[]string{"vm1", "vm2", "--json", "vm3"}, "vm1 vm2 vm3", true},
		{[]string{"vm1", "--", "--json"}, "vm1 --json", false},
		{[]string{"--", "-x"}, "-x", false},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			fs := testFlags()
			pos, err := Interleaved(fs, tt.args)
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(pos, " "); got != tt.pos {
				t.Errorf("positional %q, want %q", got, tt.pos)
			}
			if got := fs.Lookup("json").Value.String() == "true"; got != tt.json {
				t.Errorf("json %v, want %v", got, tt.json)
			}
		})
	}
	if _, err := Interleaved(testFlags(), []string{"vm1", "--frob"}); err == nil || err.Error() != "unknown option --frob" {
		t.Errorf("got %v, want unknown option --frob", err)
	}
}

func TestHoist(t *testing.T) {
	tests := []struct {
		args, want string
	}{
		{"device ls --control /x", "--control /x device ls"},
		{"device ls --control=/x --json", "--control=/x --json device ls"},
		{"--json device --control /x ls", "--json --control /x device ls"},
		{"--control /a device ls --control /b", "--control /a --control /b device ls"},
		{"device add vm1 --weight 4 --json", "--json device add vm1 --weight 4"},
		{"device add vm1 -- --json", "device add vm1 -- --json"},
		{"-- device --json", "-- device --json"},
		{"raw --json", "raw --json"},
		{"--json", "--json"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.args, func(t *testing.T) {
			got := strings.Join(Hoist(testFlags(), strings.Fields(tt.args), "raw"), " ")
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestExit(t *testing.T) {
	tests := []struct {
		err          error
		code         int
		stdout, errs string
	}{
		{nil, 0, "", ""},
		{&HelpError{Text: "Usage: prog\n"}, 0, "Usage: prog\n", ""},
		{fmt.Errorf("wrapped: %w", flag.ErrHelp), 0, "", ""},
		{Usagef("--max-qps %d: out of range", 7), 2, "", "prog: --max-qps 7: out of range\nTry 'prog --help' for more information.\n"},
		{ParseError(errors.New("flag provided but not defined: -x")), 2, "", "prog: unknown option -x\n"},
		{errors.New("listen: address in use"), 1, "", "prog: listen: address in use\n"},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		if code := Exit(&out, &errb, "prog", tt.err); code != tt.code {
			t.Errorf("%v: exit %d, want %d", tt.err, code, tt.code)
		}
		if out.String() != tt.stdout {
			t.Errorf("%v: stdout %q, want %q", tt.err, out.String(), tt.stdout)
		}
		if !strings.HasPrefix(errb.String(), tt.errs) {
			t.Errorf("%v: stderr %q, want it to start with %q", tt.err, errb.String(), tt.errs)
		}
	}
}

func TestUsagefKeepsWrapped(t *testing.T) {
	base := errors.New("base")
	err := Usagef("--x: %w", base)
	if !errors.Is(err, base) || !errors.Is(err, ErrUsage) || err.Error() != "--x: base" {
		t.Errorf("got %v (is base %v, is usage %v)", err, errors.Is(err, base), errors.Is(err, ErrUsage))
	}
}

func TestVersionLine(t *testing.T) {
	got := VersionLine("vrdmad")
	if !strings.HasPrefix(got, "vrdmad "+version.Version) {
		t.Errorf("got %q, want vrdmad %s…", got, version.Version)
	}
	if r := version.Revision(); r != "" && !strings.Contains(got, "(revision "+r+")") {
		t.Errorf("got %q, want the revision %s", got, r)
	}
}
