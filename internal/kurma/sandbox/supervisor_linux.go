package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// SupervisorOptions describe a network's main exec. Zero values mean the
// documented defaults.
type SupervisorOptions struct {
	// Network names the network in errors and logs.
	Network string
	// Spec is the main exec: the image's entry point as Path and Args, the
	// network's config as Stdin (the contract: config on stdin, no
	// arguments). Its Timeout is ignored: a main exec runs until Close.
	Spec Spec
	// MinBackoff is the delay before the first restart. Default 1 s.
	MinBackoff time.Duration
	// MaxBackoff caps the delay, which doubles after every run shorter than
	// StableAfter. Default 1 min.
	MaxBackoff time.Duration
	// StableAfter is how long a run must last for the next restart to wait
	// only MinBackoff again. Default 30 s.
	StableAfter time.Duration
	// StopGrace is how long Close waits after SIGTERM before SIGKILL.
	// Default 5 s. (As PID 1 of its namespace the main exec only sees
	// SIGTERM if it handles it; one without a handler is killed at once.)
	StopGrace time.Duration
	// Logger gets the main exec's output lines and its exits. Default
	// slog.Default().
	Logger *slog.Logger
}

// Supervisor keeps a network's main exec running in a sandbox: it restarts
// it with exponential backoff whenever it exits, and kills its whole tree on
// Close. Adds consult Err first and fail at once while it is down.
type Supervisor struct {
	sb   *Sandbox
	opts SupervisorOptions
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once

	mu sync.Mutex
	st Status
}

// Status is a snapshot of a main exec's life.
type Status struct {
	Up       bool
	PID      int       // in the host's PID namespace, while up
	Starts   int       // successful starts so far
	Since    time.Time // when it last started or went down
	LastExit string    // how the last run (or start attempt) ended
	Next     time.Time // when it will be started again, while down
	Closed   bool
}

// DownError is Supervisor.Err's answer while the main exec is not running.
type DownError struct {
	Network  string
	RetryIn  time.Duration // 0 once closed
	LastExit string
	Closed   bool
}

func (e *DownError) Error() string {
	if e.Closed {
		return fmt.Sprintf("main exec of network %q is stopped", e.Network)
	}
	return fmt.Sprintf("main exec of network %q is down (restarting in %s): last exit: %s",
		e.Network, e.RetryIn.Round(100*time.Millisecond), e.LastExit)
}

func (e *DownError) Unwrap() error { return ErrMainExecDown }

// Supervise starts o.Spec as a network's main exec and keeps it running
// until Close. A spec that cannot start at all (bad paths, a missing
// executable) is an error and leaves nothing running; any later exit or
// failed restart is retried with backoff.
func (s *Sandbox) Supervise(o SupervisorOptions) (*Supervisor, error) {
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Minute
	}
	o.MaxBackoff = max(o.MaxBackoff, o.MinBackoff)
	if o.StableAfter <= 0 {
		o.StableAfter = 30 * time.Second
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	sv := &Supervisor{sb: s, opts: o, done: make(chan struct{}),
		log: o.Logger.With("network", o.Network, "mainExec", o.Spec.Path)}
	sv.ctx, sv.cancel = context.WithCancel(context.Background())
	r, err := sv.start()
	if err != nil {
		sv.cancel()
		return nil, fmt.Errorf("start main exec of network %q: %w", o.Network, err)
	}
	go sv.loop(r)
	return sv, nil
}

// Up reports whether the main exec is running.
func (sv *Supervisor) Up() bool {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.st.Up
}

// Err is nil while the main exec runs, and otherwise a *DownError (wrapping
// ErrMainExecDown) saying when it restarts and how it last ended: the
// message an add reports when it fails because of it.
func (sv *Supervisor) Err() error {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.st.Up {
		return nil
	}
	return &DownError{Network: sv.opts.Network, RetryIn: max(0, time.Until(sv.st.Next)),
		LastExit: sv.st.LastExit, Closed: sv.st.Closed}
}

// Status returns a snapshot.
func (sv *Supervisor) Status() Status {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.st
}

// Close stops the main exec (SIGTERM if it has a handler for it, SIGKILL
// after StopGrace or at once if not; everything it started dies with it)
// and the restarts. It returns when the tree is gone. Safe to call more
// than once.
func (sv *Supervisor) Close() error {
	sv.once.Do(func() {
		sv.mu.Lock()
		sv.st.Closed = true
		sv.mu.Unlock()
		sv.cancel()
	})
	<-sv.done
	return nil
}

// mainRun is one run of the main exec: its process, the tail of its
// stderr, and done, which removes its cgroups once it has been waited for.
type mainRun struct {
	cmd  *exec.Cmd
	tail *tailWriter
	done func()
}

// start starts one run and marks the supervisor up.
func (sv *Supervisor) start() (*mainRun, error) {
	tail := &tailWriter{limit: 4 << 10}
	stderr := &multiWriter{tail, &lineLogger{log: sv.log, stream: "stderr"}}
	stdout := &lineLogger{log: sv.log, stream: "stdout"}
	cmd, done, err := sv.sb.start(sv.ctx, sv.opts.Spec, stdout, stderr, stopHow{signal: syscall.SIGTERM, grace: sv.opts.StopGrace})
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Stderr = tail.bytes()
		}
		return nil, err
	}
	sv.mu.Lock()
	sv.st.Up, sv.st.PID, sv.st.Since, sv.st.Next = true, cmd.Process.Pid, time.Now(), time.Time{}
	sv.st.Starts++
	sv.mu.Unlock()
	sv.log.Info("main exec started", "pid", cmd.Process.Pid)
	return &mainRun{cmd: cmd, tail: tail, done: done}, nil
}

// loop waits for each run to end and starts the next after the backoff.
// r is nil when a start failed; ended then says why.
func (sv *Supervisor) loop(r *mainRun) {
	defer close(sv.done)
	var (
		backoff time.Duration
		ended   string
	)
	for {
		ran := time.Duration(0)
		if r != nil {
			began := time.Now()
			werr := r.cmd.Wait()
			r.done()
			ran = time.Since(began)
			ended = describeExit(sv.opts.Spec.Path, werr, r.tail.bytes())
		}
		if sv.ctx.Err() != nil {
			sv.setDown(ended, time.Time{})
			sv.log.Info("main exec stopped")
			return
		}
		// The first restart, and any after a run that lasted, wait the
		// minimum; a quick failure doubles the wait.
		if backoff == 0 || ran >= sv.opts.StableAfter {
			backoff = sv.opts.MinBackoff
		} else {
			backoff = min(2*backoff, sv.opts.MaxBackoff)
		}
		sv.setDown(ended, time.Now().Add(backoff))
		sv.log.Warn("main exec down", "lastExit", ended, "restartIn", backoff)
		select {
		case <-time.After(backoff):
		case <-sv.ctx.Done():
			sv.setDown(ended, time.Time{})
			return
		}
		var err error
		if r, err = sv.start(); err != nil {
			r, ended = nil, err.Error()
		}
	}
}

func (sv *Supervisor) setDown(lastExit string, next time.Time) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	sv.st.Up, sv.st.PID, sv.st.Since, sv.st.Next, sv.st.LastExit = false, 0, time.Now(), next, lastExit
}

// describeExit says how a run ended, with its last stderr lines.
func describeExit(path string, werr error, stderr []byte) string {
	e := &Error{Path: path, Err: ErrExit, ExitCode: 0, Stderr: stderr}
	var ee *exec.ExitError
	switch {
	case werr == nil:
		e.Err = errors.New("exited with status 0")
	case errors.As(werr, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal, e.ExitCode = ws.Signal().String(), -1
		} else {
			e.ExitCode = ee.ExitCode()
		}
	default:
		e.Err = fmt.Errorf("wait: %w", werr)
	}
	return e.Error()
}

// lineLogger logs what a main exec writes, a line at a time (long lines
// cut at 1 KiB).
type lineLogger struct {
	log    *slog.Logger
	stream string
	buf    []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	const maxLine = 1024
	l.buf = append(l.buf, p...)
	for {
		line, rest, found := bytes.Cut(l.buf, []byte{'\n'})
		switch {
		case found && len(line) <= maxLine:
			l.buf = rest
		case len(l.buf) > maxLine:
			line, l.buf = l.buf[:maxLine], l.buf[maxLine:]
		default:
			return len(p), nil
		}
		l.log.Info("main exec output", "stream", l.stream, "line", string(bytes.TrimRight(line, "\r")))
	}
}

type multiWriter []interface{ Write([]byte) (int, error) }

func (m *multiWriter) Write(p []byte) (int, error) {
	for _, w := range *m {
		w.Write(p)
	}
	return len(p), nil
}
