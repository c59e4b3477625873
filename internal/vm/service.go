package vm

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/keylock"
	"github.com/skeinnet/skein/internal/netns"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/internal/vm/handover"
)

// Store kinds of the VM front door.
const (
	// metaKind holds one record per attachment, keyed by
	// "network/container/ifname".
	metaKind   = "vm"
	secretKind = "vm-secret"
)

// Options configures the VM front door. Zero values are the defaults.
type Options struct {
	// Socket is the tap handover socket; "" = handover.DefaultSocket.
	Socket string
	// TokenDir is where container tokens are written; "" =
	// handover.DefaultTokenDir.
	TokenDir string
}

// record is what the store keeps per skein-vm attachment: enough to serve
// DHCP again after a restart and to undo the plumbing on DEL.
type record struct {
	Key     store.AttachmentKey `json:"key"`
	NetNS   string              `json:"netns"`
	Ports   []Port              `json:"ports"`
	Created time.Time           `json:"created"`
}

// Service is the VM front door in skeind: the gRPC VM service the
// skein-vm plugin calls, the DHCP servers, and the tap handover socket.
type Service struct {
	rpc.UnimplementedVMServer
	d      Host
	st     store.Store
	log    *slog.Logger
	tokens tokens
	fd     *fdServer

	// locks serialises the verbs per attachment key; containers guards
	// the token file of each container (see claimToken).
	locks      keylock.Locks
	containers keylock.Locks
	mu         sync.Mutex
	servers    map[string][]*Server
}

var _ rpc.VMServer = (*Service)(nil)

// Register sets the VM front door up in d: it serves DHCP again for every
// VM attachment the store remembers, listens on the handover socket and
// registers the gRPC service. It stops with the daemon.
func Register(ctx context.Context, d Host, o Options) (*Service, error) {
	if o.Socket == "" {
		o.Socket = handover.DefaultSocket
	}
	if o.TokenDir == "" {
		o.TokenDir = handover.DefaultTokenDir
	}
	s := &Service{d: d, st: d.Store(), log: d.Logger().With("frontdoor", "vm"), servers: map[string][]*Server{}}
	secret, err := s.secret(ctx)
	if err != nil {
		return nil, err
	}
	s.tokens = tokens{secret: secret, dir: o.TokenDir}
	if err := s.restore(ctx); err != nil {
		return nil, err
	}
	s.fd, err = listenFD(o.Socket, s.openTaps, s.log)
	if err != nil {
		s.stopAll()
		return nil, err
	}
	rpc.RegisterVMServer(d.GRPC(), s)
	d.OnStop(s.Close)
	s.log.Info("vm front door ready", "socket", o.Socket, "tokens", o.TokenDir)
	return s, nil
}

// Close stops the handover socket and every DHCP server. The plumbing in
// the pods stays: it outlives skeind like every attachment.
func (s *Service) Close() {
	if s.fd != nil {
		s.fd.close()
	}
	s.stopAll()
}

func (s *Service) stopAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, srvs := range s.servers {
		for _, sv := range srvs {
			sv.Close()
		}
		delete(s.servers, k)
	}
}

func (s *Service) secret(ctx context.Context) ([]byte, error) {
	b, err := s.st.GetMeta(ctx, secretKind, "hmac")
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("load VM token secret: %w", err)
	}
	b = make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	if err := s.st.PutMeta(ctx, secretKind, "hmac", b); err != nil {
		return nil, fmt.Errorf("store VM token secret: %w", err)
	}
	return b, nil
}

func (s *Service) lock(key string) func() { return s.locks.Lock(key) }

func alias(k store.AttachmentKey) string {
	a := AliasPrefix + k.Network + ":" + k.ContainerID + ":" + k.IfName
	if len(a) > 250 {
		a = a[:250]
	}
	return a
}

func (s *Service) getRecord(ctx context.Context, k store.AttachmentKey) (record, bool, error) {
	b, err := s.st.GetMeta(ctx, metaKind, k.String())
	if errors.Is(err, store.ErrNotFound) {
		return record{}, false, nil
	}
	if err != nil {
		return record{}, false, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return record{}, false, fmt.Errorf("decode VM record %s: %w", k, err)
	}
	return r, true, nil
}

func (s *Service) putRecord(ctx context.Context, r record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return s.st.PutMeta(ctx, metaKind, r.Key.String(), b)
}

func (s *Service) records(ctx context.Context) ([]record, error) {
	m, err := s.st.ListMeta(ctx, metaKind)
	if err != nil {
		return nil, err
	}
	out := make([]record, 0, len(m))
	for k, b := range m {
		var r record
		if err := json.Unmarshal(b, &r); err != nil {
			s.log.Error("undecodable VM record", "key", k, "err", err)
			continue
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key.String() < out[j].Key.String() })
	return out, nil
}

// --- the CNI verbs ---

func (s *Service) reply(verb string, start time.Time, result []byte, err error) (*rpc.CNIReply, error) {
	code := uint(0)
	if err != nil {
		e := cni.AsError(err)
		code = e.Code
		s.log.Warn("vm request failed", "verb", verb, "code", code, "err", err)
		s.d.Observe("vm", verb, code, time.Since(start))
		return &rpc.CNIReply{Error: &rpc.CNIError{Code: uint32(e.Code), Msg: e.Msg, Details: e.Details}}, nil
	}
	s.d.Observe("vm", verb, code, time.Since(start))
	return &rpc.CNIReply{Result: result}, nil
}

// Add: see the package documentation for the recipe.
func (s *Service) Add(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	res, err := s.add(ctx, req)
	return s.reply("ADD", start, res, err)
}

func validate(req *rpc.CNIRequest, conf *NetConf, needNetNS bool) error {
	if err := cni.ValidateContainerID(req.ContainerId); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if err := cni.ValidateIfName(req.Ifname); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if needNetNS {
		return netnsError(netns.IsNetNS(req.Netns), req.Netns)
	}
	return nil
}

func netnsError(err error, path string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, netns.ErrNotExist):
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("CNI_NETNS %q does not exist", path), "")
	case errors.Is(err, netns.ErrNotNetNS):
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %q is not a network namespace", path), err.Error())
	}
	return err
}

func keyOf(conf *NetConf, req *rpc.CNIRequest) store.AttachmentKey {
	return store.AttachmentKey{Network: conf.Name, ContainerID: req.ContainerId, IfName: req.Ifname}
}

func (s *Service) add(ctx context.Context, req *rpc.CNIRequest) (_ []byte, retErr error) {
	// 1. What to serve: the main plugin's result.
	conf, err := ParseConf(req.Netconf, true)
	if err != nil {
		return nil, err
	}
	if err := validate(req, conf, true); err != nil {
		return nil, err
	}
	if vm, err := conf.WantsVM(); err != nil {
		return nil, err
	} else if !vm {
		// Not a VM pod: the main plugin's result, untouched.
		s.log.Debug("vm: not a VM pod, passing the result through", "container", req.ContainerId, "annotation", conf.PodAnnotation)
		return passThrough(conf)
	}
	if err := AdoptLegacyPrev(conf, req.Ifname, req.Netns); err != nil {
		return nil, err
	}
	leases, err := Leases(conf, HostnameFromArgs(req.Args))
	if err != nil {
		return nil, err
	}
	k := keyOf(conf, req)
	unlock := s.lock(k.String())
	defer unlock()
	if _, found, err := s.getRecord(ctx, k); err != nil {
		return nil, err
	} else if found {
		return nil, types.NewError(cni.CodeAttachmentExists, "this container already has VM networking on this network (DEL it first)", k.String())
	}

	// 2. What the main plugin made, read before anything changes.
	rec := record{Key: k, NetNS: req.Netns, Created: time.Now().UTC()}
	for _, l := range leases {
		p, err := Inspect(req.Netns, conf.Name, l)
		if err != nil {
			return nil, plumbError(err, req.Netns)
		}
		rec.Ports = append(rec.Ports, p)
	}

	// 3. The record first (it holds what DEL must give back), then the
	// kernel: a crash in between leaves a record whose DEL restores what
	// was changed and skips what was not.
	bg := context.WithoutCancel(ctx)
	if err := s.putRecord(ctx, rec); err != nil {
		return nil, fmt.Errorf("record VM attachment: %w", err)
	}
	var plumbed []Port
	defer func() {
		if retErr == nil {
			return
		}
		s.stopServers(k.String())
		for _, p := range slices.Backward(plumbed) {
			if err := Unplumb(req.Netns, p); err != nil {
				s.log.Error("undo VM plumbing", "key", k, "port", p.Veth, "err", err)
			}
		}
		if err := s.st.PutMeta(bg, metaKind, k.String(), nil); err != nil {
			s.log.Error("undo VM record", "key", k, "err", err)
			return
		}
		// A DEL of this container on another network may have kept the
		// token because of this record: give it back if it was the last.
		if err := s.releaseToken(bg, k.ContainerID); err != nil {
			s.log.Warn("remove VM token", "container", k.ContainerID, "err", err)
		}
	}()
	for i := range rec.Ports {
		if err := Plumb(req.Netns, &rec.Ports[i], alias(k)); err != nil {
			return nil, plumbError(err, req.Netns)
		}
		plumbed = append(plumbed, rec.Ports[i])
	}
	// Plumb chose the new MACs: record them.
	if err := s.putRecord(ctx, rec); err != nil {
		return nil, fmt.Errorf("record VM attachment: %w", err)
	}

	// 4. The result (nothing left to fail after the token), 5. DHCP,
	// 6. the launcher's token.
	out, err := buildResult(conf, rec)
	if err != nil {
		return nil, err
	}
	if err := s.startServers(rec); err != nil {
		return nil, err
	}
	if err := s.claimToken(k.ContainerID); err != nil {
		return nil, err
	}
	s.log.Info("vm attached", "key", k, "ports", len(rec.Ports))
	return out, nil
}

// plumbError maps plumbing failures onto spec codes.
func plumbError(err error, nsPath string) error {
	var e *types.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, netns.ErrNotExist), errors.Is(err, netns.ErrNotNetNS):
		return netnsError(err, nsPath)
	case errors.Is(err, ErrNoInterface), errors.Is(err, ErrNotEthernet):
		return types.NewError(types.ErrInvalidNetworkConfig, "prevResult names an interface the main plugin did not make in the pod: "+err.Error(), "")
	case errors.Is(err, ErrAlreadyPlumbed):
		return types.NewError(cni.CodeAttachmentExists, "the interface already carries VM networking (DEL it first)", err.Error())
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

// passThrough is prevResult in the configuration's version: a pod that
// is not a VM gets what the main plugin made.
func passThrough(conf *NetConf) ([]byte, error) {
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
	}
	return cni.Encode(res, conf.CNIVersion)
}

// buildResult is prevResult plus, per VM port, the bridge and the tap
// (with the VM's MAC) in the sandbox. Addresses and routes stay as the
// main plugin gave them: they are the VM's now.
func buildResult(conf *NetConf, rec record) ([]byte, error) {
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot convert prevResult: "+err.Error(), "")
	}
	for _, p := range rec.Ports {
		res.Interfaces = append(res.Interfaces,
			&current.Interface{Name: p.Bridge, Mac: p.BridgeMAC, Sandbox: rec.NetNS},
			&current.Interface{Name: p.Tap, Mac: p.Lease.MAC, Sandbox: rec.NetNS})
	}
	return cni.Encode(res, conf.CNIVersion)
}

func (s *Service) startServers(rec record) error {
	var started []*Server
	for _, p := range rec.Ports {
		sv, err := StartServer(rec.NetNS, p, s.log.With("key", rec.Key.String()))
		if err != nil {
			for _, x := range started {
				x.Close()
			}
			return fmt.Errorf("start DHCP server on %s: %w", p.Bridge, err)
		}
		started = append(started, sv)
	}
	s.mu.Lock()
	s.servers[rec.Key.String()] = started
	s.mu.Unlock()
	return nil
}

func (s *Service) stopServers(key string) {
	s.mu.Lock()
	srvs := s.servers[key]
	delete(s.servers, key)
	s.mu.Unlock()
	for _, sv := range srvs {
		sv.Close()
	}
}

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
	unlock := s.lock(k.String())
	defer unlock()
	rec, found, err := s.getRecord(ctx, k)
	if err != nil {
		return err
	}
	s.stopServers(k.String())
	if !found {
		return nil
	}
	var errs []error
	for _, p := range slices.Backward(rec.Ports) {
		if err := Unplumb(rec.NetNS, p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "restore the pod's interface: "+err.Error(), "")
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

// claimToken writes the token of containerID; the caller's record of an
// attachment of containerID is already stored.
func (s *Service) claimToken(containerID string) error {
	unlock := s.containers.Lock(containerID)
	defer unlock()
	return s.tokens.write(containerID)
}

// releaseToken removes the token of containerID unless a record of an
// attachment of containerID is left; the caller's record is already gone.
func (s *Service) releaseToken(ctx context.Context, containerID string) error {
	unlock := s.containers.Lock(containerID)
	defer unlock()
	recs, err := s.records(ctx)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.Key.ContainerID == containerID {
			return nil
		}
	}
	return s.tokens.remove(containerID)
}

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
// lists as valid.
func (s *Service) GC(ctx context.Context, req *rpc.CNIRequest) (*rpc.CNIReply, error) {
	start := time.Now()
	conf, err := ParseConf(req.Netconf, false)
	if err != nil {
		return s.reply("GC", start, nil, err)
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
		if r.Key.Network != conf.Name || valid[types.GCAttachment{ContainerID: r.Key.ContainerID, IfName: r.Key.IfName}] {
			continue
		}
		s.log.Info("gc: removing stale VM attachment", "key", r.Key)
		if err := s.detach(ctx, r.Key); err != nil {
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

// openTaps answers the handover socket: the taps of every VM attachment
// of the container, in key order, if the token is the container's; or,
// for a request by namespace, of every attachment in that namespace (ns,
// a descriptor the caller sent: having it is the proof).
func (s *Service) openTaps(req handover.Request, ns *os.File) ([]handover.Interface, []*os.File, error) {
	var mine func(record) bool
	if req.NetNS {
		id, err := netnsID(ns)
		if err != nil {
			return nil, nil, err
		}
		mine = func(r record) bool {
			var st unix.Stat_t
			return unix.Stat(r.NetNS, &st) == nil && [2]uint64{st.Dev, st.Ino} == id
		}
	} else {
		if cni.ValidateContainerID(req.ContainerID) != nil || !s.tokens.valid(req.ContainerID, req.Token) {
			return nil, nil, errors.New("unknown container or wrong token")
		}
		mine = func(r record) bool { return r.Key.ContainerID == req.ContainerID }
	}
	recs, err := s.records(context.Background())
	if err != nil {
		return nil, nil, err
	}
	var ifs []handover.Interface
	var files []*os.File
	fail := func(err error) ([]handover.Interface, []*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, nil, err
	}
	for _, r := range recs {
		if !mine(r) {
			continue
		}
		for _, p := range r.Ports {
			f, err := OpenTap(r.NetNS, p.Tap)
			if err != nil {
				return fail(fmt.Errorf("open tap %s of %s: %w", p.Tap, r.Key, err))
			}
			files = append(files, f)
			itf := handover.Interface{Network: r.Key.Network, IfName: p.Veth, Tap: p.Tap, MAC: p.Lease.MAC, MTU: p.Lease.MTU, NetNS: r.NetNS}
			for _, a := range []netip.Prefix{p.Lease.Addr4, p.Lease.Addr6} {
				if a.IsValid() {
					itf.Addresses = append(itf.Addresses, a.String())
				}
			}
			ifs = append(ifs, itf)
		}
	}
	if len(ifs) == 0 {
		if req.NetNS {
			return nil, nil, errors.New("no VM attachment in this network namespace")
		}
		return nil, nil, errors.New("unknown container or wrong token")
	}
	if len(ifs) > handover.MaxInterfaces {
		return fail(fmt.Errorf("%d interfaces: more than %d", len(ifs), handover.MaxInterfaces))
	}
	return ifs, files, nil
}

// netnsID identifies the network namespace f is a descriptor of (the
// device and inode its path also has), refusing any other file.
func netnsID(f *os.File) ([2]uint64, error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err != nil {
		return [2]uint64{}, fmt.Errorf("the descriptor sent: %w", err)
	}
	if fs.Type != unix.NSFS_MAGIC {
		return [2]uint64{}, errors.New("the descriptor sent is not a namespace")
	}
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		return [2]uint64{}, errors.New("the descriptor sent is not a network namespace")
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return [2]uint64{}, fmt.Errorf("the descriptor sent: %w", err)
	}
	return [2]uint64{st.Dev, st.Ino}, nil
}
