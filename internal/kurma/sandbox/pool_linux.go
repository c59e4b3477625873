package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit"
)

// A cold start pays, on the call's path, for starting the init (fork, exec,
// the Go runtime's start-up) and creating its namespaces: most of a
// sandboxed call's overhead. So the Sandbox keeps a few inits started ahead
// of need. Each waits in its fresh namespaces, its mounts already slaves of
// the host's, for a spec on a pipe; a call claims one and sends the spec,
// the init builds the mounts (while Spec.Wait holds the call, if set) and
// execs on the sandbox's go. Its replacement starts in the background once
// the call is over. A waiting init holds nothing of the host that the host could
// not remove (its mounts follow the host's), and dies with skeind
// (Pdeathsig) or when Close closes its spec pipe.

// errStale: a warm init died while it waited, or its copy of the host's
// mounts lacks one made since (sandboxinit.Spec.Expect); start cold instead.
var errStale = errors.New("warm sandbox init gone")

// aheadNice is the nice value of an init started ahead of need while it
// starts, builds and waits. A burst of calls refills the inits it took
// while its later calls still run; at the default the refills took CPU
// from them (8 attaches at once: 1.18–1.29 × direct ptp's time, 1.10–1.14
// × niced; docs/benchmarks/kurma.md).
const aheadNice = 19

type pool struct {
	sb    *Sandbox
	ready chan *warmInit

	mu      sync.Mutex
	filling bool
	closed  bool
	wg      sync.WaitGroup

	// Calls started each way, for tests and metrics; viaHelper counts the
	// prepared ones skein-sandbox-exec exec'd.
	warm, cold, prep, viaHelper atomic.Int64
}

// warmInit is an init waiting for its spec, with the parent's ends of its
// pipes.
type warmInit struct {
	sb  *Sandbox
	cmd *exec.Cmd
	// cg holds the init since its start; the call that claims it owns
	// it from then on.
	cg                     *callCgroup
	spec, stdin            *os.File // write ends
	status, stdout, stderr *os.File // read ends
	// mntns holds the init's mount namespace, so that tearing it down
	// (unmounting its tree, which waits for an RCU grace period) happens
	// when the caller closes it after the call, not on the exit path the
	// call waits for.
	mntns *os.File
	// niced: started at aheadNice (every thread); baseNice is the nice
	// value it had before, which the call gets back.
	niced    bool
	baseNice int
	// helper: a prepared init that execs skein-sandbox-exec, which
	// reads the call as encodeCall writes it.
	helper bool
}

// holdMounts opens the mount namespace of w's init (see warmInit.mntns).
// Not fatal: without it the teardown is only slower.
func (w *warmInit) holdMounts() {
	w.mntns, _ = os.Open(fmt.Sprintf("/proc/%d/ns/mnt", w.cmd.Process.Pid))
}

func newPool(sb *Sandbox, size int) *pool {
	return &pool{sb: sb, ready: make(chan *warmInit, size)}
}

// take returns a ready warm init, or nil. The caller tops the pool up
// (refill) once its call is over: a replacement started at once would
// compete with the call for the CPUs.
func (p *pool) take() *warmInit {
	select {
	case w := <-p.ready:
		return w
	default:
		return nil
	}
}

// refill starts warm inits in the background until the pool is full; one
// filler at a time. A failed start ends the round; the next take tries
// again.
func (p *pool) refill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filling || p.closed || cap(p.ready) == 0 || len(p.ready) == cap(p.ready) {
		return
	}
	p.filling = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			p.mu.Lock()
			if p.closed || len(p.ready) == cap(p.ready) {
				p.filling = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			w, err := p.sb.prestart()
			p.mu.Lock()
			if err != nil || p.closed {
				p.filling = false
				p.mu.Unlock()
				if w != nil {
					w.discard()
				}
				return
			}
			p.ready <- w // only this filler adds, and there is room
			p.mu.Unlock()
		}
	}()
}

// close stops the filler and the waiting inits.
func (p *pool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
	for {
		select {
		case w := <-p.ready:
			w.discard()
		default:
			return
		}
	}
}

// prestart starts an init that waits for its spec.
func (s *Sandbox) prestart() (*warmInit, error) {
	w := &warmInit{sb: s}
	if _, err := s.startWaiting(w, 0, nil, sandboxinit.WarmEnv+"=1"); err != nil {
		w.closeFiles()
		return nil, err
	}
	// The call's cgroups are made now and the init moved into them before
	// it counts as ready: both off the call's path. (On cgroup v1 a move
	// waits for an RCU grace period, several milliseconds; a cold start
	// pays it on the call's path.)
	var err error
	if w.cg, err = s.newCgroup(""); err == nil {
		err = w.cg.add(w.cmd.Process.Pid)
	}
	if err != nil {
		w.discard()
		return nil, err
	}
	return w, nil
}

// startWaiting starts an init with env (added to initCommand's) that
// waits: its stdin, stdout, stderr, status (fd 3) and spec (fd 4) pipes
// end in w, and it holds the write ends of extra more pipes (fds 5 on),
// whose read ends are returned, and pass after those. The child's ends are
// closed here; on failure the caller closes w's (closeFiles).
func (s *Sandbox) startWaiting(w *warmInit, extra int, pass []*os.File, env ...string) ([]*os.File, error) {
	type end struct {
		ours       **os.File
		childReads bool
	}
	ends := []end{{&w.stdin, true}, {&w.stdout, false}, {&w.stderr, false}, {&w.status, false}, {&w.spec, true}}
	reads := make([]*os.File, extra)
	for i := range reads {
		ends = append(ends, end{&reads[i], false})
	}
	var child []*os.File
	defer func() {
		for _, f := range child {
			f.Close()
		}
	}()
	fail := func(err error) ([]*os.File, error) {
		for _, f := range reads {
			if f != nil {
				f.Close()
			}
		}
		return nil, err
	}
	for _, e := range ends {
		r, wr, err := os.Pipe()
		if err != nil {
			return fail(fmt.Errorf("sandbox pipe: %w", err))
		}
		if e.childReads {
			*e.ours, child = wr, append(child, r)
		} else {
			*e.ours, child = r, append(child, wr)
		}
	}
	cmd := s.initCommand(context.Background(), env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = child[0], child[1], child[2]
	cmd.ExtraFiles = append(child[3:], pass...) // fds 3, 4, ...
	// Starting ahead runs behind the calls under way: the init's threads
	// (the main one starts the runtime, builds a prepared layout, and
	// execs the call) are born at aheadNice, take the CPU only when no
	// call wants it, and get their nice value back when claimed
	// (restoreNice).
	var err error
	if s.canNice {
		w.baseNice, err = startNiced(cmd, aheadNice, s.opts.Logger)
		w.niced = err == nil && w.baseNice < aheadNice
	} else {
		err = startLocked(cmd)
	}
	if err != nil {
		return fail(fmt.Errorf("start sandbox init %s: %w", s.opts.InitPath, err))
	}
	w.cmd = cmd
	w.holdMounts()
	return reads, nil
}

// restoreNice gives every thread of the waiting init the nice value it
// started with, before it reads the spec: the call runs at the priority it
// would have started cold with. Every thread, not only the main one that
// execs: exec waits for each of the Go runtime's other threads to exit,
// which at nice 19 behind busy cores would run the call's start behind
// everything else. Only the main thread's failure is an error; the others
// are set where /proc lists them as this init's (s.ownProc).
func (w *warmInit) restoreNice() error {
	pid := w.cmd.Process.Pid
	if err := unix.Setpriority(unix.PRIO_PROCESS, pid, w.baseNice); err != nil {
		return err
	}
	if w.sb.ownProc {
		setThreadsNice(pid, w.baseNice)
	}
	return nil
}

// setThreadsNice sets the nice value of the threads of process pid other
// than the main one, as /proc lists them, until a pass finds no thread it
// had not set (a thread made meanwhile by one not yet set), at most four
// passes. Threads that exit meanwhile are skipped.
func setThreadsNice(pid, nice int) {
	done := map[int]bool{pid: true}
	for range 4 {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return
		}
		fresh := false
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil || done[tid] {
				continue
			}
			done[tid], fresh = true, true
			unix.Setpriority(unix.PRIO_PROCESS, tid, nice)
		}
		if !fresh {
			return
		}
	}
}

// claim hands is to the waiting init, feeds it stdin and collects its
// output, like a cold start: it returns once the executable runs, with the
// function that waits for it; or an *Error wrapping ErrSetup; or errStale;
// or the error of wait (Spec.Wait, called once the init has the spec), the
// init then killed before it exec'd. Cancelling ctx kills the tree.
func (w *warmInit) claim(ctx context.Context, is *sandboxinit.Spec, stdin []byte, stdout, stderr io.Writer, wait func(context.Context) error) (func() error, error) {
	raw, err := w.encode(is)
	if err != nil {
		w.discard()
		return nil, fmt.Errorf("encode sandbox spec: %w", err)
	}
	if w.niced {
		if err := w.restoreNice(); err != nil {
			w.discard()
			return nil, errStale
		}
	}
	if _, err := w.spec.Write(raw); err != nil {
		w.discard()
		return nil, errStale
	}
	if wait != nil {
		// The init execs only once it has the go: killed before, it
		// never ran the executable. The caller keeps the mount
		// namespace (released in the background, as after a call).
		if err := wait(ctx); err != nil {
			w.cmd.Process.Kill()
			w.mntns = nil
			w.discard()
			return nil, err
		}
	}
	// The go. An init that failed meanwhile has closed its end (EPIPE
	// here); its status pipe says why.
	io.WriteString(w.spec, sandboxinit.GoMsg)
	w.spec.Close()
	stopKill := context.AfterFunc(ctx, func() { w.cmd.Process.Kill() })

	var copies sync.WaitGroup
	copies.Go(func() {
		w.stdin.Write(stdin) // EPIPE when it never reads: fine
		w.stdin.Close()
	})
	copyOut := func(dst io.Writer, src *os.File) {
		io.Copy(dst, src)
		src.Close()
	}
	copies.Go(func() { copyOut(stdout, w.stdout) })
	copies.Go(func() { copyOut(stderr, w.stderr) })
	// The tree dies with the init, so the pipes reach EOF at once; the
	// bound only covers a kernel surprise, as WaitDelay does for cold
	// starts.
	join := func() {
		done := make(chan struct{})
		go func() { copies.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			w.stdout.Close()
			w.stderr.Close()
			<-done
		}
	}

	err = awaitExec(w.status, ctx)
	w.status.Close()
	if err == nil && w.helper {
		w.sb.pool.viaHelper.Add(1)
	}
	if err != nil {
		w.cmd.Wait()
		join()
		stopKill()
		if strings.Contains(err.Error(), sandboxinit.StaleView) {
			return nil, errStale
		}
		return nil, &Error{Path: is.Path, Err: err, ExitCode: -1}
	}
	return func() error {
		err := w.cmd.Wait()
		join()
		stopKill()
		return err
	}, nil
}

// encode is is as w's init reads it.
func (w *warmInit) encode(is *sandboxinit.Spec) ([]byte, error) {
	if w.helper {
		return encodeCall(is)
	}
	return json.Marshal(is)
}

// encodeCall is is's executable, arguments, environment and expected
// files as skein-sandbox-exec reads them (see cmd/skein-sandbox-exec):
// NUL-terminated fields. A NUL inside a field cannot be passed to exec
// anyway, and is refused.
func encodeCall(is *sandboxinit.Spec) ([]byte, error) {
	b := []byte("skein-call/1\x00")
	var bad bool
	field := func(s string) {
		bad = bad || strings.IndexByte(s, 0) >= 0
		b = append(append(b, s...), 0)
	}
	count := func(n int) { field(strconv.Itoa(n)) }
	field(is.Path)
	count(len(is.Args))
	for _, a := range is.Args {
		field(a)
	}
	count(len(is.Env))
	for _, e := range is.Env {
		field(e)
	}
	count(len(is.Expect))
	for _, f := range is.Expect {
		field(f.Path)
		field(strconv.FormatUint(f.Dev, 10))
		field(strconv.FormatUint(f.Ino, 10))
	}
	if bad {
		return nil, errors.New("a NUL byte in the executable's path, arguments or environment")
	}
	if len(b)+len(sandboxinit.GoMsg) > maxCall {
		return nil, fmt.Errorf("the executable's path, arguments and environment take %d bytes, over the %d exec takes", len(b), maxCall)
	}
	return b, nil
}

// maxCall is the longest call skein-sandbox-exec reads (MAX_CALL there):
// more than exec itself takes (a quarter of the stack limit, 2 MiB by
// default).
const maxCall = 4 << 20

// discard ends a waiting init: an empty spec makes it exit.
func (w *warmInit) discard() {
	w.closeFiles()
	if w.cmd != nil {
		w.cmd.Wait()
	}
	w.sb.dropCgroup(w.cg)
}

func (w *warmInit) closeFiles() {
	for _, f := range []*os.File{w.spec, w.stdin, w.status, w.stdout, w.stderr, w.mntns} {
		if f != nil {
			f.Close()
		}
	}
}
