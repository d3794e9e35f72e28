package hostniclab

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Counts are the kernel's resource-tracking counts of one RDMA device, as
// `rdma resource show` prints them ("0: rxe0: pd 1 cq 1 qp 1 cm_id 0 mr 0
// ctx 0 srq 0"): object kind → number.
type Counts map[string]int

// String is the counts in a stable order ("cq 1 ctx 0 mr 0 pd 1 qp 1").
func (c Counts) String() string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(c)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s %d", k, c[k])
	}
	return b.String()
}

// Equal reports whether c and d count the same objects.
func (c Counts) Equal(d Counts) bool { return maps.Equal(c, d) }

// Above returns the kinds of which c has more than base, with the excess
// ("mr +1"); empty when none.
func (c Counts) Above(base Counts) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c)) {
		if c[k] > base[k] {
			out = append(out, fmt.Sprintf("%s +%d", k, c[k]-base[k]))
		}
	}
	return out
}

// ParseCounts reads dev's line of `rdma resource show`. ok is false when
// the output has no line for dev.
func ParseCounts(out, dev string) (c Counts, ok bool) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		// "0: rxe0: pd 1 ..." (iproute2 6.1); "dev rxe0 pd 1" in some
		// versions' other output shapes.
		i := slices.Index(f, dev+":")
		if i < 0 {
			continue
		}
		c = Counts{}
		for k := i + 1; k+1 < len(f); k += 2 {
			n, err := strconv.Atoi(f[k+1])
			if err != nil {
				continue
			}
			c[f[k]] = n
		}
		return c, true
	}
	return nil, false
}

// ParseMRs returns the lines of `rdma resource show mr` about dev's MRs
// ("dev rxe0 mrn 3 rkey 0x... lkey ... mrlen 4194304 pdn 2 pid 231 comm
// vrdmad").
func ParseMRs(out, dev string) []string {
	var mrs []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "dev" && f[1] == dev {
			mrs = append(mrs, strings.Join(f, " "))
		}
	}
	return mrs
}

// rdmaTimeout bounds one run of the rdma tool (a TCG guest is slow).
const rdmaTimeout = 20 * time.Second

// Resources is one look at an RDMA device through the rdma tool.
type Resources struct {
	Counts Counts   `json:"counts"`
	MRs    []string `json:"mrs,omitempty"`
}

// ShowResources runs `rdma resource show` and `rdma resource show mr`
// for dev.
func ShowResources(ctx context.Context, dev string) (Resources, error) {
	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, rdmaTimeout)
		defer cancel()
		out, err := exec.CommandContext(ctx, "rdma", args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("rdma %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return string(out), nil
	}
	out, err := run("resource", "show")
	if err != nil {
		return Resources{}, err
	}
	c, ok := ParseCounts(out, dev)
	if !ok {
		return Resources{}, fmt.Errorf("rdma resource show: no line for %s: %q", dev, out)
	}
	mrOut, err := run("resource", "show", "mr")
	if err != nil {
		return Resources{}, err
	}
	return Resources{Counts: c, MRs: ParseMRs(mrOut, dev)}, nil
}
