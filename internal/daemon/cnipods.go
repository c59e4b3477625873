package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/skeinnet/skein/api/rpc"
	"github.com/skeinnet/skein/internal/cni"
	"github.com/skeinnet/skein/internal/kurma"
	"github.com/skeinnet/skein/internal/kurma/sandbox"
	"github.com/skeinnet/skein/internal/netns"
)

// The CNI meta mode's verbs (podmeta.go has its pure part). The pod
// network Manager keeps one record per CNI attachment, as CNI identifies
// one: (CNI_CONTAINERID, the CNI network's name, CNI_IFNAME), so that two
// conflists for one container, or one conflist on two interfaces, neither
// merge nor delete each other's interfaces. The plugins still see the
// container ID. A record is owned by "cni:<the CNI network's name>"
// (written with the first attachment's intent, in the same store write),
// so that a CNI GC of that network only ever collects pods attached
// through it, never those of `skeinctl pod attach` or of another CNI
// network.
//
// Records written before this keying are one per container, stored under
// its ID with no key (kurma.PodRecord.Key empty). They are still served:
// such a record answers for the attachments of its owner's network whose
// CNI_IFNAME is one of its interfaces (legacyMatch).

// cniOwner is the record owner of pods attached through CNI network name.
func cniOwner(name string) string { return "cni:" + name }

// cniRecordKey is the record key of one CNI attachment. None of the three
// parts can hold '/' (cni.ValidateContainerID, ValidateNetworkName,
// ValidateIfName), so a key names one attachment.
func cniRecordKey(id, network, ifname string) string {
	return id + "/cni/" + network + "/" + ifname
}

// inflight key of a meta-mode ADD (apart from the attachment keys).
func podAddKey(key string) string { return "pods/" + key }

// legacyMatch reports whether r, a record of container id, is one written
// before records were keyed per attachment that answers for attachment
// (id, network, ifname): made through that network and holding an
// interface named ifname (the old ADD gave its first network
// CNI_IFNAME).
func legacyMatch(r kurma.PodRecord, id, network, ifname string) bool {
	if r.Key != "" || r.ID != id || r.Owner != cniOwner(network) {
		return false
	}
	return slices.ContainsFunc(r.Attachments, func(a kurma.AttachmentRecord) bool { return a.IfName == ifname })
}

// recordKey returns the key of the record of a CNI attachment and whether
// there is one: its own key, or the container's old-format record when
// that answers for it (legacyMatch).
func recordKey(ctx context.Context, pods *kurma.Manager, id, network, ifname string) (string, bool, error) {
	key := cniRecordKey(id, network, ifname)
	_, err := pods.Record(ctx, key)
	if err == nil {
		return key, true, nil
	}
	if !errors.Is(err, kurma.ErrUnknownPod) {
		return "", false, err
	}
	old, err := pods.Record(ctx, id)
	if errors.Is(err, kurma.ErrUnknownPod) {
		return key, false, nil
	}
	if err != nil {
		return "", false, err
	}
	if legacyMatch(old, id, network, ifname) {
		return id, true, nil
	}
	return key, false, nil
}

// podsError maps the Manager's errors onto CNI codes.
func podsCNIError(err error) error {
	var e *types.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, kurma.ErrBadRequest), errors.Is(err, kurma.ErrNoPools):
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	case errors.Is(err, sandbox.ErrMainExecDown):
		return types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	return types.NewError(types.ErrInternal, err.Error(), "")
}

func (s *cniServer) podsManager() (*kurma.Manager, error) {
	if s.d.pods == nil {
		return nil, types.NewError(types.ErrPluginNotAvailable, "skeind runs no pod network manager", "")
	}
	return s.d.pods, nil
}

// addPods attaches the pod to its networks; the result lists every
// interface they made, in the configuration's CNI version.
func (s *cniServer) addPods(ctx context.Context, req *rpc.CNIRequest, m metaConf) ([]byte, error) {
	conf, err := s.validateArgs(req, true)
	if err != nil {
		return nil, err
	}
	pods, err := s.podsManager()
	if err != nil {
		return nil, err
	}
	// 1. which networks, the first on CNI_IFNAME
	sels, from, err := podSelections(m, req.Args, req.Ifname, kurma.Defaults(pods.Networks()))
	if err != nil {
		return nil, err
	}
	// 2. only networks the pod's namespace may use
	if err := s.admitNetworks(ctx, pods.Networks(), sels, req.Args); err != nil {
		return nil, err
	}
	// 3. attach, in order (the Manager rolls back on failure), into this
	// attachment's own record; GC leaves it alone while its ADD runs
	key := cniRecordKey(req.ContainerId, conf.Name, req.Ifname)
	defer s.d.adds.begin(podAddKey(key))()
	adm, err := s.admission(req.Args)
	if err != nil {
		return nil, err
	}
	res, err := pods.Attach(ctx, kurma.AttachRequest{ID: req.ContainerId, Key: key, NetNS: req.Netns, Networks: sels, Owner: cniOwner(conf.Name),
		Admit: func(n kurma.Network) error { return adm.checkNet(ctx, n) }})
	if err != nil {
		return nil, podsCNIError(fmt.Errorf("networks from %s: %w", from, err))
	}
	for _, sk := range res.Skipped {
		s.d.log.Warn("cni: optional pod network skipped", "container", req.ContainerId, "network", sk.Network, "err", sk.Error)
	}
	// 4. one result for all of them
	merged, err := mergeResults(res.Pod.Attachments, req.Netns)
	var out []byte
	if err == nil {
		out, err = cni.Encode(merged, conf.CNIVersion)
	}
	// 5. the pod's own set-up (egress) once its interfaces are in place
	if err == nil {
		err = s.podAdded(ctx, req)
	}
	if err == nil {
		return out, nil
	}
	// Cannot be reported, or the pod's set-up failed: undo, so nothing is
	// left behind.
	if _, derr := pods.DetachIf(context.WithoutCancel(ctx), key, nil); derr != nil {
		s.d.log.Error("undo pod networks after result failure", "container", req.ContainerId, "err", derr)
	}
	return nil, err
}

// delPods detaches the networks of this CNI attachment's record
// (idempotent); the container's other attachments stay. Without a record
// (the store lost it) it still frees the pool addresses held for the
// container that no record names and runs the dels of the networks the
// DEL names (kurma.Manager.DetachLost).
func (s *cniServer) delPods(ctx context.Context, req *rpc.CNIRequest, m metaConf) error {
	conf, err := s.validateArgs(req, false)
	if err != nil {
		return err
	}
	pods, err := s.podsManager()
	if err != nil {
		return err
	}
	key, _, err := recordKey(ctx, pods, req.ContainerId, conf.Name, req.Ifname)
	if err != nil {
		return podsCNIError(err)
	}
	lost := kurma.AttachRequest{ID: req.ContainerId, Key: key, NetNS: req.Netns}
	if sels, _, err := podSelections(m, req.Args, req.Ifname, kurma.Defaults(pods.Networks())); err == nil {
		lost.Networks = s.admittedOnly(ctx, pods.Networks(), sels, req.Args)
	}
	nsPath := req.Netns
	if nsPath != "" && netns.IsNetNS(nsPath) != nil {
		nsPath = "" // gone
	}
	detach := func() error {
		return pods.DetachLost(ctx, lost, func(ctx context.Context) error {
			return s.detachPodPools(ctx, req.ContainerId, req.Netns)
		})
	}
	// A CNI_ARGS that does not parse names no pod: DEL goes on.
	pod, hasPod, _ := s.d.podRefOf(req.Args, req.ContainerId, req.Ifname, nsPath)
	if hasPod {
		err = s.d.cfg.PodHook.Deleting(ctx, pod, detach)
	} else {
		err = detach()
	}
	if err != nil {
		return podsCNIError(err)
	}
	return nil
}

// detachPodPools removes the attachments skeind's pools made for pod
// networks of container id (OwnerKurma) that no record of the container
// names: another CNI attachment of the container keeps its own. It runs
// under the pod's lock (DetachLost), so no attach of the container is
// between its pool attachment and its record.
func (s *cniServer) detachPodPools(ctx context.Context, id, nsPath string) error {
	recs, err := s.d.pods.List(ctx)
	if err != nil {
		return err
	}
	recorded := map[[2]string]bool{}
	for _, r := range recs {
		if r.ID != id {
			continue
		}
		for _, a := range r.Attachments {
			recorded[[2]string{a.Network, a.IfName}] = true
		}
	}
	atts, err := s.d.st.ListAttachments(ctx)
	if err != nil {
		return fmt.Errorf("list attachments: %w", err)
	}
	if nsPath != "" && netns.IsNetNS(nsPath) != nil {
		nsPath = "" // gone: the host side is enough
	}
	var errs []error
	for _, a := range atts {
		if a.Owner != OwnerKurma || a.ContainerID != id || recorded[[2]string{a.Network, a.IfName}] {
			continue
		}
		if _, err := s.d.Detach(ctx, a.AttachmentKey, nsPath); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", a.AttachmentKey, err))
			continue
		}
		s.d.log.Info("cni: freed a pool attachment of a pod with no record", "key", a.AttachmentKey)
	}
	return errors.Join(errs...)
}

// checkPods: the attachment is recorded, every network of its record
// attached, every interface present in the pod, and prevResult (when
// given) names them all.
func (s *cniServer) checkPods(ctx context.Context, req *rpc.CNIRequest) error {
	conf, err := s.validateArgs(req, true)
	if err != nil {
		return err
	}
	pods, err := s.podsManager()
	if err != nil {
		return err
	}
	key, found, err := recordKey(ctx, pods, req.ContainerId, conf.Name, req.Ifname)
	if err != nil {
		return podsCNIError(err)
	}
	var rec kurma.PodRecord
	if found {
		rec, err = pods.Record(ctx, key)
	}
	if !found || errors.Is(err, kurma.ErrUnknownPod) {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("container %s has no pod networks from network %q on %s", req.ContainerId, conf.Name, req.Ifname), "")
	}
	if err != nil {
		return podsCNIError(err)
	}
	h, closeH, err := netns.Handle(req.Netns)
	if err != nil {
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf("open CNI_NETNS %s: %v", req.Netns, err), "")
	}
	defer closeH()
	var prevIfs []string
	if conf.PrevResult != nil {
		b, err := json.Marshal(conf.PrevResult)
		if err == nil {
			var p struct {
				Interfaces []struct{ Name, Sandbox string } `json:"interfaces"`
			}
			_ = json.Unmarshal(b, &p)
			for _, i := range p.Interfaces {
				if i.Sandbox != "" {
					prevIfs = append(prevIfs, i.Name)
				}
			}
		}
	}
	for _, a := range rec.Attachments {
		if a.State != kurma.StateAttached {
			return types.NewError(cni.CodeCheckFailed, fmt.Sprintf("network %q is %s", a.Network, a.State), a.Error)
		}
		if a.IfName == "" {
			continue
		}
		if _, err := h.LinkByName(a.IfName); err != nil {
			return types.NewError(cni.CodeCheckFailed, fmt.Sprintf("network %q: interface %s is missing from the pod", a.Network, a.IfName), err.Error())
		}
		if conf.PrevResult != nil && !slices.Contains(prevIfs, a.IfName) {
			return types.NewError(cni.CodeCheckFailed, fmt.Sprintf("prevResult lacks interface %s of network %q", a.IfName, a.Network), "")
		}
	}
	return nil
}

// statusPods: available when skeind has pod networks to offer.
func (s *cniServer) statusPods(context.Context, *rpc.CNIRequest) error {
	pods, err := s.podsManager()
	if err != nil {
		return err
	}
	if len(pods.Networks()) == 0 {
		return types.NewError(types.ErrPluginNotAvailable, "skeind has no pod networks configured", "")
	}
	return nil
}

// gcPods detaches the records of the attachments this CNI network made
// that the runtime no longer lists in cni.dev/valid-attachments (container
// and ifname) — not those made after the request started nor those whose
// ADD is still running. A record of the old format (one per container,
// its CNI_IFNAME unknown for certain) stays while the runtime lists any
// attachment of its container: keeping a stale record a while is better
// than removing a live pod's interfaces.
func (s *cniServer) gcPods(ctx context.Context, req *rpc.CNIRequest) error {
	since := time.Now()
	busy := s.d.adds.snapshot()
	conf, err := cni.Parse(req.Netconf)
	if err != nil {
		return err
	}
	pods, err := s.podsManager()
	if err != nil {
		return err
	}
	valid := map[string]bool{}    // record keys
	validOld := map[string]bool{} // containers, for old-format records
	for _, v := range conf.ValidAttachments {
		valid[cniRecordKey(v.ContainerID, conf.Name, v.IfName)] = true
		validOld[v.ContainerID] = true
	}
	recs, err := pods.List(ctx)
	if err != nil {
		return types.NewError(types.ErrInternal, "gc: list pods: "+err.Error(), "")
	}
	var errs []error
	for _, r := range recs {
		key := r.StoreKey()
		keep := valid[key]
		if r.Key == "" {
			keep = validOld[r.ID]
		}
		if r.Owner != cniOwner(conf.Name) || keep || busy[podAddKey(key)] || !r.Created.Before(since) {
			continue
		}
		// Checked again under the pod's lock: it may have been deleted
		// and added again since the list.
		detached, err := pods.DetachIf(ctx, key, func(cur kurma.PodRecord) bool {
			return cur.Owner == cniOwner(conf.Name) && cur.Created.Before(since)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("pod record %s: %w", key, err))
			continue
		}
		if detached {
			s.d.log.Info("gc: detached stale pod networks", "container", r.ID, "record", key, "network", conf.Name)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return types.NewError(types.ErrInternal, "gc: "+err.Error(), "")
	}
	return nil
}

// namespaceLabels is a store that can read a Kubernetes namespace's
// labels (the Kubernetes store).
type namespaceLabels interface {
	NamespaceLabels(ctx context.Context, namespace string) (map[string]string, error)
}

// admitNetworks refuses (code 103, naming the network and the namespace)
// a Kubernetes pod that asks for a network its namespace may not use
// (kurma.Network.Admits). The networks come from the pod's annotation,
// which the pod's owner writes: it is never trusted to choose. A request
// without K8S_POD_NAMESPACE (a runtime on the host, not a kubelet) is not
// a tenant's and is not checked.
func (s *cniServer) admitNetworks(ctx context.Context, nets []kurma.Network, sels []kurma.Selection, cniArgs string) error {
	a, err := s.admission(cniArgs)
	if err != nil {
		return err
	}
	for _, sel := range sels {
		if err := a.check(ctx, nets, sel); err != nil {
			return err
		}
	}
	return nil
}

// admittedOnly is sels without the networks the pod's namespace may not
// use: what a DEL that finds no record may run the dels of. A tenant who
// was refused a network at ADD (the runtime DELs after a failed ADD)
// must not get its plugin run that way either.
func (s *cniServer) admittedOnly(ctx context.Context, nets []kurma.Network, sels []kurma.Selection, cniArgs string) []kurma.Selection {
	a, err := s.admission(cniArgs)
	if err != nil {
		return nil
	}
	var out []kurma.Selection
	for _, sel := range sels {
		if err := a.check(ctx, nets, sel); err != nil {
			s.d.log.Warn("cni: DEL without a record leaves a network alone the pod may not use", "network", sel.Network, "err", err)
			continue
		}
		out = append(out, sel)
	}
	return out
}

// admission checks the networks of one request (admitNetworks).
type admission struct {
	s          *cniServer
	ns         string // K8S_POD_NAMESPACE; "" checks nothing
	labels     map[string]string
	labelsRead bool
}

func (s *cniServer) admission(cniArgs string) (*admission, error) {
	args, err := cni.ParseArgs(cniArgs)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_ARGS: "+err.Error(), "")
	}
	return &admission{s: s, ns: args["K8S_POD_NAMESPACE"]}, nil
}

func (a *admission) check(ctx context.Context, nets []kurma.Network, sel kurma.Selection) error {
	if a.ns == "" {
		return nil
	}
	n, ok := kurma.Find(nets, sel.Network)
	if !ok {
		return nil // Attach reports an unknown network; a DEL has none to run
	}
	return a.checkNet(ctx, n)
}

// checkNet is check for a network's definition.
func (a *admission) checkNet(ctx context.Context, n kurma.Network) error {
	if a.ns == "" {
		return nil
	}
	if n.NeedsLabels() && !a.labelsRead {
		nl, ok := a.s.d.st.(namespaceLabels)
		if !ok {
			return types.NewError(cni.CodeNetworkNotAllowed, fmt.Sprintf(
				"pod network %q: its namespaceSelector needs namespaces' labels, which only skeind --store kubernetes reads; list namespace %q in allowedNamespaces instead", n.Name, a.ns), "")
		}
		labels, err := nl.NamespaceLabels(ctx, a.ns)
		if err != nil {
			return types.NewError(types.ErrTryAgainLater, fmt.Sprintf("pod network %q: the labels of namespace %q cannot be read: %v", n.Name, a.ns, err), "")
		}
		a.labels, a.labelsRead = labels, true
	}
	if !n.Admits(a.ns, a.labels) {
		why := "its allowedNamespaces and namespaceSelector do not include it"
		if !n.Restricted() {
			why = "the network is not a default network and lists no allowedNamespaces or namespaceSelector"
		}
		return types.NewError(cni.CodeNetworkNotAllowed, fmt.Sprintf(
			"pod network %q may not be used by pods of namespace %q: %s", n.Name, a.ns, why), "")
	}
	return nil
}
