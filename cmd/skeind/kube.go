package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"time"

	"github.com/skeinnet/skein/internal/kubeclient"

	"k8s.io/client-go/rest"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/podegress"
	"github.com/skeinnet/skein/internal/routing"
	"github.com/skeinnet/skein/internal/store"
)

// kubeFlags select the store: the embedded one (one host) or the
// Kubernetes API server (pools and blocks shared by a cluster).
type kubeFlags struct {
	store        string
	kubeconfig   string
	grantTimeout time.Duration
	// leaseNamespace holds the node's liveness Lease; leaseDuration is its
	// duration (renewed every quarter of it).
	leaseNamespace string
	leaseDuration  time.Duration
	// minBlockAge: how long an empty block is kept before it is given back.
	minBlockAge time.Duration
	// egress: follow pods' egress annotations (package podegress).
	egress bool
	// syncTimeout bounds the wait for the shared cache; 0 = 1 minute.
	syncTimeout time.Duration
	// wrap, if set, wraps the API client's transport (tests count the
	// requests).
	wrap func(http.RoundTripper) http.RoundTripper
}

// kubeNode is skeind's Kubernetes side: the one informer cache, the store
// reading it (cfg.Store), routing between nodes (cfg.Routes) and the
// egress client (cfg.PodHook, with --egress).
type kubeNode struct {
	cache   *sharedCache
	routing *nodeRouting
	egress  *podegress.Client
}

// validate checks the store flags against cfg before anything is opened.
func (k kubeFlags) validate(cfg daemon.Config) error {
	switch k.store {
	case "embedded", "":
		if k.kubeconfig != "" {
			return fmt.Errorf("--kubeconfig needs --store kubernetes")
		}
		return nil
	case "kubernetes":
	default:
		return fmt.Errorf("--store %q: want embedded or kubernetes", k.store)
	}
	if len(cfg.Pools) > 0 {
		return fmt.Errorf("pools cannot be created by skeind with --store kubernetes (they are AddressPool objects): drop --default-pool and the configuration's pools")
	}
	if cfg.Node == "" {
		return fmt.Errorf("--store kubernetes needs --node (the Node object's name; a DaemonSet passes spec.nodeName)")
	}
	return nil
}

// openKube returns nil for the embedded store (the daemon opens it).
// With --store kubernetes it starts the shared cache and, reading it, the
// Kubernetes store (attachments in the embedded file under cfg.StateDir),
// routing and the egress client, and sets them in cfg; close undoes it
// once the daemon has stopped.
func (k kubeFlags) openKube(ctx context.Context, cfg *daemon.Config, mode routing.Mode, log *slog.Logger) (_ *kubeNode, err error) {
	if err := k.validate(*cfg); err != nil {
		return nil, err
	}
	if k.store != "kubernetes" {
		return nil, nil
	}
	rc, err := k.restConfig(cfg.Node)
	if err != nil {
		return nil, err
	}
	kinds, err := cacheKinds(cfg.Node, k.egress)
	if err != nil {
		return nil, err
	}
	timeout := k.syncTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	kn := &kubeNode{}
	if kn.cache, err = startCache(ctx, rc, kinds, timeout); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if cfg.Store != nil {
				cfg.Store.Close()
				cfg.Store = nil
			}
			kn.close()
		}
	}()
	if cfg.Store, err = openKubeStore(ctx, *cfg, rc, kn.cache, k); err != nil {
		return nil, err
	}
	if kn.routing, err = startRouting(ctx, cfg, mode, rc, kn.cache, log); err != nil {
		return nil, err
	}
	if k.egress {
		if kn.egress, err = startEgress(ctx, cfg, rc, kn.cache, kn.routing.events, log); err != nil {
			return nil, err
		}
	}
	return kn, nil
}

// close stops the egress client, routing and the cache (the store is the
// daemon's to close, before).
func (kn *kubeNode) close() {
	if kn.egress != nil {
		kn.egress.Close()
	}
	if kn.routing != nil {
		kn.routing.stop()
	}
	kn.cache.stop()
}

// openKubeStore opens the Kubernetes store on the shared cache, with
// attachments in the embedded file under cfg.StateDir (the CNI front
// door's in the volatile file beside the socket).
func openKubeStore(ctx context.Context, cfg daemon.Config, rc *rest.Config, c *sharedCache, k kubeFlags) (store.Store, error) {
	dir := cfg.StateDir
	if dir == "" {
		dir = daemon.DefaultStateDir
	}
	durable, err := store.OpenBolt(filepath.Join(dir, "skein.db"), store.BoltOptions{AttachmentsOnly: true})
	if err != nil {
		return nil, err
	}
	local, err := cfg.OpenTiered(durable, false)
	if err != nil {
		durable.Close()
		return nil, err
	}
	st, err := kubestore.New(ctx, kubestore.Options{Config: rc, Node: cfg.Node, Local: local, GrantTimeout: k.grantTimeout,
		LeaseNamespace: k.leaseNamespace, LeaseDuration: k.leaseDuration, Cache: c})
	if err != nil {
		local.Close()
		return nil, err
	}
	return st, nil
}

// restConfig is the API server's configuration, with skeind's user agent.
func (k kubeFlags) restConfig(node string) (*rest.Config, error) {
	rc, err := kubeclient.Config(k.kubeconfig, "")
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "skeind/" + daemon.Version + " (" + node + ")"
	if k.wrap != nil {
		rc.Wrap(k.wrap)
	}
	return rc, nil
}
