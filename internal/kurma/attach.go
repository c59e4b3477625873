package kurma

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/skeinnet/skein/internal/cni"
)

// Selection is one network a pod asks for, with the interface it wants
// ("" = the network's containerInterface template).
type Selection struct {
	Network string `json:"network"`
	IfName  string `json:"ifName,omitempty"`
}

// ParseSelection parses NAME or NAME@IFNAME.
func ParseSelection(s string) (Selection, error) {
	name, ifname, has := strings.Cut(s, "@")
	if !networkName.MatchString(name) {
		return Selection{}, fmt.Errorf("%w: network %q: not a valid network name", ErrBadRequest, s)
	}
	if has {
		if err := cni.ValidateIfName(ifname); err != nil {
			return Selection{}, fmt.Errorf("%w: network %q: %w", ErrBadRequest, s, err)
		}
	}
	return Selection{Network: name, IfName: ifname}, nil
}

// AttachRequest attaches one pod to networks.
type AttachRequest struct {
	// ID is the container (pod) UUID: the plugins' key for its state.
	ID string
	// Key is the record the attachments go to: "" or ID for the pod's one
	// record, or ID/… when a front door keeps several records of one pod
	// (the CNI meta mode keeps one per CNI attachment). Each record is
	// detached on its own; calls for one pod run one at a time, whatever
	// the record.
	Key string
	// NetNS is the pod's pinned network namespace (not a /proc path).
	NetNS string
	// Networks to attach, in order; empty = the default networks.
	Networks []Selection
	// Owner, when the pod has no record yet, is kept in it (PodRecord.Owner):
	// which front door made it (the CNI meta mode's GC collects only its own).
	Owner string
	// Admit, when set, may refuse a network: called with each network's
	// definition from the same read of the configuration the attach is
	// planned from, so a reload in between cannot slip an unchecked
	// network (or an allow-list just changed) past it. Its error is the
	// call's, as it is.
	Admit func(Network) error
}

// key is the request's record key.
func (r AttachRequest) key() string {
	if r.Key == "" {
		return r.ID
	}
	return r.Key
}

// Skipped is an optional network whose add failed.
type Skipped struct {
	Network string `json:"network"`
	Error   string `json:"error"`
}

// AttachResult is what Attach did.
type AttachResult struct {
	// Attached are this call's new attachments, in order.
	Attached []AttachmentRecord `json:"attached"`
	// Skipped are optional networks whose add failed.
	Skipped []Skipped `json:"skipped,omitempty"`
	// Pod is the pod's whole record afterwards.
	Pod PodRecord `json:"pod"`
}

var podID = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

func checkPod(id, nsPath string) error {
	if !podID.MatchString(id) {
		return fmt.Errorf("%w: pod id %q: want 1-128 letters, digits, '_', '.', ':' or '-'", ErrBadRequest, id)
	}
	if nsPath == "" {
		return nil
	}
	if !filepath.IsAbs(nsPath) || filepath.Clean(nsPath) != nsPath {
		return fmt.Errorf("%w: netns %q: want an absolute, clean path", ErrBadRequest, nsPath)
	}
	if filepath.Dir(nsPath) == "/" {
		// Plugins see the pin's directory bound at its own path; / would
		// cover the image.
		return fmt.Errorf("%w: netns %q: pinned in /; pin the namespace in a directory (e.g. /run/netns)", ErrBadRequest, nsPath)
	}
	if nsPath == "/proc" || strings.HasPrefix(nsPath, "/proc/") {
		return fmt.Errorf("%w: netns %q: a /proc path cannot be used by plugins (they have their own /proc); pin the namespace (ip netns add, a bind mount) and pass the pin", ErrBadRequest, nsPath)
	}
	if err := isNetNS(nsPath); err != nil {
		return fmt.Errorf("%w: netns %q: %w", ErrBadRequest, nsPath, err)
	}
	return nil
}

// planned is one network of an Attach, resolved before anything runs.
type planned struct {
	net    Network
	ifname string
}

// Attach attaches the pod to the requested networks (or the defaults), in
// order. The pod may already have networks: these are added to them. If an
// add fails, the networks this call attached are detached again in reverse
// order and the error returned; an optional network's failure is skipped
// and reported instead. Invalid requests fail with ErrBadRequest before
// anything runs.
func (m *Manager) Attach(ctx context.Context, req AttachRequest) (res AttachResult, err error) {
	if req.NetNS == "" {
		return res, fmt.Errorf("%w: no netns", ErrBadRequest)
	}
	if err := checkPod(req.ID, req.NetNS); err != nil {
		return res, err
	}
	key := req.key()
	if err := checkKey(key); err != nil {
		return res, err
	}
	if podOfKey(key) != req.ID {
		return res, fmt.Errorf("%w: record key %q is not one of pod %s", ErrBadRequest, key, req.ID)
	}
	if m.checkNS != nil {
		if err := m.checkNS(req.NetNS); err != nil {
			return res, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
	}
	unlock := m.locks.Lock(req.ID)
	defer unlock()

	// Step 1: the record so far and the plan; no side effects yet.
	rec, found, err := m.getRecord(ctx, key)
	if err != nil {
		return res, err
	}
	if found && rec.NetNS != req.NetNS {
		return res, fmt.Errorf("%w: pod %s is attached with netns %s, not %s", ErrBadRequest, req.ID, rec.NetNS, req.NetNS)
	}
	if !found {
		rec = PodRecord{ID: req.ID, Key: key, NetNS: req.NetNS, Owner: req.Owner, Created: time.Now().UTC()}
	}
	plan, err := m.plan(req, rec)
	if err != nil {
		return res, err
	}

	// Step 2: the images (and main execs) of the networks, so that a bad
	// or unreachable image fails before any network is attached. Each is
	// held from here until the outcome is recorded (the record then keeps
	// it from being pruned): one ensure per network and call.
	states := make([]*netState, len(plan))
	unready := make([]error, len(plan)) // an optional network's ensure error
	var releases []func()
	defer func() {
		m.pruneMu.RLock()
		for _, r := range releases {
			r()
		}
		m.pruneMu.RUnlock()
	}()
	for i, p := range plan {
		if p.net.Builtin() {
			if m.pools == nil {
				return res, fmt.Errorf("network %q: %w", p.net.Name, ErrNoPools)
			}
			continue
		}
		s, release, err := m.ensure(ctx, p.net)
		if err != nil {
			if !p.net.Optional {
				return res, err
			}
			unready[i] = err
			continue
		}
		releases = append(releases, release)
		states[i] = s
	}

	// Step 3: one durable intent for every network of this call, the adds
	// in order, one durable outcome. A crash before the outcome leaves
	// every network of the call in StateAdding, and Recover deletes them
	// all (a del of a network whose add never ran is a del of nothing,
	// which plugins must accept as CNI's DEL does). On a failure the adds
	// of this call are deleted again in reverse.
	base := len(rec.Attachments)
	var intended []int // plan indexes recorded in the intent
	for i, p := range plan {
		if unready[i] != nil {
			m.log.Warn("optional pod network skipped", "pod", req.ID, "network", p.net.Name, "err", unready[i])
			res.Skipped = append(res.Skipped, Skipped{Network: p.net.Name, Error: unready[i].Error()})
			continue
		}
		a := AttachmentRecord{
			Network: p.net.Name, IfName: p.ifname, Config: p.net.Raw, Pool: p.net.Pool,
			Timeout: p.net.Timeout, State: StateAdding, Created: time.Now().UTC(),
		}
		if s := states[i]; s != nil {
			a.Image, a.Digest, a.Insecure = p.net.Image, s.img.Digest, p.net.Ref.Insecure
		}
		rec.Attachments = append(rec.Attachments, a)
		intended = append(intended, i)
	}
	if len(intended) == 0 {
		res.Pod = rec
		return res, nil
	}
	// The first image network's call goes to the sandbox while the intent
	// is written: its init gets the call and checks it meanwhile, and runs
	// it only once the intent is on disk (sandbox.Spec.Wait); if the
	// intent cannot be written, the call never runs.
	intent := newGate()
	var first chan error
	firstCtx, cancelFirst := context.WithCancelCause(ctx)
	defer cancelFirst(nil)
	if i := intended[0]; states[i] != nil {
		first = make(chan error, 1)
		go func() { first <- m.addOne(firstCtx, &rec, base, states[i], intent.wait) }()
	}
	err = m.putRecord(ctx, &rec)
	intent.open(err)
	if err != nil {
		if first != nil {
			// Not queued behind other pods' calls for a slot it will
			// not use.
			cancelFirst(err)
			<-first
		}
		return AttachResult{}, err
	}
	bg := context.WithoutCancel(ctx)
	// outcome[j]: nil added; else why not (the entry is then deleted).
	added := make([]bool, len(intended))
	var failure error
	for j, i := range intended {
		p, idx := plan[i], base+j
		var err error
		if j == 0 && first != nil {
			err = <-first
		} else {
			err = m.addOne(ctx, &rec, idx, states[i], nil)
		}
		if err == nil {
			added[j] = true
			continue
		}
		// A failed add may have done part of its work: del it.
		m.dropEntry(bg, &rec, idx, true)
		if p.net.Optional {
			m.log.Warn("optional pod network skipped", "pod", req.ID, "network", p.net.Name, "err", err)
			res.Skipped = append(res.Skipped, Skipped{Network: p.net.Name, Error: err.Error()})
			continue
		}
		failure = fmt.Errorf("attach pod %s to network %q: %w", req.ID, p.net.Name, err)
		for k := j + 1; k < len(intended); k++ {
			m.dropEntry(bg, &rec, base+k, false) // never ran: nothing to del
		}
		for k := j - 1; k >= 0; k-- {
			if added[k] {
				m.dropEntry(bg, &rec, base+k, true)
			}
		}
		break
	}
	if failure == nil {
		var attached []AttachmentRecord
		for j := range intended {
			if added[j] {
				attached = append(attached, rec.Attachments[base+j])
			}
		}
		compact(&rec)
		err := m.putCompletion(bg, &rec)
		if err == nil {
			res.Attached, res.Pod = attached, rec
			return res, nil
		}
		// The outcome is not recorded: undo this call's adds (the stored
		// intent has them all as StateAdding, which Recover would undo).
		failure = err
		for k := len(rec.Attachments) - 1; k >= base; k-- {
			m.dropEntry(bg, &rec, k, true)
		}
	}
	compact(&rec)
	if err := m.putRecord(bg, &rec); err != nil {
		m.log.Error("record the rollback of pod networks; Recover or a detach finishes it", "pod", req.ID, "err", err)
	}
	return AttachResult{}, failure
}

// addOne runs the add of rec.Attachments[idx] and fills in its outcome
// (in memory: the caller records it). wait, when set, is the go of an
// image network's call (sandbox.Spec.Wait).
func (m *Manager) addOne(ctx context.Context, rec *PodRecord, idx int, s *netState, wait func(context.Context) error) error {
	a := rec.Attachments[idx]
	if s != nil && s.sv != nil {
		if err := s.sv.Err(); err != nil {
			return err
		}
	}
	result, err := m.add(ctx, rec, a, s, wait)
	if err == nil {
		a.Result, err = encodeResult(result)
	}
	if err != nil {
		return err
	}
	a.State = StateAttached
	rec.Attachments[idx] = a
	return nil
}

// dropEntry takes rec.Attachments[idx] out of the record in memory:
// deleted first when del is set; an entry whose del fails stays, marked
// StateDelFailed (Detach and GC retry it). Dropped entries are marked
// for compact.
func (m *Manager) dropEntry(ctx context.Context, rec *PodRecord, idx int, del bool) error {
	a := &rec.Attachments[idx]
	if del {
		if err := m.del(ctx, rec, *a); err != nil {
			m.log.Error("pod network del failed; its record stays for a later detach", "pod", rec.ID, "network", a.Network, "err", err)
			a.State, a.Error = StateDelFailed, err.Error()
			return err
		}
	}
	a.State = stateDropped
	return nil
}

// stateDropped marks an entry compact removes; it is never stored.
const stateDropped = "dropped"

// compact removes the dropped entries of rec.
func compact(rec *PodRecord) {
	kept := rec.Attachments[:0]
	for _, a := range rec.Attachments {
		if a.State != stateDropped {
			kept = append(kept, a)
		}
	}
	rec.Attachments = kept
}

// plan resolves the requested networks and renders their interface names.
func (m *Manager) plan(req AttachRequest, rec PodRecord) ([]planned, error) {
	nets := m.Networks()
	sels := req.Networks
	if len(sels) == 0 {
		for _, name := range Defaults(nets) {
			sels = append(sels, Selection{Network: name})
		}
		if len(sels) == 0 {
			return nil, fmt.Errorf("%w: no networks asked for and none is a default", ErrBadRequest)
		}
	}
	existing, err := m.links(req.NetNS)
	if err != nil {
		return nil, fmt.Errorf("list interfaces of %s: %w", req.NetNS, err)
	}
	taken := map[string]bool{}
	for _, l := range existing {
		taken[l] = true
	}
	attached := map[string]bool{}
	for _, a := range rec.Attachments {
		attached[a.Network] = true
		if a.IfName != "" {
			taken[a.IfName] = true
		}
	}
	var plan []planned
	for _, s := range sels {
		n, ok := Find(nets, s.Network)
		if !ok {
			return nil, fmt.Errorf("%w: unknown network %q", ErrBadRequest, s.Network)
		}
		if req.Admit != nil {
			if err := req.Admit(n); err != nil {
				return nil, err
			}
		}
		if attached[n.Name] {
			return nil, fmt.Errorf("%w: pod %s is already attached to network %q (or asks for it twice)", ErrBadRequest, req.ID, n.Name)
		}
		attached[n.Name] = true
		ifname := s.IfName
		if ifname != "" {
			if err := cni.ValidateIfName(ifname); err != nil {
				return nil, fmt.Errorf("%w: network %q: %w", ErrBadRequest, n.Name, err)
			}
			if taken[ifname] {
				return nil, fmt.Errorf("%w: network %q: interface %q already exists in the pod", ErrBadRequest, n.Name, ifname)
			}
		} else {
			ifname, err = RenderIfName(n.ContainerInterface, req.ID, len(rec.Attachments)+len(plan), taken)
			if err != nil {
				return nil, fmt.Errorf("%w: network %q: %w", ErrBadRequest, n.Name, err)
			}
		}
		if ifname != "" {
			taken[ifname] = true
		}
		plan = append(plan, planned{net: n, ifname: ifname})
	}
	return plan, nil
}

// gate is a go or a refusal, given once to the calls that wait for it.
type gate struct {
	done chan struct{}
	err  error
}

func newGate() *gate { return &gate{done: make(chan struct{})} }

// open gives the go (err nil) or the refusal.
func (g *gate) open(err error) {
	g.err = err
	close(g.done)
}

// wait returns what open gave, or ctx's end first.
func (g *gate) wait(ctx context.Context) error {
	select {
	case <-g.done:
		return g.err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
