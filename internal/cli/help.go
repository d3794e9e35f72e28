package cli

import (
	"flag"
	"fmt"
	"io"
	"reflect"
	"sort"
	"strings"
	"unicode/utf8"
)

// helpWidth is the column the flag descriptions are wrapped at.
const helpWidth = 79

// helpIndent is the indentation of a flag's description under its name.
const helpIndent = "      "

// PrintDefaults writes fs's flags in GNU form, sorted by name:
//
//	-s, --size SIZE
//	    message size in bytes (default: 65536)
//
// Flags defined on the same variable (aliases: -s and --size) share one
// entry. The argument's name is the `quoted` word of the flag's usage,
// else its type (N for numbers); boolean flags take none. A default is
// shown unless it is the type's zero value or the usage speaks of its
// default itself.
func PrintDefaults(w io.Writer, fs *flag.FlagSet) {
	type entry struct {
		names []string
		fl    *flag.Flag
	}
	var entries []*entry
	byValue := map[uintptr]*entry{}
	fs.VisitAll(func(fl *flag.Flag) {
		if k, ok := valueKey(fl.Value); ok {
			if e := byValue[k]; e != nil && e.fl.Usage == fl.Usage {
				e.names = append(e.names, fl.Name)
				return
			}
			e := &entry{names: []string{fl.Name}, fl: fl}
			byValue[k] = e
			entries = append(entries, e)
			return
		}
		entries = append(entries, &entry{names: []string{fl.Name}, fl: fl})
	})
	for _, e := range entries {
		sort.SliceStable(e.names, func(i, j int) bool { return len(e.names[i]) < len(e.names[j]) })
		var head []string
		for _, n := range e.names {
			head = append(head, Name(n))
		}
		arg, usage := argName(e.fl)
		line := "  " + strings.Join(head, ", ")
		if arg != "" {
			line += " " + arg
		}
		if d := e.fl.DefValue; !zeroDefault(d) && !strings.Contains(usage, "default") {
			usage += " (default: " + d + ")"
		}
		fmt.Fprintln(w, line)
		for _, l := range wrap(usage, helpWidth-len(helpIndent)) {
			fmt.Fprintln(w, helpIndent+l)
		}
	}
}

// valueKey identifies the variable a flag sets, so that aliases (flags
// defined on one variable) are listed together; false when the value is
// not a pointer.
func valueKey(v flag.Value) (uintptr, bool) {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return 0, false
	}
	return rv.Pointer(), true
}

// argName is the name of fl's argument ("" for a boolean flag) and its
// usage with the `quotes` removed.
func argName(fl *flag.Flag) (string, string) {
	name, usage := flag.UnquoteUsage(fl)
	if bf, ok := fl.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
		return "", usage
	}
	switch name {
	case "int", "uint", "int64", "uint64":
		name = "N"
	case "float":
		name = "NUMBER"
	}
	return strings.ToUpper(name), usage
}

// zeroDefault reports whether a default is not worth printing: the zero
// value of the usual flag types, or -1, the usual "none".
func zeroDefault(d string) bool {
	switch d {
	case "", "0", "-1", "false", "0s", "[]":
		return true
	}
	return false
}

// wrap breaks s into lines of at most width runes at spaces (a longer word
// stands alone on its line).
func wrap(s string, width int) []string {
	var lines []string
	for _, para := range strings.Split(s, "\n") {
		line := ""
		for _, w := range strings.Fields(para) {
			switch {
			case line == "":
				line = w
			case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(w) > width:
				lines = append(lines, line)
				line = w
			default:
				line += " " + w
			}
		}
		lines = append(lines, line)
	}
	return lines
}
