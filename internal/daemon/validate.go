package daemon

import (
	"strings"

	"github.com/vrdma/vrdma/backend/rdma"
	"github.com/vrdma/vrdma/internal/units"
)

// The rules a device's settings obey wherever they come from: POST
// /v1/devices (requestSpec) and vrdmad's command line (cmd/vrdmad, which
// calls these same functions on its flags), so that a value the API
// refuses cannot slip in at start. Errors are *RequestError naming the
// JSON key; vrdmad maps the key to its flag.

// CheckLimits checks per-device limits as POST /v1/devices checks its
// "limits": each count 0 (the default) or 1 … its bound, the pin quota 0
// (none, or the daemon's) or within [2 MiB, 256 TiB]. The counts are
// uint64 so that a command line's value is checked before it is narrowed
// to the device's uint32. It returns the device limits (zero fields: the
// defaults) and the pin quota.
func CheckLimits(qps, cqs, mrs, pinned uint64) (rdma.Limits, uint64, error) {
	var lim rdma.Limits
	for _, c := range []struct {
		name   string
		v, max uint64
		dst    *uint32
	}{{"limits.max_qps", qps, maxQPs, &lim.MaxQP}, {"limits.max_cqs", cqs, maxCQs, &lim.MaxCQ}, {"limits.max_mrs", mrs, maxMRs, &lim.MaxMR}} {
		if c.v > c.max {
			return rdma.Limits{}, 0, reqErr(c.name, "%d out of range [1, %d] (0: the default)", c.v, c.max)
		}
		*c.dst = uint32(c.v)
	}
	if err := CheckPinnedBytes("limits.max_pinned_bytes", pinned); err != nil {
		return rdma.Limits{}, 0, err
	}
	return lim, pinned, nil
}

// CheckPinnedBytes checks a bound on pinned bytes (field names it): 0 (no
// bound) or within [2 MiB, 256 TiB]. Less than a hugepage cannot hold a
// ring; more than 2^48 is beyond any x86-64 address space.
func CheckPinnedBytes(field string, n uint64) error {
	if n != 0 && (n < minPinnedBytes || n > maxPinnedBytes) {
		return reqErr(field, "%s (%d bytes) out of range [%s, %s] (0: no bound)", units.FormatBytes(n), n,
			units.FormatBytes(minPinnedBytes), units.FormatBytes(maxPinnedBytes))
	}
	return nil
}

// CheckDoorbellQueues checks a device's doorbell queue count: 0 (one) to
// 256.
func CheckDoorbellQueues(n int) error {
	if n < 0 || n > maxDoorbellQueues {
		return reqErr("doorbell_queues", "%d out of range [0, %d] (0: 1)", n, maxDoorbellQueues)
	}
	return nil
}

// CheckSocketPath checks a device socket's path as POST /v1/devices does:
// a clean absolute path of at most 107 bytes (sun_path), without NUL,
// newline or invalid UTF-8.
func CheckSocketPath(p string) error { return checkSocket(p) }

// DeriveID makes a device ID from a name that is not one (a socket's file
// name): characters an ID may not hold become '-', a name that does not
// start with a letter gets the prefix "vrdma-", and the result is cut to
// 64 bytes. "" when nothing of the name is left.
func DeriveID(name string) string {
	var b strings.Builder
	for _, r := range name {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	id := strings.Trim(b.String(), "-.")
	if id == "" {
		return ""
	}
	if c := id[0]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
		id = "vrdma-" + id
	}
	if len(id) > maxIDLen {
		id = strings.TrimRight(id[:maxIDLen], "-.")
	}
	if checkID(id) != nil {
		return "" // cannot happen; never return an invalid ID
	}
	return id
}
