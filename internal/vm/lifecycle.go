package vm

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
)

// Del stops DHCP, removes bridge and tap and gives the veth back what it
// had. It succeeds when things are gone already (the spec's idempotent DEL).
func (s *Service) Del(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	conf, err := ParseConf(req.Netconf, false)
	if err == nil {
		err = validate(req, conf, false)
	}
	if err == nil {
		err = s.detach(ctx, keyOf(conf, req))
	}
	return s.reply("DEL", start, nil, err)
}

func (s *Service) detach(ctx context.Context, k store.AttachmentKey) error {
	return s.detachUnless(ctx, k, nil)
}

// detachUnless is detach, except when keep, asked under the key's lock,
// says the record (if any) stays.
func (s *Service) detachUnless(ctx context.Context, k store.AttachmentKey, keep func(rec record, found bool) bool) error {
	unlock := s.lock(k.String())
	defer unlock()
	rec, found, err := s.getRecord(ctx, k)
	if err != nil {
		return err
	}
	if keep != nil && keep(rec, found) {
		return nil
	}
	s.stopServers(k.String())
	if !found {
		return nil
	}
	// Best effort: everything Unplumb could not undo is in the pod's
	// namespace, which the runtime deletes after DEL (the bridge and tap
	// go with it; the veth goes with the main plugin's DEL, which the
	// runtime runs only if this one succeeds). A pod that changed what
	// skein-vm made (an alias on the tap, its veth gone) must not make
	// every DEL fail, and leak the main attachment with it.
	for _, p := range slices.Backward(rec.Ports) {
		if err := Unplumb(rec.NetNS, p); err != nil {
			s.log.Warn("vm: DEL could not undo all of a VM port in the pod's namespace; it goes with the namespace", "key", k, "port", p.Veth, "err", err)
		}
	}
	if err := s.st.PutMeta(ctx, metaKind, k.String(), nil); err != nil {
		return fmt.Errorf("delete VM record: %w", err)
	}
	if err := s.releaseToken(ctx, k.ContainerID); err != nil {
		s.log.Warn("remove VM token", "container", k.ContainerID, "err", err)
	}
	s.log.Info("vm detached", "key", k)
	return nil
}

// The token file of a container stands for all of its VM attachments, on
// every network (the launcher asks for a container's taps, not a
// network's). It must exist while any of them has a record, so the file
// is owned by the records: ADD writes it once its record is stored, DEL
// removes it when no record of the container is left.
//
// The attachment lock alone cannot make that safe: DEL of container C on
// network A and ADD of C on network B hold different keys, and a DEL that
// found no other record of C could remove the token an ADD on B wrote
// after that look. So "look for records, then remove" and "write" run
// under one lock per container. An ADD stores its record before it takes
// that lock, hence either a DEL's look sees the record (and keeps the
// file) or the ADD's write comes after the DEL's removal. Lock order:
// attachment, then container.

// Check verifies bridge, tap, filter and DHCP server of the attachment.
func (s *Service) Check(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	return s.reply("CHECK", start, nil, s.check(ctx, req))
}

func (s *Service) check(ctx context.Context, req *rpc.CNIRequest) error {
	conf, err := ParseConf(req.Netconf, true)
	if err != nil {
		return err
	}
	if err := validate(req, conf, true); err != nil {
		return err
	}
	k := keyOf(conf, req)
	rec, found, err := s.getRecord(ctx, k)
	if err != nil {
		return err
	}
	if !found {
		if vm, err := conf.WantsVM(); err != nil {
			return err
		} else if !vm {
			return nil // not a VM pod: nothing of skein-vm's to check
		}
		return types.NewError(types.ErrUnknownContainer, "no VM attachment "+k.String(), "")
	}
	var problems []string
	for _, p := range rec.Ports {
		if err := CheckPlumb(rec.NetNS, p, alias(k)); err != nil {
			problems = append(problems, err.Error())
		}
	}
	s.mu.Lock()
	n := len(s.servers[k.String()])
	s.mu.Unlock()
	if n != len(rec.Ports) {
		problems = append(problems, fmt.Sprintf("%d of %d DHCP servers running", n, len(rec.Ports)))
	}
	if len(problems) > 0 {
		return types.NewError(cni.CodeCheckFailed, strings.Join(problems, "; "), "")
	}
	return nil
}

// Status: skeind answers, so skein-vm is available.
func (s *Service) Status(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	_, err := ParseConf(req.Netconf, false)
	return s.reply("STATUS", start, nil, err)
}

// GC removes the VM attachments of this network the runtime no longer
// lists as valid, except those it could not have listed: an ADD under way
// when the GC came, or a record made since (as the main plugin's GC,
// Daemon.Collect).
func (s *Service) GC(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	conf, err := ParseConf(req.Netconf, false)
	if err != nil {
		return s.reply("GC", start, nil, err)
	}
	s.mu.Lock()
	busy := maps.Clone(s.adding)
	s.mu.Unlock()
	keep := func(rec record, found bool) bool {
		return !found || !rec.Created.Before(start)
	}
	valid := map[types.GCAttachment]bool{}
	for _, v := range conf.ValidAttachments {
		valid[v] = true
	}
	recs, err := s.records(ctx)
	if err != nil {
		return s.reply("GC", start, nil, err)
	}
	var errs []error
	for _, r := range recs {
		if r.Key.Network != conf.Name || valid[types.GCAttachment{ContainerID: r.Key.ContainerID, IfName: r.Key.IfName}] || busy[r.Key.String()] > 0 {
			continue
		}
		s.log.Info("gc: removing stale VM attachment", "key", r.Key)
		if err := s.detachUnless(ctx, r.Key, keep); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return s.reply("GC", start, nil, types.NewError(types.ErrInternal, "gc: "+err.Error(), ""))
	}
	return s.reply("GC", start, nil, nil)
}

// restore serves DHCP again for every VM attachment the store remembers
// whose bridge is still in its pod (found by its tag). A record whose
// namespace is gone belongs to a pod that is gone: it is dropped. One
// whose bridge is missing is kept for the runtime's DEL, unserved.
func (s *Service) restore(ctx context.Context) error {
	recs, err := s.records(ctx)
	if err != nil {
		return fmt.Errorf("list VM records: %w", err)
	}
	var served, dropped int
	for _, r := range recs {
		if netns.IsNetNS(r.NetNS) != nil {
			s.log.Info("vm restore: pod namespace gone, dropping record", "key", r.Key, "netns", r.NetNS)
			if err := s.st.PutMeta(ctx, metaKind, r.Key.String(), nil); err != nil {
				return err
			}
			_ = s.releaseToken(ctx, r.Key.ContainerID)
			dropped++
			continue
		}
		if err := s.tagged(r); err != nil {
			s.log.Warn("vm restore: not plumbed, waiting for DEL", "key", r.Key, "err", err)
			continue
		}
		if err := s.startServers(r); err != nil {
			s.log.Error("vm restore: DHCP", "key", r.Key, "err", err)
			continue
		}
		served++
	}
	s.log.Info("vm restored", "served", served, "dropped", dropped)
	return nil
}

// tagged checks that every bridge of r is in its pod with r's tag.
func (s *Service) tagged(r record) error {
	pod, closePod, err := netns.Handle(r.NetNS)
	if err != nil {
		return err
	}
	defer closePod()
	for _, p := range r.Ports {
		l, err := pod.LinkByName(p.Bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", p.Bridge, err)
		}
		if l.Attrs().Alias != alias(r.Key) {
			return fmt.Errorf("bridge %s carries tag %q, not %q", p.Bridge, l.Attrs().Alias, alias(r.Key))
		}
	}
	return nil
}
