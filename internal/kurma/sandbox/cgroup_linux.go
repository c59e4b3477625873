package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Every call and main exec gets a pids and a memory cgroup of its own,
// named <daemon pid>-<sequence> under Options.CgroupParent. The init is in
// them before it builds anything (a cold init joins them first thing,
// writing cgroup.procs itself; a warm one is moved in when it is started
// ahead of need, see pool), so the
// whole tree — the plugin, what it forks, its tmpfs pages — counts against
// the call's limits and not the daemon's. When the call ends (exit,
// timeout, cancel) every process still in them is killed, which catches
// anything that left the PID namespace's tree, and the cgroups are removed.
//
// On hosts where pids and memory are cgroup v1 hierarchies (this is what
// CLONE_INTO_CGROUP cannot handle) there is one directory per hierarchy;
// where they are on the unified (v2) hierarchy, one directory with both.
// Making and removing a cgroup costs tens of microseconds, so nothing is
// made ahead of need.

// cgroupSet is where a Sandbox makes its calls' cgroups.
type cgroupSet struct {
	ctrls []cgroupCtrl
	// ours: the parents are the default ones (Options.CgroupParent
	// unset), named for the sandbox; close removes them when empty, so a
	// daemon (or a test) that ends leaves its own cgroup removable.
	ours bool
}

// cgroupSeq numbers the calls' cgroups, across all the Sandboxes of the
// process.
var cgroupSeq atomic.Uint64

// cgroupCtrl is one hierarchy: the parent directory and the limit files
// written into each call's directory, in order.
type cgroupCtrl struct {
	h      *hierarchy
	parent string
	v2     bool
	limits [][2]string
}

// makeParent makes the parent directory (for v2 with the controllers
// delegated to its children) and checks it is writable.
func (ctrl cgroupCtrl) makeParent() error {
	var err error
	if ctrl.v2 {
		err = ctrl.h.enableV2(ctrl.parent)
	} else {
		err = os.MkdirAll(ctrl.parent, 0o755)
	}
	if err == nil {
		err = unix.Access(ctrl.parent, unix.W_OK)
	}
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", ctrl.parent, err)
	}
	return nil
}

// callCgroup is one call's cgroup directories.
type callCgroup struct {
	dirs []string
	v2   []bool
	// dropped: Sandbox.dropCgroup ran (a stale warm init's cgroup is
	// dropped by the init's discard and again by the call giving it up).
	dropped atomic.Bool
}

// defaultCgroupName is DefaultCgroupName; tests that need a parent no
// other process shares set another.
var defaultCgroupName = DefaultCgroupName

// hierarchy is a mounted cgroup hierarchy and the daemon's place in it.
type hierarchy struct {
	mount, root, own string
	v2               bool
}

func newCgroupSet(o Options) (*cgroupSet, error) {
	hs, err := hierarchies()
	if err != nil {
		return nil, err
	}
	pids, mem := hs["pids"], hs["memory"]
	if pids == nil || mem == nil {
		return nil, fmt.Errorf("the pids and memory cgroup controllers are not both available (pids %v, memory %v)", pids != nil, mem != nil)
	}
	set := &cgroupSet{ours: o.CgroupParent == ""}
	limits := map[string][][2]string{
		"pids":   {{"pids.max", strconv.FormatInt(o.PidsLimit, 10)}},
		"memory": {{"memory.limit_in_bytes", strconv.FormatInt(o.MemoryLimit, 10)}, {"memory.memsw.limit_in_bytes?", strconv.FormatInt(o.MemoryLimit, 10)}},
	}
	if pids == mem && pids.v2 {
		limits = map[string][][2]string{"pids": {{"pids.max", strconv.FormatInt(o.PidsLimit, 10)},
			{"memory.max", strconv.FormatInt(o.MemoryLimit, 10)}, {"memory.swap.max?", "0"}}}
	} else if pids.v2 || mem.v2 {
		return nil, fmt.Errorf("the pids and memory controllers are split across cgroup v1 and v2")
	}
	for _, name := range []string{"pids", "memory"} {
		l, ok := limits[name]
		if !ok {
			continue
		}
		h := hs[name]
		parent, err := h.parentDir(o.CgroupParent)
		if err != nil {
			return nil, err
		}
		ctrl := cgroupCtrl{h: h, parent: parent, v2: h.v2, limits: l}
		if err := ctrl.makeParent(); err != nil {
			return nil, err
		}
		set.ctrls = append(set.ctrls, ctrl)
	}
	set.removeStale()
	return set, nil
}

// parentDir is where the calls' cgroups go in h.
func (h *hierarchy) parentDir(parent string) (string, error) {
	p := parent
	if p == "" {
		p = filepath.Join(h.own, defaultCgroupName)
	}
	rel, ok := strings.CutPrefix(p, h.root)
	if !ok || !filepath.IsAbs(p) {
		return "", fmt.Errorf("cgroup parent %q: not inside the hierarchy mounted at %s (root %s)", p, h.mount, h.root)
	}
	return filepath.Join(h.mount, rel), nil
}

// enableV2 makes parent on the unified hierarchy with the pids and memory
// controllers delegated to its children. The daemon's own cgroup must hand
// them down, which cgroup v2 refuses while that cgroup holds processes
// (the daemon itself) unless it is the root: then run the daemon in a leaf
// of a delegated subtree and set CgroupParent beside it.
func (h *hierarchy) enableV2(parent string) error {
	own := filepath.Dir(parent)
	if err := os.WriteFile(filepath.Join(own, "cgroup.subtree_control"), []byte("+pids +memory"), 0); err != nil {
		return fmt.Errorf("delegate pids and memory from %s: %w", own, err)
	}
	if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+pids +memory"), 0)
}

// hierarchies maps each controller name ("pids", "memory") to where it is
// mounted and where this process is in it.
func hierarchies() (map[string]*hierarchy, error) {
	own := map[string]string{} // controller list ("" for v2) → path
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) == 3 {
			own[parts[1]] = parts[2]
		}
	}
	f.Close()

	out := map[string]*hierarchy{}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(mi), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 {
			continue
		}
		root, mount := unescape(fields[3]), unescape(fields[4])
		switch tail[0] {
		case "cgroup":
			for _, opt := range strings.Split(tail[2], ",") {
				if opt != "pids" && opt != "memory" || out[opt] != nil {
					continue
				}
				for ctrls, p := range own {
					if ctrls != "" && strings.Contains(","+ctrls+",", ","+opt+",") {
						out[opt] = &hierarchy{mount: mount, root: root, own: p}
					}
				}
			}
		case "cgroup2":
			p, ok := own[""]
			if !ok {
				continue
			}
			b, err := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
			if err != nil {
				continue
			}
			h := &hierarchy{mount: mount, root: root, own: p, v2: true}
			for _, c := range strings.Fields(string(b)) {
				if (c == "pids" || c == "memory") && out[c] == nil {
					out[c] = h
				}
			}
		}
	}
	// A v1 hierarchy wins over v2 for the same controller (a controller
	// bound to v1 is absent from v2's list anyway); both v2 must be one.
	if p, m := out["pids"], out["memory"]; p != nil && m != nil && p.v2 && m.v2 && p != m {
		out["memory"] = p
	}
	return out, nil
}

// unescape undoes mountinfo's octal escapes (\040 for a space...).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// create makes one call's cgroups with their limits.
func (c *cgroupSet) create() (cg *callCgroup, err error) {
	name := fmt.Sprintf("%d-%d", os.Getpid(), cgroupSeq.Add(1))
	cg = &callCgroup{}
	defer func() {
		if err != nil {
			cg.destroy()
		}
	}()
	for _, ctrl := range c.ctrls {
		dir := filepath.Join(ctrl.parent, name)
		if err := c.makeCall(ctrl, dir); err != nil {
			return nil, err
		}
		cg.dirs, cg.v2 = append(cg.dirs, dir), append(cg.v2, ctrl.v2)
	}
	return cg, nil
}

// makeCall makes one call's directory under ctrl's parent with its limits.
// The default parent is shared by every process in the daemon's cgroup,
// and a Sandbox that closes removes it when empty (close): if it is gone,
// or made again by another process and not yet delegating its controllers
// (v2: no limit files in a new child), it is made again and the call's
// directory with it, a few times.
func (c *cgroupSet) makeCall(ctrl cgroupCtrl, dir string) error {
	var err error
	for try := 0; try < 5; try++ {
		if try > 0 {
			if err := ctrl.makeParent(); err != nil {
				return err
			}
		}
		if err = os.Mkdir(dir, 0o755); err != nil {
			if c.ours && errors.Is(err, os.ErrNotExist) {
				continue
			}
			return fmt.Errorf("create cgroup: %w", err)
		}
		if err = writeLimits(dir, ctrl.limits); err == nil {
			return nil
		}
		os.Remove(dir)
		if !c.ours || !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return fmt.Errorf("create cgroup %s: its parent keeps going away: %w", dir, err)
}

// writeLimits writes limits into a call's cgroup directory, in order; a
// file whose name ends in "?" is skipped where it does not exist.
func writeLimits(dir string, limits [][2]string) error {
	for _, l := range limits {
		file, optional := strings.CutSuffix(l[0], "?")
		err := os.WriteFile(filepath.Join(dir, file), []byte(l[1]), 0)
		if err != nil && !(optional && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("cgroup %s: set %s: %w", dir, file, err)
		}
	}
	return nil
}

// procs are the files the init writes itself into.
func (cg *callCgroup) procs() []string {
	if cg == nil {
		return nil
	}
	out := make([]string, len(cg.dirs))
	for i, d := range cg.dirs {
		out[i] = filepath.Join(d, "cgroup.procs")
	}
	return out
}

// add moves process pid (all its threads) into the cgroups.
func (cg *callCgroup) add(pid int) error {
	for _, p := range cg.procs() {
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("move the sandbox init into its cgroup: %w", err)
		}
	}
	return nil
}

// kill kills every process left in the cgroups and returns once they are
// empty. The PID namespace's end has normally killed everything already
// (then this is one read of each cgroup.procs); this is the backstop for
// anything that left the tree. It gives up after a few seconds (a process
// stuck in the kernel) and says so.
func (cg *callCgroup) kill() error {
	if cg == nil {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for i, dir := range cg.dirs {
		if cg.v2[i] {
			os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		}
		for {
			pids, err := cgroupPids(dir)
			if errors.Is(err, os.ErrNotExist) || err == nil && len(pids) == 0 {
				break
			}
			if err != nil {
				return err
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cgroup %s: %d processes left after SIGKILL", dir, len(pids))
			}
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// remove removes the (empty) cgroups. A cgroup whose last task has exited
// may stay busy for a moment while the kernel finishes with it.
func (cg *callCgroup) remove() error {
	if cg == nil {
		return nil
	}
	var errs []error
	deadline := time.Now().Add(5 * time.Second)
	for i := len(cg.dirs) - 1; i >= 0; i-- {
		for {
			err := os.Remove(cg.dirs[i])
			if err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			if time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove cgroup: %w", err))
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// destroy is kill then remove.
func (cg *callCgroup) destroy() error {
	return errors.Join(cg.kill(), cg.remove())
}

func cgroupPids(dir string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// close removes the default parents if they are empty, after the cgroups
// of daemons that are gone (rmdir fails on a cgroup with children: another
// Sandbox, of this process or another one in the same cgroup, still uses
// it, and removes it when it closes).
func (c *cgroupSet) close() {
	if c == nil || !c.ours {
		return
	}
	c.removeStale()
	for _, ctrl := range c.ctrls {
		os.Remove(ctrl.parent)
	}
}

// removeStale removes the cgroups of daemons that are gone (killed before
// they could clean up; their processes died with them, Pdeathsig).
func (c *cgroupSet) removeStale() {
	for _, ctrl := range c.ctrls {
		ents, _ := os.ReadDir(ctrl.parent)
		for _, e := range ents {
			owner, _, ok := strings.Cut(e.Name(), "-")
			pid, err := strconv.Atoi(owner)
			if !ok || err != nil || !e.IsDir() || syscall.Kill(pid, 0) != syscall.ESRCH {
				continue
			}
			(&callCgroup{dirs: []string{filepath.Join(ctrl.parent, e.Name())}, v2: []bool{ctrl.v2}}).destroy()
		}
	}
}
