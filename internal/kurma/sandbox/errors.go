package sandbox

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// Sentinels a caller can branch on with errors.Is.
var (
	// ErrTimeout: the call ran past its timeout and its tree was killed.
	ErrTimeout = errors.New("timed out")
	// ErrOutputTooLarge: the call wrote more than the stdout limit and was
	// killed.
	ErrOutputTooLarge = errors.New("stdout over the limit")
	// ErrSetup: the sandbox could not be built or the executable could not
	// be started (missing, not executable, bad rootfs).
	ErrSetup = errors.New("sandbox setup failed")
	// ErrExit: the executable exited non-zero or died of a signal.
	ErrExit = errors.New("exited unsuccessfully")
	// ErrMainExecDown: a network's main exec is not running (see
	// Supervisor.Err).
	ErrMainExecDown = errors.New("main exec is down")
)

// Error is a failed call. Err is one of the sentinels above (possibly
// wrapped with detail) or the caller's context error.
type Error struct {
	Path     string // the executable inside the image
	Err      error
	ExitCode int    // the exit status; -1 when killed by a signal or never started
	Signal   string // the signal that ended it, if one did
	Stderr   []byte // the last bytes of its stderr
	// CNI is the CNI error object the executable printed on stdout before
	// failing, if it printed one.
	CNI *types.Error
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ", e.Path)
	switch {
	case errors.Is(e.Err, ErrExit) && e.Signal != "":
		fmt.Fprintf(&b, "killed by %s", e.Signal)
	case errors.Is(e.Err, ErrExit):
		fmt.Fprintf(&b, "exit status %d", e.ExitCode)
	default:
		b.WriteString(e.Err.Error())
	}
	if e.CNI != nil {
		fmt.Fprintf(&b, ": CNI error %d: %s", e.CNI.Code, e.CNI.Msg)
		if e.CNI.Details != "" {
			fmt.Fprintf(&b, " (%s)", e.CNI.Details)
		}
	}
	if s := lastLines(e.Stderr, 3, 512); s != "" {
		fmt.Fprintf(&b, "; stderr: %s", s)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// parseCNIError returns the CNI error object in out, if out is one: a JSON
// object with a non-zero code and a message.
func parseCNIError(out []byte) *types.Error {
	out = bytes.TrimSpace(out)
	if len(out) == 0 || out[0] != '{' {
		return nil
	}
	var e types.Error
	if err := json.Unmarshal(out, &e); err != nil || e.Code == 0 || e.Msg == "" {
		return nil
	}
	return &e
}

// lastLines is the last n non-empty lines of b joined by " | ", at most max
// bytes (the tail kept).
func lastLines(b []byte, n, max int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var keep []string
	for i := len(lines) - 1; i >= 0 && len(keep) < n; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			keep = append([]string{l}, keep...)
		}
	}
	s := strings.Join(keep, " | ")
	if len(s) > max {
		s = "…" + s[len(s)-max:]
	}
	return strings.ToValidUTF8(s, "?")
}

// limitWriter keeps up to limit bytes; the first write past the limit calls
// over once and fails, which stops the copy.
type limitWriter struct {
	buf   bytes.Buffer
	limit int
	over  func()
	hit   bool
}

func (w *limitWriter) Write(p []byte) (int, error) {
	if w.hit {
		return 0, ErrOutputTooLarge
	}
	if w.buf.Len()+len(p) > w.limit {
		w.hit = true
		w.buf.Write(p[:w.limit-w.buf.Len()])
		if w.over != nil {
			w.over()
		}
		return 0, ErrOutputTooLarge
	}
	return w.buf.Write(p)
}

// tailWriter keeps the last limit bytes written and counts the rest.
type tailWriter struct {
	buf     []byte
	limit   int
	dropped int64
}

func (w *tailWriter) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= w.limit {
		w.dropped += int64(len(w.buf) + len(p) - w.limit)
		w.buf = append(w.buf[:0], p[len(p)-w.limit:]...)
		return n, nil
	}
	if over := len(w.buf) + len(p) - w.limit; over > 0 {
		w.dropped += int64(over)
		w.buf = append(w.buf[:0], w.buf[over:]...)
	}
	w.buf = append(w.buf, p...)
	return n, nil
}

// bytes is the kept tail, marked when something was dropped.
func (w *tailWriter) bytes() []byte {
	if w.dropped == 0 {
		return w.buf
	}
	return append([]byte(fmt.Sprintf("[%d earlier bytes dropped]\n", w.dropped)), w.buf...)
}
