// Command skipsummary reads `go test -json` output on stdin, prints what
// plain `go test` would (each package's result line, and the output of
// the tests that failed), and ends with one line that says how many tests skipped and why:
//
//	SKIPPED 14 tests: needs root (9), starts a kube-apiserver (3), other (2)
//
// A package run by a user who cannot run its privileged suites still
// prints ok; this line makes the skips loud. The reason is the skip
// message (t.Skip's argument), cut at its first colon or newline;
// "other" is a skip without a message. Its exit status is 1 when a
// test or package failed, or when the input is not test2json; skips alone
// exit 0. Use it as
//
//	go test -json ./... | go run ./hack/skipsummary
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// event is one line of test2json output (cmd/test2json's TestEvent).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

func main() {
	s, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skipsummary:", err)
		os.Exit(1)
	}
	fmt.Println(s.line())
	if s.failed {
		os.Exit(1)
	}
}

// summary is what summarize found.
type summary struct {
	skips   map[string]int // reason → tests
	failed  bool
	skipped int
}

// summarize copies the tests' output from r to w and counts the skipped
// tests (subtests included) by reason.
func summarize(r io.Reader, w io.Writer) (*summary, error) {
	s := &summary{skips: map[string]int{}}
	// The output of each test so far: a skip's reason is in the lines the
	// test printed before its "skip" event.
	out := map[[2]string][]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("not go test -json output: %q: %w", sc.Text(), err)
		}
		key := [2]string{e.Package, e.Test}
		switch e.Action {
		case "output":
			if e.Test != "" {
				out[key] = append(out[key], e.Output)
			} else if e.Output != "PASS\n" {
				io.WriteString(w, e.Output)
			}
		case "skip":
			if e.Test != "" {
				s.skips[reason(out[key])]++
				s.skipped++
			}
			delete(out, key)
		case "fail":
			s.failed = true
			for _, l := range out[key] {
				io.WriteString(w, l)
			}
			delete(out, key)
		case "pass":
			delete(out, key)
		}
	}
	return s, sc.Err()
}

// reason finds the skip message in a test's output: the line after
// "--- SKIP:" (go test indents the message under it), or the last line
// of the test's own output.
func reason(lines []string) string {
	var msg string
	for i, l := range lines {
		if strings.Contains(l, "--- SKIP:") {
			if i+1 < len(lines) {
				msg = lines[i+1]
			}
			break
		}
		msg = l
	}
	msg = strings.TrimSpace(msg)
	// "file_test.go:12: needs root" → "needs root"
	if f := strings.SplitN(msg, ": ", 2); len(f) == 2 && strings.Contains(f[0], ".go:") {
		msg = f[1]
	}
	if strings.HasPrefix(msg, "=== ") || strings.HasPrefix(msg, "--- ") {
		msg = ""
	}
	msg, _, _ = strings.Cut(msg, ":")
	msg = strings.TrimSpace(msg)
	if msg == "" {
		return "other"
	}
	return msg
}

// line is the summary: "SKIPPED n tests: reason (n), …", most common first.
func (s *summary) line() string {
	if s.skipped == 0 {
		return "SKIPPED 0 tests"
	}
	reasons := make([]string, 0, len(s.skips))
	for r := range s.skips {
		reasons = append(reasons, r)
	}
	slices.SortFunc(reasons, func(a, b string) int {
		return cmp.Or(cmp.Compare(s.skips[b], s.skips[a]), cmp.Compare(a, b))
	})
	parts := make([]string, len(reasons))
	for i, r := range reasons {
		parts[i] = fmt.Sprintf("%s (%d)", r, s.skips[r])
	}
	return fmt.Sprintf("SKIPPED %d tests: %s", s.skipped, strings.Join(parts, ", "))
}
