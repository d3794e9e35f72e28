package daemon

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestParseStoreNames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		names []string
		want  storeLayout
	}{
		{"plain start", []string{"control", "a"}, storeLayout{state: -1, byIndex: map[int]int{}}},
		{"socket units first, then the store", []string{"control", StoreStateName, "vrdmad-fd-0", "vrdmad-fd-2"},
			storeLayout{state: 1, byIndex: map[int]int{0: 2, 2: 3}, ours: []string{StoreStateName, "vrdmad-fd-0", "vrdmad-fd-2"}}},
		{"a name twice: the first is taken", []string{"vrdmad-fd-1", StoreStateName, "vrdmad-fd-1", StoreStateName},
			storeLayout{state: 1, byIndex: map[int]int{1: 0}, ours: []string{"vrdmad-fd-1", StoreStateName}, extra: []int{2, 3}}},
		{"indexes not in canonical decimal", []string{"vrdmad-fd-01", "vrdmad-fd-+1", "vrdmad-fd--1", "vrdmad-fd-", "vrdmad-fd-x", "vrdmad-fd-" + strconv.Itoa(MaxHandoverFDs)},
			storeLayout{state: -1, byIndex: map[int]int{}, ours: []string{"vrdmad-fd-01", "vrdmad-fd-+1", "vrdmad-fd--1", "vrdmad-fd-", "vrdmad-fd-x", "vrdmad-fd-" + strconv.Itoa(MaxHandoverFDs)}, extra: []int{0, 1, 2, 3, 4, 5}}},
		{"leftovers without a document", []string{"control", "vrdmad-fd-3"},
			storeLayout{state: -1, byIndex: map[int]int{3: 1}, ours: []string{"vrdmad-fd-3"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseStoreNames(tc.names); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// FuzzParseStoreNames: whatever LISTEN_FDNAMES holds, every position is
// taken at most once, by a name that says so.
func FuzzParseStoreNames(f *testing.F) {
	f.Add("control:" + StoreStateName + ":vrdmad-fd-0:vrdmad-fd-1:vrdmad-fd-0")
	f.Fuzz(func(t *testing.T, s string) {
		names := strings.Split(s, ":")
		l := parseStoreNames(names)
		used := map[int]bool{}
		take := func(p int, what string) {
			if p < 0 || p >= len(names) || used[p] {
				t.Fatalf("%s: position %d of %d taken twice or out of range", what, p, len(names))
			}
			used[p] = true
		}
		if l.state >= 0 {
			take(l.state, "state")
			if names[l.state] != StoreStateName {
				t.Fatalf("state at %d is %q", l.state, names[l.state])
			}
		}
		for idx, p := range l.byIndex {
			take(p, "index")
			if idx < 0 || idx >= MaxHandoverFDs || names[p] != StoreFDPrefix+strconv.Itoa(idx) {
				t.Fatalf("index %d at %d is %q", idx, p, names[p])
			}
		}
		for _, p := range l.extra {
			take(p, "extra")
		}
		seen := map[string]bool{}
		for _, n := range l.ours {
			if seen[n] || (n != StoreStateName && !strings.HasPrefix(n, StoreFDPrefix)) {
				t.Fatalf("ours: %q twice or not ours", n)
			}
			seen[n] = true
		}
		for p, n := range names {
			if (n == StoreStateName || strings.HasPrefix(n, StoreFDPrefix)) && !used[p] {
				t.Fatalf("position %d (%q) is ours but neither taken nor extra", p, n)
			}
		}
	})
}
