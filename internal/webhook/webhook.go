package webhook

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// Path is where the AddressPool validator is served; the
// ValidatingWebhookConfiguration names it.
const Path = "/validate-skein-dev-v1alpha1-addresspool"

// Defaults of Options, matching deploy/kubernetes/webhook.
const (
	DefaultServiceName = "skein-controller-webhook"
	DefaultNamespace   = "skein-system"
	DefaultConfigName  = "skein-addresspool-validation"
	DefaultSecretName  = "skein-webhook-cert"
	DefaultHost        = "127.0.0.1"
	DefaultPort        = 9443
	DefaultValidity    = 90 * 24 * time.Hour
)

// Options configures Add. The zero value serves on 127.0.0.1:9443 for the
// service skein-controller-webhook.skein-system.
type Options struct {
	// ServiceName and Namespace name the Service in front of the webhook;
	// the certificate is made for <ServiceName>.<Namespace>.svc (and the
	// shorter and longer forms, localhost and 127.0.0.1). The Secret lives
	// in Namespace. "" means DefaultServiceName, DefaultNamespace.
	ServiceName, Namespace string
	// ConfigName is the ValidatingWebhookConfiguration whose webhooks get
	// the CA bundle; "" means DefaultConfigName. It is made by the
	// deployment, not here: the controller only patches caBundle.
	ConfigName string
	// SecretName is the Secret holding the CAs and the serving
	// certificate, shared by every replica; "" means DefaultSecretName.
	SecretName string
	// Host is the address the server binds: "" means 127.0.0.1 (tests);
	// in a cluster pass 0.0.0.0 (skein-controller's --webhook-bind-address).
	Host string
	// Port is the server's TCP port; 0 means DefaultPort.
	Port int
	// Validity is how long a serving certificate is valid; it is rotated
	// when a third of that is left. 0 means DefaultValidity (90 days).
	Validity time.Duration
	// CheckInterval is how often the Secret and the caBundle are checked;
	// 0 means Validity/20, at most ten minutes.
	CheckInterval time.Duration
}

func (o Options) withDefaults() Options {
	def := func(s *string, d string) {
		if *s == "" {
			*s = d
		}
	}
	def(&o.ServiceName, DefaultServiceName)
	def(&o.Namespace, DefaultNamespace)
	def(&o.ConfigName, DefaultConfigName)
	def(&o.SecretName, DefaultSecretName)
	def(&o.Host, DefaultHost)
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Validity == 0 {
		o.Validity = DefaultValidity
	}
	if o.CheckInterval == 0 {
		o.CheckInterval = min(o.Validity/20, 10*time.Minute)
	}
	return o
}

// names are the names and addresses the serving certificate covers.
func (o Options) names() []string {
	svc := o.ServiceName + "." + o.Namespace
	return []string{svc + ".svc", svc + ".svc.cluster.local", svc, o.ServiceName, "localhost", "127.0.0.1"}
}

// Add registers with mgr a webhook server on Options.Host:Port serving
// the AddressPool validator at Path, the Egress validator at PathEgress
// and the AddressBlock validator at PathBlock, and the certificate rotator
// that
// keeps its Secret and the caBundle current. Both run on every replica,
// leader or not: the API server may call any replica behind the Service.
//
// mgr's scheme must know skein.dev/v1alpha1, core/v1 and
// admissionregistration/v1. The controller needs get, create and update
// on the Secret, get and update on the ValidatingWebhookConfiguration,
// and list on AddressPools.
func Add(mgr manager.Manager, opts Options) error {
	_, err := add(mgr, opts)
	return err
}

func add(mgr manager.Manager, opts Options) (*rotator, error) {
	opts = opts.withDefaults()
	if opts.Validity < 3*time.Second {
		return nil, fmt.Errorf("webhook certificate validity %v is too short (at least 3s)", opts.Validity)
	}
	r := &rotator{opts: opts, reader: mgr.GetAPIReader(), writer: mgr.GetClient()}
	srv := webhook.NewServer(webhook.Options{
		Host: opts.Host,
		Port: opts.Port,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) {
			c.MinVersion = tls.VersionTLS12
			c.GetCertificate = r.getCertificate
		}},
	})
	v := &poolValidator{reader: mgr.GetAPIReader()}
	srv.Register(Path, admission.WithValidator[*skeinv1.AddressPool](mgr.GetScheme(), v))
	ev := &egressValidator{reader: mgr.GetAPIReader()}
	srv.Register(PathEgress, admission.WithValidator[*skeinv1.Egress](mgr.GetScheme(), ev))
	bv := &blockValidator{reader: mgr.GetClient()}
	srv.Register(PathBlock, admission.WithValidator[*skeinv1.AddressBlock](mgr.GetScheme(), bv))
	if err := mgr.Add(r); err != nil {
		return nil, fmt.Errorf("add webhook certificate rotator: %w", err)
	}
	// Ready means able to answer: a Service sends the API server's calls
	// only to ready replicas.
	if err := mgr.AddReadyzCheck("webhook-certificate", r.ready); err != nil {
		return nil, fmt.Errorf("add the webhook's readiness check: %w", err)
	}
	if err := mgr.Add(srv); err != nil {
		return nil, fmt.Errorf("add webhook server on %s: %w", net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)), err)
	}
	return r, nil
}

// poolValidator runs the rules of validate.go on what the API server sends.
// It lists pools from the API server, not a cache: a cache a moment behind
// would let a pool overlap one just created. (Two pools created at the same
// instant can still both pass; admission cannot serialize them.)
type poolValidator struct {
	reader client.Reader
}

var _ admission.Validator[*skeinv1.AddressPool] = (*poolValidator)(nil)

func (v *poolValidator) others(ctx context.Context) ([]skeinv1.AddressPool, error) {
	var list skeinv1.AddressPoolList
	if err := v.reader.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("list AddressPools to check for overlaps: %w", err)
	}
	return list.Items, nil
}

func (v *poolValidator) ValidateCreate(ctx context.Context, pool *skeinv1.AddressPool) (admission.Warnings, error) {
	others, err := v.others(ctx)
	if err != nil {
		return nil, err
	}
	if err := ValidateCreate(pool, others); err != nil {
		return nil, err
	}
	if err := v.egresses(ctx, pool); err != nil {
		return nil, err
	}
	return nil, v.leftBlocks(ctx, pool)
}

func (v *poolValidator) ValidateUpdate(ctx context.Context, old, pool *skeinv1.AddressPool) (admission.Warnings, error) {
	others, err := v.others(ctx)
	if err != nil {
		return nil, err
	}
	if err := ValidateUpdate(old, pool, others); err != nil {
		return nil, err
	}
	if err := v.egresses(ctx, pool); err != nil {
		return nil, err
	}
	return nil, v.leftBlocks(ctx, pool)
}

// egresses refuses pool when its subnets overlap an Egress's destinations
// (validatePoolEgresses): the reverse of the Egress webhook's check, for
// a pool made after the Egress. Egresses are read from the API server.
func (v *poolValidator) egresses(ctx context.Context, pool *skeinv1.AddressPool) error {
	var egs skeinv1.EgressList
	if err := v.reader.List(ctx, &egs); err != nil {
		return fmt.Errorf("list Egresses to check their destinations for overlaps: %w", err)
	}
	return invalid(pool, validatePoolEgresses(pool, egs.Items))
}

// leftBlocks refuses pool when it overlaps a block of another pool (see
// validateLeftBlocks); blocks are read from the API server.
func (v *poolValidator) leftBlocks(ctx context.Context, pool *skeinv1.AddressPool) error {
	var blocks skeinv1.AddressBlockList
	if err := v.reader.List(ctx, &blocks); err != nil {
		return fmt.Errorf("list AddressBlocks to check for blocks left by a deleted pool: %w", err)
	}
	return invalid(pool, validateLeftBlocks(pool, blocks.Items))
}

// ValidateDelete allows every delete: the pool's finalizer holds a pool
// whose blocks are in use.
func (v *poolValidator) ValidateDelete(context.Context, *skeinv1.AddressPool) (admission.Warnings, error) {
	return nil, nil
}
