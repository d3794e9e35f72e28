package packaging

import (
	"math/bits"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/backend/rdma/roce/hostnet"
	"github.com/vrdma/vrdma/internal/daemon"
	"github.com/vrdma/vrdma/internal/units"
	"github.com/vrdma/vrdma/virtio"
	"github.com/vrdma/vrdma/virtio/rdma/abi"
)

// TestLimitsDoc checks the numbers of docs/limits.md against the
// constants the code enforces, so that the page changes when a limit
// does. Each check names a table row (its first cell), a column, and the
// number the cell must hold.
func TestLimitsDoc(t *testing.T) {
	b, err := os.ReadFile("../docs/limits.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := mdTableRows(string(b))
	def := rdma.DefaultLimits()
	for _, c := range []struct {
		row  string
		col  int
		re   string // one group: the number
		want uint64
		what string // where the number comes from
	}{
		{"QPs", 1, `^(\d+)$`, uint64(def.MaxQP), "rdma.DefaultLimits().MaxQP"},
		{"CQs", 1, `^(\d+)$`, uint64(def.MaxCQ), "rdma.DefaultLimits().MaxCQ"},
		{"MRs", 1, `^(\d+)$`, uint64(def.MaxMR), "rdma.DefaultLimits().MaxMR"},
		{"PDs", 1, `^(\d+)$`, uint64(def.MaxPD), "rdma.DefaultLimits().MaxPD"},
		{"AHs", 1, `^(\d+)$`, uint64(def.MaxAH), "rdma.DefaultLimits().MaxAH"},
		{"SRQs", 1, `^(\d+)$`, uint64(def.MaxSRQ), "rdma.DefaultLimits().MaxSRQ"},
		{"work requests per send queue, receive queue or SRQ", 1, `^(\d+)$`, uint64(def.MaxQPWR), "rdma.DefaultLimits().MaxQPWR"},
		{"entries per CQ", 1, `^(\d+)$`, uint64(def.MaxCQE), "rdma.DefaultLimits().MaxCQE"},
		{"scatter/gather entries per work request", 1, `^(\d+)$`, uint64(def.MaxSGE), "rdma.DefaultLimits().MaxSGE"},
		{"inline data per send work request", 1, `^(\d+ bytes)$`, uint64(def.MaxInlineData), "rdma.DefaultLimits().MaxInlineData"},
		{"outstanding RDMA READs and atomics per QP", 1, `^(\d+)$`, uint64(def.MaxQPRdAtom), "rdma.DefaultLimits().MaxQPRdAtom"},
		{"bytes one MR may cover", 1, `^(\d+ [KMGT]iB)$`, def.MaxMRSize, "rdma.DefaultLimits().MaxMRSize"},
		{"contiguous guest-physical runs of all MRs of a device", 1, `^(\d+)$`, uint64(def.MaxMRExtents), "rdma.DefaultLimits().MaxMRExtents"},
		{"message size", 1, `^(2\^\d+) bytes$`, abi.MaxMsgSize, "abi.MaxMsgSize"},
		{"GID table", 1, `^(\d+) entries$`, abi.GIDTableLen, "abi.GIDTableLen"},
		{"virtqueue size", 1, `at most (\d+)$`, virtio.MaxQueueSize, "virtio.MaxQueueSize"},
		{"config space", 1, `^(\d+) bytes$`, abi.ConfigSize, "abi.ConfigSize"},
		{"weight", 2, `^1 … (\d+) `, rdma.MaxWeight, "rdma.MaxWeight"},
		{"payload bytes per second", 2, `^(\d+) or more`, rdma.MinBytesPerSec, "rdma.MinBytesPerSec"},
		{"devices per vrdmad", 1, `^(\d+) `, daemon.MaxDevices, "daemon.MaxDevices"},
		{"paths per RoCEv2 QP", 1, `^1 … (\d+) `, hostnet.MaxPaths, "hostnet.MaxPaths"},
	} {
		t.Run(c.row, func(t *testing.T) {
			cells, ok := rows[c.row]
			if !ok {
				t.Fatalf("docs/limits.md has no table row %q", c.row)
			}
			if c.col >= len(cells) {
				t.Fatalf("docs/limits.md, row %q: %d cells, want column %d", c.row, len(cells), c.col+1)
			}
			m := regexp.MustCompile(c.re).FindStringSubmatch(cells[c.col])
			if m == nil {
				t.Fatalf("docs/limits.md, row %q: cell %q does not match %s", c.row, cells[c.col], c.re)
			}
			got, err := docNumber(m[1])
			if err != nil {
				t.Fatalf("docs/limits.md, row %q: %v", c.row, err)
			}
			if got != c.want {
				t.Errorf("docs/limits.md, row %q: says %s (%d), but %s is %d", c.row, m[1], got, c.what, c.want)
			}
		})
	}
}

// docNumber reads a number as the page writes it: 1024, 2^31, 4 GiB,
// 256 bytes.
func docNumber(s string) (uint64, error) {
	if base, exp, ok := strings.Cut(s, "^"); ok && base == "2" {
		e, err := strconv.Atoi(exp)
		if err != nil || e >= bits.UintSize {
			return 0, err
		}
		return 1 << e, nil
	}
	return units.ParseBytes(strings.ReplaceAll(strings.TrimSuffix(s, " bytes"), " ", ""))
}

// mdTableRows returns the rows of every table of a markdown document by
// their first cell (code spans and emphasis kept as written, spaces
// trimmed), each with all its cells.
func mdTableRows(doc string) map[string][]string {
	rows := map[string][]string{}
	for _, line := range strings.Split(doc, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") || strings.HasPrefix(line, "|---") {
			continue
		}
		var cells []string
		for _, c := range strings.Split(line[1:len(line)-1], "|") {
			cells = append(cells, strings.TrimSpace(c))
		}
		if _, dup := rows[cells[0]]; !dup {
			rows[cells[0]] = cells
		}
	}
	return rows
}
