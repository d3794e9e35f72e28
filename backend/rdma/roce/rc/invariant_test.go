package rc

import "testing"

// checkInvariants checks the requester's bookkeeping: consecutive started
// work requests have consecutive PSNs, the cursor PSN matches the cursor's
// work request and offset, and una <= psn <= high.
func checkInvariants(t testing.TB, q *QP) {
	t.Helper()
	r := &q.req
	if q.err {
		return
	}
	var next uint32
	have := false
	for i := r.head; i != r.tail; i++ {
		w := r.at(i)
		if !w.started {
			break
		}
		if have && uint32(w.psn) != next {
			t.Fatalf("wqe %d (%v) psn %d, previous ended before %d", i, w.wr.Opcode, w.psn, next)
		}
		next, have = uint32(w.psn.Add(w.npkts)), true
		if i == r.cur {
			var want uint32
			switch {
			case w.wr.Opcode == WRRDMARead:
				want = uint32(w.psn.Add(r.off / uint32(q.cfg.PMTU)))
			default:
				want = uint32(w.psn.Add(r.off / uint32(q.cfg.PMTU)))
			}
			if uint32(r.psn) != want {
				t.Fatalf("cursor at wqe %d off %d psn %d, want psn %d (wqe psn %d)", i, r.off, r.psn, want, w.psn)
			}
		}
	}
	if r.psn.Before(r.una) || r.psn.After(r.high) {
		t.Fatalf("cursor psn %d outside [una %d, high %d]", r.psn, r.una, r.high)
	}
	if r.cur < r.head || r.cur > r.tail {
		t.Fatalf("cursor %d outside [%d, %d]", r.cur, r.head, r.tail)
	}
}
