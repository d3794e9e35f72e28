package controlapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/vrdma/vrdma/internal/controlapi"
)

func TestNextPage(t *testing.T) {
	for _, tt := range []struct {
		links []string
		want  string
		err   bool
	}{
		{nil, "", false},
		{[]string{`</v1/devices/a/qps?after=17&limit=2>; rel="next"`}, "/v1/devices/a/qps?after=17&limit=2", false},
		{[]string{`</v1/x>; rel="prev", </v1/resources/qps?after=a%3A3>; rel=next`}, "/v1/resources/qps?after=a%3A3", false},
		{[]string{`</v1/x>; rel="prev"`}, "", false},
		{[]string{`<http://elsewhere/v1/qps>; rel="next"`}, "", true},
		{[]string{`</etc/passwd>; rel="next"`}, "", true},
		{[]string{`garbage`}, "", false},
	} {
		h := http.Header{}
		for _, l := range tt.links {
			h.Add("Link", l)
		}
		got, err := controlapi.NextPage(h)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("NextPage(%q): got %q, %v; want %q, error %v", tt.links, got, err, tt.want, tt.err)
		}
	}
}

func FuzzNextPage(f *testing.F) {
	f.Add(`</v1/devices/a/qps?after=17&limit=2>; rel="next"`)
	f.Fuzz(func(t *testing.T, link string) {
		h := http.Header{"Link": {link}}
		got, err := controlapi.NextPage(h)
		if err != nil && got != "" {
			t.Fatalf("error %v with a page %q", err, got)
		}
		if got != "" && !strings.HasPrefix(got, "/v1/") {
			t.Fatalf("next page %q outside the control API", got)
		}
	})
}
