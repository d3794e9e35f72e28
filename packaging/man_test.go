package packaging

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// manPage is one of the manual pages in packaging/man.
type manPage struct {
	file     string   // in packaging/man
	program  string   // the command it documents (cmd/<program>)
	sections []string // the headings it must have, as man prints them
}

var manPages = []manPage{
	{"vrdmad.8", "vrdmad", []string{"NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "FILES", "ENVIRONMENT", "SIGNALS", "EXIT STATUS", "EXAMPLES", "SEE ALSO"}},
	{"vrdmactl.8", "vrdmactl", []string{"NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "COMMANDS", "FILES", "ENVIRONMENT", "EXIT STATUS", "EXAMPLES", "SEE ALSO"}},
	{"vrdma-perf.1", "vrdma-perf", []string{"NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "FILES", "ENVIRONMENT", "EXIT STATUS", "EXAMPLES", "SEE ALSO"}},
}

// TestManRender renders each page as man(1) and lintian do, and with groff
// at its strictest (-ww: every warning): none may warn, and each must
// have the sections an operator looks for, in a .TH that names it.
func TestManRender(t *testing.T) {
	groff := need(t, "groff")
	man := need(t, "man")
	for _, p := range manPages {
		t.Run(p.file, func(t *testing.T) {
			path := filepath.Join("man", p.file)
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			name, sec, _ := strings.Cut(p.file, ".")
			th := regexp.MustCompile(`(?m)^\.TH (\S+) (\S+) `).FindSubmatch(src)
			if th == nil || roffText(string(th[1])) != strings.ToUpper(name) || string(th[2]) != sec {
				t.Errorf(".TH: got %q, want .TH %s %s (the file's name and section)", th, strings.ToUpper(name), sec)
			}

			cmd := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z", path)
			if out, err := cmd.CombinedOutput(); err != nil || len(out) != 0 {
				t.Errorf("groff -man -ww: %v\n%s", err, out)
			}
			// What lintian's manpage-has-errors-from-man runs.
			cmd = exec.Command(man, "--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z", path)
			cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "MANWIDTH=80")
			var stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = nil, &stderr
			if err := cmd.Run(); err != nil || stderr.Len() != 0 {
				t.Errorf("man --warnings: %v\n%s", err, stderr.String())
			}

			cmd = exec.Command(man, "-l", path)
			cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "MANWIDTH=80", "MANPAGER=cat", "PAGER=cat")
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("man -l: %v", err)
			}
			var got []string
			for _, line := range strings.Split(string(out), "\n") {
				if regexp.MustCompile(`^[A-Z][A-Z ]*[A-Z]$`).MatchString(line) {
					got = append(got, line)
				}
			}
			for _, s := range p.sections {
				if !slices.Contains(got, s) {
					t.Errorf("man -l shows no section %s (it shows %q)", s, got)
				}
			}
		})
	}
}

// TestManOptions checks each page against its program: OPTIONS has an
// entry (a .TP tag) for every flag the program's --help lists, and no
// entry for a flag it does not have; vrdmactl's COMMANDS has a subsection
// per command with an entry for every flag of `vrdmactl COMMAND --help`.
// Whoever adds, renames or removes a flag is told which page and entry.
func TestManOptions(t *testing.T) {
	if testing.Short() {
		t.Skip("short mode: builds the programs (make test runs it in its full pass)")
	}
	goBin := need(t, "go")
	bin := t.TempDir()
	build := exec.Command(goBin, "build", "-o", bin+"/", "../cmd/vrdmad", "../cmd/vrdmactl", "../cmd/vrdma-perf")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	help := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(bin, args[0]), args[1:]...).Output()
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	for _, p := range manPages {
		t.Run(p.file, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("man", p.file))
			if err != nil {
				t.Fatal(err)
			}
			page := parseRoff(string(src))
			where := "packaging/man/" + p.file
			usage := help(t, p.program, "--help")
			compareFlags(t, where+" OPTIONS", page.tags("OPTIONS", ""), usage, p.program+" --help")
			if p.program != "vrdmactl" {
				return
			}
			cmds := vrdmactlCommands(usage)
			if len(cmds) < 7 {
				t.Fatalf("found %d commands in vrdmactl --help, want at least 7:\n%s", len(cmds), usage)
			}
			for _, c := range cmds {
				if !slices.Contains(page.subsections["COMMANDS"], c) {
					t.Errorf("%s: COMMANDS has no subsection .SS %q (vrdmactl --help lists the command)", where, c)
					continue
				}
				args := append([]string{"vrdmactl"}, strings.Fields(c)...)
				compareFlags(t, fmt.Sprintf("%s COMMANDS %q", where, c), page.tags("COMMANDS", c),
					help(t, append(args, "--help")...), strings.Join(args, " ")+" --help")
			}
			for _, s := range page.subsections["COMMANDS"] {
				if !slices.Contains(cmds, s) {
					t.Errorf("%s: COMMANDS has .SS %q, a command vrdmactl --help does not list", where, s)
				}
			}
		})
	}
}

// compareFlags reports each flag of the program missing from the page's
// entries, and each entry for a flag the program lacks (-h and --help are
// implied: every program takes them).
func compareFlags(t *testing.T, where string, documented []string, help string, source string) {
	t.Helper()
	listed, ok := helpFlags(help)
	if ok && len(listed) == 0 {
		t.Errorf("%s: %s has an options section but no flag was found in it (has its format changed?)", where, source)
	}
	for _, f := range listed {
		if !slices.Contains(documented, f) {
			t.Errorf("%s: no entry for %s, which %s lists: add a .TP for it", where, f, source)
		}
	}
	for _, f := range documented {
		if f != "-h" && f != "--help" && !slices.Contains(listed, f) {
			t.Errorf("%s: an entry for %s, which %s does not list: remove or rename it", where, f, source)
		}
	}
}

// helpFlags returns the flags a --help text lists in its options
// section (a heading ending in "Options:" up to the next heading), as
// "--name" or, for a one-letter flag, "-x": in Go's flag format
// ("  -name TYPE") or GNU's ("  -p, --port PORT"). ok is false when the
// text has no options section.
func helpFlags(help string) (flags []string, ok bool) {
	re := regexp.MustCompile(`^  (-{1,2}[A-Za-z][A-Za-z0-9_-]*)(?:, (-{1,2}[A-Za-z][A-Za-z0-9_-]*))?`)
	in := false
	for _, line := range strings.Split(help, "\n") {
		if line != "" && line[0] != ' ' && line[0] != '\t' {
			in = strings.HasSuffix(strings.ToLower(line), "options:")
			ok = ok || in
			continue
		}
		m := re.FindStringSubmatch(line)
		if !in || m == nil {
			continue
		}
		for _, f := range m[1:] {
			if f = canonFlag(f); f != "" && !slices.Contains(flags, f) {
				flags = append(flags, f)
			}
		}
	}
	return flags, ok
}

// canonFlag spells a flag as the pages do: --name, or -x for one letter.
func canonFlag(f string) string {
	name := strings.TrimLeft(f, "-")
	switch {
	case name == "":
		return ""
	case len(name) == 1:
		return "-" + name
	default:
		return "--" + name
	}
}

// vrdmactlCommands returns the commands `vrdmactl --help` lists under
// "Commands:" ("device add", "completion", ...), help aside.
func vrdmactlCommands(help string) []string {
	var out []string
	for _, line := range strings.Split(help, "\n") {
		rest, ok := strings.CutPrefix(line, "  vrdmactl ")
		if !ok {
			continue
		}
		var words []string
		for _, w := range strings.Fields(rest) {
			// Command words are lower-case letters; arguments are upper
			// case, bracketed, alternatives (bash|zsh) or flags.
			if !regexp.MustCompile(`^[a-z]+$`).MatchString(w) || len(words) == 2 {
				break
			}
			words = append(words, w)
		}
		if c := strings.Join(words, " "); c != "" && c != "help" && !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// roffPage is a manual page's structure: for each section and subsection
// the flags of its .TP/.TQ tags.
type roffPage struct {
	subsections map[string][]string // .SH name → its .SS names, in order
	tagFlags    map[[2]string][]string
}

func (p *roffPage) tags(section, subsection string) []string {
	return p.tagFlags[[2]string{section, subsection}]
}

// parseRoff reads the man(7) source of a page: its sections, subsections
// and the flags named by each paragraph tag (the line after .TP or .TQ).
// A tag under a subsection of OPTIONS counts for OPTIONS; under one of
// COMMANDS, for that command.
func parseRoff(src string) *roffPage {
	p := &roffPage{subsections: map[string][]string{}, tagFlags: map[[2]string][]string{}}
	flagRe := regexp.MustCompile(`(?:^|[\s,|\[(])(--?[A-Za-z][A-Za-z0-9_-]*)`)
	sec, sub := "", ""
	tagNext := false
	for _, line := range strings.Split(src, "\n") {
		macro, args, _ := strings.Cut(line, " ")
		switch {
		case macro == ".SH":
			sec, sub, tagNext = roffText(roffArgs(args, " ")), "", false
			continue
		case macro == ".SS":
			sub = roffText(roffArgs(args, " "))
			p.subsections[sec] = append(p.subsections[sec], sub)
			tagNext = false
			continue
		case macro == ".TP" || macro == ".TQ":
			tagNext = true
			continue
		}
		if !tagNext {
			continue
		}
		tagNext = false
		text := line
		if strings.HasPrefix(line, ".") {
			join := ""
			if macro == ".B" || macro == ".I" {
				join = " "
			}
			text = roffArgs(args, join)
		}
		key := [2]string{sec, sub}
		if sec != "COMMANDS" {
			key[1] = ""
		}
		for _, m := range flagRe.FindAllStringSubmatch(roffText(text), -1) {
			if f := canonFlag(m[1]); !slices.Contains(p.tagFlags[key], f) {
				p.tagFlags[key] = append(p.tagFlags[key], f)
			}
		}
	}
	return p
}

// roffArgs splits a macro's arguments (double quotes group words) and
// joins them with sep: "" for the font-alternating macros (.BI, .BR, …).
func roffArgs(args, sep string) string {
	var out []string
	for args = strings.TrimSpace(args); args != ""; args = strings.TrimSpace(args) {
		if args[0] == '"' {
			end := strings.IndexByte(args[1:], '"')
			if end < 0 {
				end = len(args) - 1
			}
			out = append(out, args[1:end+1])
			args = args[min(end+2, len(args)):]
			continue
		}
		w, rest, _ := strings.Cut(args, " ")
		out = append(out, w)
		args = rest
	}
	return strings.Join(out, sep)
}

// roffText turns roff's escapes into the characters they print: \- a
// dash, \~ a space, \e a backslash; font changes and \c, \&, \%, \| print
// nothing.
func roffText(s string) string {
	s = regexp.MustCompile(`\\f(\[[A-Z]*\]|[BIRP])`).ReplaceAllString(s, "")
	return strings.NewReplacer(`\-`, "-", `\~`, " ", `\e`, `\`, `\c`, "", `\&`, "", `\%`, "", `\|`, "", `\(aq`, "'").Replace(s)
}
