// Package cli is what the command lines of every vrdma program share, so
// that vrdmad, vrdmactl, vrdma-perf, vrdma-vmtest, vrdma-compare and
// vrdma-bench behave alike:
//
//   - flags are written the GNU way in help and errors: --name, or -x for
//     the one-letter flags perftest users type (Go's flag package writes
//     -name for both, and its errors say so);
//   - --version prints "PROGRAM VERSION (revision REV)" (VersionLine, from
//     internal/version);
//   - bad usage exits 2, --help exits 0 with the help on standard output,
//     any other failure exits 1 (Exit).
//
// It wraps the standard flag package rather than replacing it: each
// program keeps its flag.FlagSet, parses it with Parse and prints it with
// PrintDefaults. It does not parse GNU short-option clusters or
// abbreviations; "-name" stays accepted as the flag package accepts it.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/vrdma/vrdma/internal/version"
)

// ExitUsage is the exit status of a command line a program cannot run.
const ExitUsage = 2

// ErrUsage matches (errors.Is) every error that means bad usage.
var ErrUsage = errors.New("bad usage")

// UsageError is a command line a program cannot run: an unknown flag, a
// bad value, a missing or extra argument.
type UsageError struct {
	// Msg says what is wrong, with flags written as Name writes them.
	Msg string
	// Err is the error that found it, if any (for errors.Is/As).
	Err error
}

func (e *UsageError) Error() string { return e.Msg }

// Unwrap returns the error that found it.
func (e *UsageError) Unwrap() error { return e.Err }

// Is matches ErrUsage.
func (e *UsageError) Is(target error) bool { return target == ErrUsage }

// Usagef is a *UsageError with a formatted message; a %w verb's error is
// kept for errors.Is/As.
func Usagef(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	return &UsageError{Msg: err.Error(), Err: errors.Unwrap(err)}
}

// HelpError is a request for help: the program prints Text on standard
// output and exits 0. It matches flag.ErrHelp.
type HelpError struct {
	Text string
}

func (e *HelpError) Error() string { return "help requested" }

// Is matches flag.ErrHelp.
func (e *HelpError) Is(target error) bool { return target == flag.ErrHelp }

// Name writes a flag's name as the program's help does: "-x" for a
// one-letter flag, "--name" for any other.
func Name(name string) string {
	if len([]rune(name)) == 1 {
		return "-" + name
	}
	return "--" + name
}

// New is a flag set whose Parse prints nothing: Parse (below) returns
// what went wrong and the program prints it once, in GNU form.
func New(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	Quiet(fs)
	return fs
}

// Quiet stops fs from printing its own errors and usage (Go's, with
// -name), leaving both to the program.
func Quiet(fs *flag.FlagSet) {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
}

// Parse parses args with fs, quietly. It returns flag.ErrHelp for -h,
// -help and --help, and a *UsageError in GNU form for anything the flag
// package rejects.
func Parse(fs *flag.FlagSet, args []string) error {
	Quiet(fs)
	return ParseError(fs.Parse(args))
}

// ParseHelp is Parse that answers -h/--help with a *HelpError holding
// header followed by fs's flags (PrintDefaults): what a subcommand's
// parser returns so that its caller prints the help and exits 0.
func ParseHelp(fs *flag.FlagSet, args []string, header string) error {
	err := Parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		var b strings.Builder
		b.WriteString(header)
		PrintDefaults(&b, fs)
		return &HelpError{Text: b.String()}
	}
	return err
}

// Interleaved parses args whose flags may come before, between or after
// the positional arguments ("add vm1 --socket S" as "add --socket S
// vm1"), and returns the positional ones. Everything after "--" is
// positional. Errors are Parse's.
func Interleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	Quiet(fs)
	var pos []string
	for {
		n := len(args)
		if err := ParseError(fs.Parse(args)); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// Parse stopped either at a positional argument (rest[0]) or
		// after consuming "--", which is then the token just before
		// rest: everything left is positional.
		if k := n - len(rest); k > 0 && args[k-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// The flag package's messages (flag.go, FlagSet.parseOne), each naming
// the flag as it was typed, without its dashes, after the prefix.
var flagMessages = []struct {
	prefix, rewrite string // rewrite: %s is the GNU name, %r the rest
}{
	{"flag provided but not defined: -", "unknown option %s"},
	{"flag needs an argument: -", "option %s needs a value"},
	{"invalid boolean flag ", "%s: invalid boolean value%r"},
}

// ParseError rewrites an error of flag.FlagSet.Parse in GNU form
// ("unknown option --frob", "--max-qps: invalid value \"x\": parse
// error") as a *UsageError; nil and flag.ErrHelp are returned as they
// are.
func ParseError(err error) error {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	var ue *UsageError
	if errors.As(err, &ue) {
		return err
	}
	return &UsageError{Msg: rewrite(err.Error()), Err: err}
}

func rewrite(msg string) string {
	for _, m := range flagMessages {
		rest, ok := strings.CutPrefix(msg, m.prefix)
		if !ok {
			continue
		}
		name, tail, _ := strings.Cut(rest, ":")
		name = strings.TrimPrefix(strings.TrimSpace(name), "-")
		out := strings.ReplaceAll(m.rewrite, "%s", Name(name))
		return strings.ReplaceAll(out, "%r", tail)
	}
	// invalid value "V" for flag -NAME: REASON
	// invalid boolean value "V" for -NAME: REASON
	for _, kind := range []string{"invalid value ", "invalid boolean value "} {
		rest, ok := strings.CutPrefix(msg, kind)
		if !ok {
			continue
		}
		i := strings.LastIndex(rest, " for ")
		if i < 0 {
			break
		}
		val, after := rest[:i], rest[i+len(" for "):]
		after = strings.TrimPrefix(after, "flag ")
		name, reason, _ := strings.Cut(after, ": ")
		name = strings.TrimLeft(name, "-")
		out := fmt.Sprintf("%s: %s%s", Name(name), kind, val)
		if reason != "" {
			out += ": " + reason
		}
		return out
	}
	if rest, ok := strings.CutPrefix(msg, "bad flag syntax: "); ok {
		return "bad option syntax: " + rest
	}
	return msg
}

// VersionLine is what --version prints: "PROGRAM VERSION (revision
// REV)", the same for every vrdma program.
func VersionLine(prog string) string { return prog + " " + version.String() }

// Exit reports err as prog and returns the exit status: 0 for nil and for
// help (a *HelpError's text goes to stdout), ExitUsage for bad usage
// ("prog: MSG" and a pointer to --help on stderr), 1 for anything else
// ("prog: MSG").
func Exit(stdout, stderr io.Writer, prog string, err error) int {
	var he *HelpError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &he):
		io.WriteString(stdout, he.Text)
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(stderr, "%s: %v\n", prog, err)
		fmt.Fprintf(stderr, "Try '%s --help' for more information.\n", prog)
		return ExitUsage
	}
	fmt.Fprintf(stderr, "%s: %v\n", prog, err)
	return 1
}

// Hoist moves the flags of global that follow the subcommand (the first
// argument that is not a flag or a flag's value) in front of it, so that
// "prog sub --json" parses as "prog --json sub": global flags are
// accepted anywhere. Their order is kept, so the last one given still
// wins. Arguments after "--" stay where they are, and so do all of a
// subcommand named in raw (one that takes its arguments as they are).
func Hoist(global *flag.FlagSet, args []string, raw ...string) []string {
	// lookup is the global flag a token names, and whether the token
	// carries its value ("--control=X").
	lookup := func(a string) (*flag.Flag, bool) {
		if len(a) < 2 || a[0] != '-' || a == "--" {
			return nil, false
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		name, _, hasValue := strings.Cut(name, "=")
		return global.Lookup(name), hasValue
	}
	takesValue := func(fl *flag.Flag) bool {
		bf, ok := fl.Value.(interface{ IsBoolFlag() bool })
		return !ok || !bf.IsBoolFlag()
	}
	// Find the subcommand.
	sub := -1
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return args
		}
		if fl, hasValue := lookup(a); fl != nil {
			if !hasValue && takesValue(fl) {
				i++
			}
			continue
		}
		if strings.HasPrefix(a, "-") && a != "-" {
			continue // not a global flag: Parse will say so
		}
		sub = i
		break
	}
	if sub < 0 || slices.Contains(raw, args[sub]) {
		return args
	}
	var hoisted, rest []string
	for i := sub + 1; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		fl, hasValue := lookup(a)
		if fl == nil {
			rest = append(rest, a)
			continue
		}
		hoisted = append(hoisted, a)
		if !hasValue && takesValue(fl) && i+1 < len(args) {
			i++
			hoisted = append(hoisted, args[i])
		}
	}
	out := make([]string, 0, len(args))
	out = append(out, args[:sub]...)
	out = append(out, hoisted...)
	out = append(out, args[sub])
	return append(out, rest...)
}
