// Package kubeclient is how skein's programs find their API server: a
// kubeconfig file when one is given, else the pod's in-cluster
// configuration. skeind, skein-controller and skein-egress share it.
package kubeclient

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config reads kubeconfig, or the in-cluster configuration when it is "",
// and names the program in the requests' User-Agent ("" keeps
// client-go's).
func Config(kubeconfig, userAgent string) (*rest.Config, error) {
	var c *rest.Config
	var err error
	if kubeconfig == "" {
		if c, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("in-cluster configuration (give --kubeconfig outside a cluster): %w", err)
		}
	} else if c, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("--kubeconfig %s: %w", kubeconfig, err)
	}
	if userAgent != "" {
		c.UserAgent = userAgent
	}
	return c, nil
}
