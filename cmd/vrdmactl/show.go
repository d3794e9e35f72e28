package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/vrdma/vrdma/internal/controlapi"
	"github.com/vrdma/vrdma/internal/units"
)

// showInfo prints one device as a two-column table: a row for every key
// of the device's JSON, in the JSON's order, named as the JSON names it
// (a nested object's keys as parent.key, a list's entries as key[i]), so
// that nothing the API shows is missing from the text and a field the API
// gains is printed without a change here. Sizes are in binary units.
func showInfo(out io.Writer, d controlapi.DeviceInfo) error {
	rows, err := jsonRows(d)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// jsonRows flattens v's JSON into (key, value) rows in document order.
func jsonRows(v any) ([][2]string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	// Decoding into any loses the key order; the token stream keeps it.
	order, err := keyOrder(b)
	if err != nil {
		return nil, err
	}
	var rows [][2]string
	flatten("", doc, order, &rows)
	return rows, nil
}

// keyOrder returns each object's keys in document order, by the object's
// path ("" for the top, "limits", "gids[0]").
func keyOrder(b []byte) (map[string][]string, error) {
	order := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(b))
	var walk func(path string) error
	walk = func(path string) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					return err
				}
				key := k.(string)
				order[path] = append(order[path], key)
				if err := walk(join(path, key)); err != nil {
					return err
				}
			}
			_, err = dec.Token() // '}'
			return err
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := walk(fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
			_, err = dec.Token() // ']'
			return err
		}
		return nil
	}
	return order, walk("")
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// flatten appends the rows of v at path.
func flatten(path string, v any, order map[string][]string, rows *[][2]string) {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range order[path] {
			flatten(join(path, k), x[k], order, rows)
		}
	case []any:
		if gids, ok := gidRows(path, x); ok {
			*rows = append(*rows, gids...)
			return
		}
		if len(x) == 0 {
			*rows = append(*rows, [2]string{path, emptyList(path)})
			return
		}
		scalars := make([]string, 0, len(x))
		for i, e := range x {
			if _, ok := e.(map[string]any); ok {
				flatten(fmt.Sprintf("%s[%d]", path, i), e, order, rows)
				continue
			}
			scalars = append(scalars, scalar(path, e))
		}
		if len(scalars) > 0 {
			*rows = append(*rows, [2]string{path, strings.Join(scalars, ",")})
		}
	default:
		*rows = append(*rows, [2]string{path, scalar(path, x)})
	}
}

// gidRows prints a GID table (the list of {index, gid}) as gids[INDEX]
// rows.
func gidRows(path string, list []any) ([][2]string, bool) {
	if path != "gids" || len(list) == 0 {
		return nil, false
	}
	var rows [][2]string
	for _, e := range list {
		m, ok := e.(map[string]any)
		if !ok || len(m) != 2 {
			return nil, false
		}
		idx, ok1 := m["index"].(json.Number)
		gid, ok2 := m["gid"].(string)
		if !ok1 || !ok2 {
			return nil, false
		}
		rows = append(rows, [2]string{"gids[" + idx.String() + "]", gid})
	}
	return rows, true
}

// emptyList is what an empty list at path means.
func emptyList(path string) string {
	if path == "addresses" {
		return "none (port GID only)"
	}
	return "none"
}

// scalar formats a value by its key: byte counts in binary units, rate
// bounds per second, 0 for a bound as none.
func scalar(path string, v any) string {
	key := path[strings.LastIndexByte(path, '.')+1:]
	switch x := v.(type) {
	case nil:
		return "-"
	case string:
		if x == "" {
			return "-"
		}
		return x
	case bool:
		return strconv.FormatBool(x)
	case json.Number:
		n, err := strconv.ParseUint(x.String(), 10, 64)
		if err != nil {
			return x.String()
		}
		switch {
		case key == "max_bytes_per_s":
			return rateLimit(n, true)
		case key == "max_ops_per_s":
			return rateLimit(n, false)
		case key == "max_pinned_bytes" && n == 0:
			return "none"
		case isBytes(key):
			return units.FormatHuman(n)
		}
		return x.String()
	}
	return fmt.Sprint(v)
}

// isBytes reports whether a key holds a byte count.
func isBytes(key string) bool {
	return strings.HasSuffix(key, "_bytes") || strings.HasPrefix(key, "bytes_")
}
