package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress draws a bar on a terminal (redrawn in place) or, when the
// output is a file or pipe, prints a line whenever the phase changes.
type progress struct {
	mu          sync.Mutex
	w           io.Writer
	tty         bool
	total, done float64
	phase       string
	start, last time.Time
}

func newProgress(w io.Writer, tty bool, total float64) *progress {
	return &progress{w: w, tty: tty, total: total, start: time.Now()}
}

func (p *progress) setPhase(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.phase = fmt.Sprintf(format, args...)
	if !p.tty {
		fmt.Fprintf(p.w, "[%3.0f%%] %6s  %s\n", p.pct(), time.Since(p.start).Round(time.Second), p.phase)
		return
	}
	p.draw()
}

func (p *progress) add(units float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += units
	if p.tty && time.Since(p.last) > 100*time.Millisecond {
		p.draw()
	}
}

func (p *progress) pct() float64 {
	if p.total <= 0 {
		return 0
	}
	return min(100, 100*p.done/p.total)
}

func (p *progress) draw() {
	p.last = time.Now()
	const width = 30
	n := int(p.pct() / 100 * width)
	fmt.Fprintf(p.w, "\r\033[K[%s%s] %3.0f%% %6s  %s", strings.Repeat("#", n), strings.Repeat(".", width-n),
		p.pct(), time.Since(p.start).Round(time.Second), p.phase)
}

// finish ends the bar's line.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = p.total
	if p.tty {
		p.draw()
		fmt.Fprintln(p.w)
	}
}
