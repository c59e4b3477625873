package vm

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

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
	// adding counts the ADDs of each key under way (under mu): GC leaves
	// them alone, as the main plugin's does (Daemon.Collect).
	adding map[string]int
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
	d.RegisterCNIMethods(rpc.VM_ServiceDesc.ServiceName, s)
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
	s.mu.Lock()
	if s.adding == nil {
		s.adding = map[string]int{}
	}
	s.adding[k.String()]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.adding[k.String()]--; s.adding[k.String()] <= 0 {
			delete(s.adding, k.String())
		}
		s.mu.Unlock()
	}()
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
