package kube

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// Scheme knows the built-in kinds, CRDs and skein.dev/v1alpha1.
var Scheme = runtime.NewScheme()

func init() {
	utilruntime.Must(clientgoscheme.AddToScheme(Scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(Scheme))
	utilruntime.Must(skeinv1.AddToScheme(Scheme))
}

// NewClient is a controller-runtime client (no cache) for cfg with Scheme.
func NewClient(cfg *rest.Config) (client.Client, error) {
	return client.New(cfg, client.Options{Scheme: Scheme})
}

// crdTimeout bounds the wait for a CRD to be established and served.
const crdTimeout = 30 * time.Second

// InstallCRDs creates (or updates) the CRDs in dir's *.yaml files and waits
// until the API server serves each of them.
func InstallCRDs(cfg *rest.Config, dir string) error {
	crds, err := readCRDs(dir)
	if err != nil {
		return err
	}
	if len(crds) == 0 {
		return fmt.Errorf("no CRDs in %s", dir)
	}
	c, err := NewClient(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), crdTimeout)
	defer cancel()
	for _, crd := range crds {
		err := c.Create(ctx, crd)
		if apierrors.IsAlreadyExists(err) {
			old := &apiextensionsv1.CustomResourceDefinition{}
			if err = c.Get(ctx, client.ObjectKeyFromObject(crd), old); err == nil {
				crd.ResourceVersion = old.ResourceVersion
				err = c.Update(ctx, crd)
			}
		}
		if err != nil {
			return fmt.Errorf("create CRD %s: %w", crd.Name, err)
		}
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	for _, crd := range crds {
		if err := waitServed(ctx, c, dc, crd); err != nil {
			return err
		}
	}
	return nil
}

// waitServed waits until crd is Established and discovery lists its
// resource in every served version.
func waitServed(ctx context.Context, c client.Client, dc discovery.DiscoveryInterface, crd *apiextensionsv1.CustomResourceDefinition) error {
	for {
		err := established(ctx, c, crd.Name)
		if err == nil {
			err = discovered(dc, crd)
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRD %s not served: %w", crd.Name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func established(ctx context.Context, c client.Client, name string) error {
	got := &apiextensionsv1.CustomResourceDefinition{}
	if err := c.Get(ctx, client.ObjectKey{Name: name}, got); err != nil {
		return err
	}
	for _, cond := range got.Status.Conditions {
		if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
			return nil
		}
	}
	return errors.New("not established yet")
}

func discovered(dc discovery.DiscoveryInterface, crd *apiextensionsv1.CustomResourceDefinition) error {
	for _, v := range crd.Spec.Versions {
		if !v.Served {
			continue
		}
		list, err := dc.ServerResourcesForGroupVersion(crd.Spec.Group + "/" + v.Name)
		if err != nil {
			return err
		}
		found := false
		for _, r := range list.APIResources {
			found = found || r.Name == crd.Spec.Names.Plural
		}
		if !found {
			return fmt.Errorf("%s/%s lacks %s", crd.Spec.Group, v.Name, crd.Spec.Names.Plural)
		}
	}
	return nil
}

// readCRDs decodes every CustomResourceDefinition in dir/*.yaml.
func readCRDs(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		d := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			err := d.Decode(crd)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("decode %s: %w", f, err)
			}
			if crd.Kind == "" {
				continue // an empty document
			}
			if crd.Kind != "CustomResourceDefinition" {
				return nil, fmt.Errorf("%s: a %s is not a CRD", f, crd.Kind)
			}
			out = append(out, crd)
		}
	}
	return out, nil
}
