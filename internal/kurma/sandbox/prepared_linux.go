package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skeinnet/skein/internal/kurma/sandbox/sandboxinit"
)

// A warm init (pool_linux.go) takes the process start and the namespaces
// off a call's path, but the call still waits for its filesystem: a tmpfs,
// an overlay over the image, /proc, /sys, /dev and the masks, pivot_root
// and the detach of the copied host tree — about 2.5 ms of a 4.5 ms call
// on the machines of docs/benchmarks/kurma.md, and more on a host with
// many mounts. All of it depends only on the call's layout (the image, the
// netns directories, the state directory), which is the same for every
// call of a network. So once a layout has been called, the Sandbox keeps a
// few inits prepared for it: each has built that layout and pivoted into
// it, and waits there for the executable, its arguments and environment.
// A call of the layout sends just those and pays for the confinement and
// the exec.
//
// A prepared init is used once, like a warm one. What it was built from is
// checked at claim time: the layout key holds the device and inode of the
// image root, the state directory and the modules directory as they were
// when it was prepared (a re-unpacked image or a re-mounted state tmpfs is
// another key), and the netns paths are checked inside the new root (a pin
// that did not propagate makes the call start another way, as for warm
// inits). Layouts unused for preparedIdle lose their inits, and at most
// maxLayouts are kept (the least recently used goes first), so a removed
// network or image is not held for long.

const (
	// preparedIdle is how long a layout keeps its prepared inits without
	// a call.
	preparedIdle = 2 * time.Minute
	// maxLayouts bounds the layouts kept prepared at once.
	maxLayouts = 8
	// prepareTimeout bounds building a layout ahead of need.
	prepareTimeout = 10 * time.Second
	// maxPerLayout bounds the inits one layout keeps: it keeps as many as
	// it has seen calls at once (at least the Sandbox's Prestart), so a
	// burst of attaches finds one each the next time. A waiting init is a
	// small process (~2.6 MB resident, most of it shared pages) and a
	// mount namespace of ~20 mounts.
	maxPerLayout = 8
	// maxPrepared bounds the inits kept across layouts.
	maxPrepared = 32
)

// prepared is the Sandbox's prepared inits, by layout.
type prepared struct {
	sb   *Sandbox
	size int           // inits kept per layout
	idle time.Duration // preparedIdle; shorter in tests
	// attempts counts the inits started (tests: a layout that cannot be
	// built is not tried again and again).
	attempts atomic.Int64

	mu      sync.Mutex
	layouts map[string]*layoutInits
	closed  bool
	wg      sync.WaitGroup
}

// layoutInits are the inits prepared for one layout.
type layoutInits struct {
	key    string
	layout *sandboxinit.Spec // without Path, Args, Env; Cgroups set per init
	ready  []*warmInit
	used   time.Time
	// running is the calls of the layout under way; want the inits to
	// keep: the most calls seen at once, between the Sandbox's size and
	// maxPerLayout.
	running, want int
	// filling: a filler runs. failed: the last preparation failed; no
	// more are tried until a call of the layout succeeds another way.
	filling, failed bool
	idle            *time.Timer
}

func newPrepared(sb *Sandbox, size int) *prepared {
	return &prepared{sb: sb, size: size, idle: preparedIdle, layouts: map[string]*layoutInits{}}
}

// layoutOf splits is into the layout a prepared init builds, its key, and
// the part a call sends (the executable and the paths to check inside the
// new root). ok is false for a spec no prepared init can serve.
func layoutOf(is *sandboxinit.Spec) (key string, layout, call *sandboxinit.Spec, ok bool) {
	l := *is
	l.Path, l.Args, l.Env, l.Cgroups = "", nil, nil, nil
	l.Expect = nil
	c := &sandboxinit.Spec{Path: is.Path, Args: is.Args, Env: is.Env}
	// The host paths behind the mounts go into the key; the netns paths
	// (the pin and the directories bound at their own paths) are checked
	// by the init, where they keep their names.
	inRoot := func(p string) bool {
		return slices.ContainsFunc(is.NetNSDirs, func(d string) bool {
			return p == d || strings.HasPrefix(p, d+"/")
		})
	}
	for _, f := range is.Expect {
		if inRoot(f.Path) {
			c.Expect = append(c.Expect, f)
		} else {
			l.Expect = append(l.Expect, f)
		}
	}
	raw, err := json.Marshal(&l)
	if err != nil {
		return "", nil, nil, false
	}
	return string(raw), &l, c, true
}

// take returns an init prepared for key, or nil; either way the layout
// counts as used now, by one more call until done.
func (p *prepared) take(key string, layout *sandboxinit.Spec) *warmInit {
	if p.size == 0 {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	li := p.useLocked(key, layout)
	if li == nil {
		return nil
	}
	li.running++
	li.want = min(max(li.want, li.running), maxPerLayout)
	if len(li.ready) == 0 {
		return nil
	}
	w := li.ready[0]
	li.ready = li.ready[1:]
	return w
}

// useLocked returns key's entry, made if new, marked used now; nil once
// closed.
func (p *prepared) useLocked(key string, layout *sandboxinit.Spec) *layoutInits {
	if p.closed {
		return nil
	}
	li := p.layouts[key]
	if li == nil {
		li = &layoutInits{key: key, layout: layout, want: p.size}
		p.layouts[key] = li
	}
	li.used = time.Now()
	p.evictLocked()
	p.armIdleLocked(li)
	return li
}

// done ends a call of key (taken with take) and refills the layout.
// ran says the call's sandbox worked: a layout whose preparation failed is
// tried again only then.
func (p *prepared) done(key string, ran bool) {
	if p.size == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if li := p.layouts[key]; li != nil && li.running > 0 {
		li.running--
	}
	p.refillLocked(key, ran)
}

// refillLocked prepares inits for key in the background up to the number
// the layout wants, one filler per layout.
func (p *prepared) refillLocked(key string, succeeded bool) {
	li := p.layouts[key]
	if p.closed || li == nil || li.filling || len(li.ready) >= li.want {
		return
	}
	if li.failed && !succeeded {
		return
	}
	li.failed, li.filling = false, true
	p.wg.Go(func() {
		for {
			p.mu.Lock()
			if p.closed || p.layouts[key] != li || len(li.ready) >= li.want || p.totalLocked() >= maxPrepared {
				li.filling = false
				p.mu.Unlock()
				return
			}
			p.mu.Unlock()
			p.attempts.Add(1)
			w, err := p.sb.prepare(li.layout)
			p.mu.Lock()
			if err != nil || p.closed || p.layouts[key] != li {
				li.filling = false
				if err != nil {
					li.failed = true
					p.sb.opts.Logger.Debug("sandbox: could not prepare an init", "rootfs", li.layout.Rootfs, "err", err)
				}
				p.mu.Unlock()
				if w != nil {
					w.discard()
				}
				return
			}
			li.ready = append(li.ready, w)
			p.mu.Unlock()
		}
	})
}

// totalLocked is how many inits are prepared across layouts.
func (p *prepared) totalLocked() int {
	n := 0
	for _, li := range p.layouts {
		n += len(li.ready)
	}
	return n
}

// evictLocked drops the least recently used layouts past maxLayouts.
func (p *prepared) evictLocked() {
	for len(p.layouts) > maxLayouts {
		var oldest *layoutInits
		for _, li := range p.layouts {
			if oldest == nil || li.used.Before(oldest.used) {
				oldest = li
			}
		}
		p.dropLocked(oldest)
	}
}

// armIdleLocked (re)starts li's idle timer.
func (p *prepared) armIdleLocked(li *layoutInits) {
	if li.idle != nil {
		li.idle.Stop()
	}
	li.idle = time.AfterFunc(p.idle, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.layouts[li.key] == li && time.Since(li.used) >= p.idle {
			p.dropLocked(li)
		}
	})
}

// dropLocked forgets li and ends its inits (in the background: discard
// waits for each to exit).
func (p *prepared) dropLocked(li *layoutInits) {
	delete(p.layouts, li.key)
	if li.idle != nil {
		li.idle.Stop()
	}
	ws := li.ready
	li.ready = nil
	if len(ws) > 0 {
		p.wg.Go(func() {
			for _, w := range ws {
				w.discard()
			}
		})
	}
}

// forget drops the layouts match selects (a state directory released).
func (p *prepared) forget(match func(layout *sandboxinit.Spec) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, li := range p.layouts {
		if match(li.layout) {
			p.dropLocked(li)
		}
	}
}

// count is how many inits are prepared for key (tests).
func (p *prepared) count(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if li := p.layouts[key]; li != nil {
		return len(li.ready)
	}
	return 0
}

// close ends every prepared init and waits for the fillers.
func (p *prepared) close() {
	p.mu.Lock()
	p.closed = true
	for _, li := range p.layouts {
		p.dropLocked(li)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// prepare starts an init that builds layout in cgroups of its own and
// returns once it waits for its call; a failure to build is an error
// carrying the init's reason.
func (s *Sandbox) prepare(layout *sandboxinit.Spec) (*warmInit, error) {
	cg, err := s.newCgroup("")
	if err != nil {
		return nil, err
	}
	l := *layout
	l.Cgroups = cg.procs()
	raw, err := json.Marshal(&l)
	if err != nil {
		s.dropCgroup(cg)
		return nil, fmt.Errorf("encode sandbox layout: %w", err)
	}
	w := &warmInit{sb: s, cg: cg}
	env := []string{sandboxinit.PreparedEnv + "=1", sandboxinit.SpecEnv + "=" + string(raw)}
	var pass []*os.File
	if s.execFile != nil && !s.execOff.Load() {
		// fd 6 (ReadyFD + 1): sandboxinit.ExecFD
		w.helper, pass = true, []*os.File{s.execFile}
		env = append(env, sandboxinit.ExecEnv+"=1")
	}
	reads, err := s.startWaiting(w, 1, pass, env...)
	if err != nil {
		w.closeFiles()
		s.dropCgroup(cg)
		return nil, err
	}
	ready := reads[0] // fd 5
	defer ready.Close()
	ready.SetReadDeadline(time.Now().Add(prepareTimeout))
	msg, rerr := io.ReadAll(io.LimitReader(ready, 64))
	if string(msg) != sandboxinit.ReadyMsg {
		// It failed to build (its reason is on the status pipe), or
		// hangs.
		if rerr != nil {
			w.cmd.Process.Kill()
		}
		why, _ := io.ReadAll(io.LimitReader(w.status, 4096))
		w.discard()
		if w.helper && strings.HasPrefix(string(why), sandboxinit.ExecFailed) {
			s.helperFailed(string(why))
		}
		if len(why) == 0 {
			why = []byte("not ready after " + prepareTimeout.String())
		}
		return nil, errors.New(string(why))
	}
	return w, nil
}
