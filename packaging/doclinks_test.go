package packaging

import (
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocLinks checks the documentation as the source tree holds it
// (README.md and docs/, laid out as the .deb installs them under
// /usr/share/doc/vrdma): every relative link resolves to a file of the
// tree. checkDeb runs the same check on the installed files.
func TestDocLinks(t *testing.T) {
	files := map[string]bool{"README.md": true}
	entries, err := os.ReadDir("../docs")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.IsDir() {
			files["docs/"+e.Name()] = true
		}
	}
	checkDocLinks(t, "..", files)
}

// checkDocLinks checks the relative links of README.md and docs/*.md
// under root: markdown links and images ([text](target), ![alt](target),
// [id]: target), HTML src= and href=, and README.md's plain mentions of
// docs/NAME outside code. Each target, without its #fragment, must be
// one of files (paths relative to root, "/"-separated): the package's
// file list, or the tree's.
func checkDocLinks(t *testing.T, root string, files map[string]bool) {
	t.Helper()
	var pages []string
	for f := range files {
		if f == "README.md" || (strings.HasPrefix(f, "docs/") && strings.HasSuffix(f, ".md")) {
			pages = append(pages, f)
		}
	}
	slices.Sort(pages)
	if !slices.Contains(pages, "README.md") || len(pages) < 2 {
		t.Fatalf("documentation pages: got %q, want README.md and docs/*.md", pages)
	}
	for _, page := range pages {
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(page)))
		if err != nil {
			t.Fatal(err)
		}
		links := docLinks(string(b), page == "README.md")
		if page == "README.md" && len(links) == 0 {
			t.Errorf("README.md: no links found (the parser or the README changed)")
		}
		for _, l := range links {
			target, _, _ := strings.Cut(l.target, "#")
			if target == "" {
				continue // a link within the page
			}
			resolved := path.Clean(path.Join(path.Dir(page), target))
			if strings.HasPrefix(resolved, "../") || !files[resolved] {
				t.Errorf("%s:%d: link %q resolves to %s, which is not among the documentation's files", page, l.line, l.target, resolved)
			}
		}
	}
}

type docLink struct {
	line   int
	target string
}

var (
	mdLinkRe   = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	mdRefRe    = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	htmlLinkRe = regexp.MustCompile(`(?i)\b(?:src|href)\s*=\s*"([^"]+)"`)
	docNameRe  = regexp.MustCompile(`(?:^|[\s(])(docs/[A-Za-z0-9._-]+\.(?:md|png|xml))\b`)
	schemeRe   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
)

// docLinks returns the relative link targets of a markdown page outside
// fenced code blocks and code spans; with mentions, also the docs/NAME
// paths its text names.
func docLinks(doc string, mentions bool) []docLink {
	var out []docLink
	fence := ""
	for i, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		// Code spans hold commands and paths, not links.
		segs := strings.Split(line, "`")
		var text strings.Builder
		for j := 0; j < len(segs); j += 2 {
			text.WriteString(segs[j])
			text.WriteString(" ")
		}
		var targets []string
		for _, re := range []*regexp.Regexp{mdLinkRe, htmlLinkRe} {
			for _, m := range re.FindAllStringSubmatch(text.String(), -1) {
				targets = append(targets, m[1])
			}
		}
		if m := mdRefRe.FindStringSubmatch(line); m != nil {
			targets = append(targets, m[1])
		}
		if mentions {
			for _, m := range docNameRe.FindAllStringSubmatch(text.String(), -1) {
				targets = append(targets, m[1])
			}
		}
		for _, tg := range targets {
			if schemeRe.MatchString(tg) || strings.HasPrefix(tg, "//") || strings.HasPrefix(tg, "/") {
				continue // a URL or an absolute path: not the package's to resolve
			}
			out = append(out, docLink{line: i + 1, target: tg})
		}
	}
	return out
}
