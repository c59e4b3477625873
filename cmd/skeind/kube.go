package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skeinnet/skein/internal/daemon"
	"github.com/skeinnet/skein/internal/kubestore"
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
}

// openStore returns nil for the embedded store (the daemon opens it), or
// the Kubernetes store with attachments in the embedded file under
// cfg.StateDir.
func (k kubeFlags) openStore(ctx context.Context, cfg daemon.Config) (store.Store, error) {
	switch k.store {
	case "embedded", "":
		if k.kubeconfig != "" {
			return nil, fmt.Errorf("--kubeconfig needs --store kubernetes")
		}
		return nil, nil
	case "kubernetes":
	default:
		return nil, fmt.Errorf("--store %q: want embedded or kubernetes", k.store)
	}
	if len(cfg.Pools) > 0 {
		return nil, fmt.Errorf("pools cannot be created by skeind with --store kubernetes (they are AddressPool objects): drop --default-pool and the configuration's pools")
	}
	if cfg.Node == "" {
		return nil, fmt.Errorf("--store kubernetes needs --node (the Node object's name; a DaemonSet passes spec.nodeName)")
	}
	rc, err := k.restConfig(cfg.Node)
	if err != nil {
		return nil, err
	}
	dir := cfg.StateDir
	if dir == "" {
		dir = daemon.DefaultStateDir
	}
	local, err := store.OpenBolt(filepath.Join(dir, "skein.db"), store.BoltOptions{AttachmentsOnly: true})
	if err != nil {
		return nil, err
	}
	st, err := kubestore.New(ctx, kubestore.Options{Config: rc, Node: cfg.Node, Local: local, GrantTimeout: k.grantTimeout,
		LeaseNamespace: k.leaseNamespace, LeaseDuration: k.leaseDuration})
	if err != nil {
		local.Close()
		return nil, err
	}
	return st, nil
}

// restConfig is the API server's configuration, with skeind's user agent.
func (k kubeFlags) restConfig(node string) (*rest.Config, error) {
	rc, err := restConfig(k.kubeconfig)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "skeind/" + daemon.Version + " (" + node + ")"
	return rc, nil
}

// restConfig reads path, or the in-cluster configuration when path is "".
func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		rc, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster kubernetes configuration (give --kubeconfig outside a pod): %w", err)
		}
		return rc, nil
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", path, err)
	}
	return rc, nil
}
