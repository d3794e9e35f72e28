package roceinterop

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/vrdma/vrdma/internal/pftexchange"
)

// Job is one perftest run: guest/perftest-jobs' OP:SIZE:ITERS.
type Job struct {
	Op    pftexchange.Op
	Size  int
	Iters int
}

// String returns the job as perftest-jobs takes it.
func (j Job) String() string { return fmt.Sprintf("%s:%d:%d", j.Op, j.Size, j.Iters) }

// Bytes is the payload the job moves one way.
func (j Job) Bytes() int64 { return int64(j.Size) * int64(j.Iters) }

// MaxJobBytes bounds a job's payload (Size × Iters): the vrdma side keeps
// it in one registered buffer.
const MaxJobBytes = 64 << 20

// ParseJob parses OP:SIZE:ITERS and checks it against what both sides
// play: an op of pftexchange, size ≥ 1 (8 for atomic_bw), iters ≥ 5
// (perftest-jobs' floor), a payload within MaxJobBytes.
func ParseJob(s string) (Job, error) {
	f := strings.Split(s, ":")
	if len(f) != 3 {
		return Job{}, fmt.Errorf("job %q: want OP:SIZE:ITERS", s)
	}
	j := Job{Op: pftexchange.Op(f[0])}
	var err error
	if !j.Op.Valid() {
		return Job{}, fmt.Errorf("job %q: op %q: want one of %v", s, f[0], pftexchange.Ops)
	}
	if j.Size, err = strconv.Atoi(f[1]); err != nil || j.Size < 1 || j.Size > MaxJobBytes {
		return Job{}, fmt.Errorf("job %q: bad size", s)
	}
	if j.Iters, err = strconv.Atoi(f[2]); err != nil || j.Iters < 5 || j.Iters > 1<<20 {
		return Job{}, fmt.Errorf("job %q: bad iteration count (5..%d)", s, 1<<20)
	}
	if j.Op == pftexchange.AtomicBW && j.Size != 8 {
		return Job{}, fmt.Errorf("job %q: atomic_bw takes size 8", s)
	}
	if j.Bytes() > MaxJobBytes {
		return Job{}, fmt.Errorf("job %q: %d bytes, more than %d", s, j.Bytes(), MaxJobBytes)
	}
	return j, nil
}
