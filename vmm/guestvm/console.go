package guestvm

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"time"
)

const (
	// maxLine bounds one console line; the rest of a longer line is dropped.
	maxLine = 64 << 10
	// maxLog bounds the bytes of console lines kept; the oldest lines go first.
	maxLog = 16 << 20
)

// lineLog is the console's lines, kept for any number of readers, each with
// its own cursor (an absolute line number).
type lineLog struct {
	mu      sync.Mutex
	lines   []string      // protected by mu; lines[0] is line number dropped
	dropped int           // protected by mu; lines dropped from the front
	size    int           // protected by mu; bytes in lines
	closed  bool          // protected by mu; no more lines will come
	changed chan struct{} // protected by mu; closed and replaced on every change
	initAt  time.Time     // protected by mu; when the first VRDMA-INIT line came
	cmdAt   time.Time     // protected by mu; when the first VRDMA-CMD-START line came
}

func newLineLog() *lineLog {
	return &lineLog{changed: make(chan struct{})}
}

func (l *lineLog) append(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.lines = append(l.lines, s)
	l.size += len(s) + 1
	if l.initAt.IsZero() || l.cmdAt.IsZero() {
		switch k, _ := Classify(s); {
		case k == KindInit && l.initAt.IsZero():
			l.initAt = time.Now()
		case k == KindCmdStart && l.cmdAt.IsZero():
			l.cmdAt = time.Now()
		}
	}
	for l.size > maxLog && len(l.lines) > 1 {
		l.size -= len(l.lines[0]) + 1
		l.lines[0] = ""
		l.lines = l.lines[1:]
		l.dropped++
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// cmdStartTime is when the first VRDMA-CMD-START line came (zero: not yet).
func (l *lineLog) cmdStartTime() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cmdAt
}

func (l *lineLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	close(l.changed)
}

var errLogClosed = errors.New("console closed")

// next returns line number i (or the oldest kept line after it, when i was
// dropped) and the number of the line after it. It blocks until that line
// exists; it returns errLogClosed once the log is closed and read to its
// end, ctx's error when ctx ends, and errGuestClosed when stop is closed.
func (l *lineLog) next(ctx context.Context, stop <-chan struct{}, i int) (string, int, error) {
	for {
		l.mu.Lock()
		if i < l.dropped {
			i = l.dropped
		}
		if k := i - l.dropped; k < len(l.lines) {
			s := l.lines[k]
			l.mu.Unlock()
			return s, i + 1, nil
		}
		if l.closed {
			l.mu.Unlock()
			return "", i, errLogClosed
		}
		ch := l.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return "", i, ctx.Err()
		case <-stop:
			return "", i, errGuestClosed
		}
	}
}

func (l *lineLog) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	if l.dropped > 0 {
		b.WriteString("[... older console lines dropped ...]\n")
	}
	for _, s := range l.lines {
		b.WriteString(s)
		b.WriteByte('\n')
	}
	return b.String()
}

// readLines reads r line by line into l until r ends, then closes l.
// Carriage returns and NULs are removed; a line longer than maxLine is cut.
func readLines(r io.Reader, l *lineLog) {
	defer l.close()
	br := bufio.NewReaderSize(r, 4096)
	var cur []byte
	long := false
	for {
		frag, err := br.ReadSlice('\n')
		if len(frag) > 0 {
			room := maxLine - len(cur)
			if room > len(frag) {
				room = len(frag)
			}
			if room > 0 {
				cur = append(cur, frag[:room]...)
			}
			if room < len(frag) {
				long = true
			}
		}
		switch {
		case err == nil:
			l.append(cleanLine(cur, long))
			cur, long = cur[:0], false
		case errors.Is(err, bufio.ErrBufferFull):
			// More of the same line.
		default:
			if len(cur) > 0 {
				l.append(cleanLine(cur, long))
			}
			return
		}
	}
}

func cleanLine(b []byte, long bool) string {
	s := strings.TrimRight(string(b), "\n")
	if strings.ContainsAny(s, "\r\x00") {
		s = strings.NewReplacer("\r", "", "\x00", "").Replace(s)
	}
	if long {
		s += " [line cut]"
	}
	return s
}
