package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// rotator keeps the certificate Secret current, patches its CA bundle
// into the webhook configuration and holds the certificate the server
// presents.
//
// Every replica runs one; none needs to lead. Replicas share the Secret
// and change it only by create-if-absent (the loser of a race gets
// AlreadyExists and reads the winner's) or by an update carrying the
// resourceVersion it read (the loser gets Conflict, re-reads, finds the
// winner's fresh certificate no longer due and keeps it). So two replicas
// never rotate one generation twice and always end up serving the same
// certificate. Patching the caBundle is idempotent: each replica writes
// the bundle of the Secret it last read. A replica a rotation behind may
// briefly write the older bundle back; that bundle trusts the current
// certificate too (it was the next CA then), and the next check repairs
// it.
type rotator struct {
	opts   Options
	reader client.Reader // the API server, no cache (Secrets are not watched)
	writer client.Client

	mu      sync.Mutex // one sync at a time
	current atomic.Pointer[tls.Certificate]
	serial  string // of the loaded certificate, under mu
}

var _ manager.LeaderElectionRunnable = (*rotator)(nil)

// NeedLeaderElection is false: every replica serves.
func (r *rotator) NeedLeaderElection() bool { return false }

// Start checks now and every CheckInterval until ctx ends. A failed check
// is logged and retried sooner.
func (r *rotator) Start(ctx context.Context) error {
	logger := log.FromContext(ctx).WithName("webhook-cert")
	for {
		wait := r.opts.CheckInterval
		if err := r.sync(ctx, false); err != nil {
			logger.Error(err, "webhook certificate check failed")
			wait = min(wait, 2*time.Second)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// ready is the replica's readiness check: ready once a serving
// certificate is loaded (before, every call the API server makes to it
// fails its TLS handshake).
func (r *rotator) ready(*http.Request) error {
	if r.current.Load() == nil {
		return errors.New("webhook serving certificate not loaded yet")
	}
	return nil
}

// getCertificate is the TLS server's: the certificate of the last check.
func (r *rotator) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := r.current.Load()
	if c == nil {
		return nil, errors.New("webhook serving certificate not loaded yet")
	}
	return c, nil
}

// Rotate rotates now, whether due or not (a test's, or an operator's
// after a key leak).
func (r *rotator) Rotate(ctx context.Context) error { return r.sync(ctx, true) }

// sync makes the Secret hold a set that is not due (making or rotating
// it), loads the serving certificate and patches the caBundle.
func (r *rotator) sync(ctx context.Context, force bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	set, err := r.ensureSecret(ctx, force)
	if err != nil {
		return err
	}
	// Load before patching: a rotated certificate is signed by the CA
	// that was "next", which the configuration trusts already, so the
	// server need not wait for the patch (nor for a configuration that
	// does not exist yet).
	if sn := set.leaf.SerialNumber.String(); sn != r.serial {
		c, err := set.tlsCertificate()
		if err != nil {
			return err
		}
		r.current.Store(c)
		r.serial = sn
		log.FromContext(ctx).WithName("webhook-cert").Info("serving certificate loaded",
			"serial", sn, "notAfter", set.leaf.NotAfter)
	}
	return r.patchCABundle(ctx, set.data[keyCABundle])
}

// ensureSecret reads the Secret and, when it is missing, damaged or due
// (or force), writes a new set; races with other replicas are retried
// from a fresh read.
func (r *rotator) ensureSecret(ctx context.Context, force bool) (*certSet, error) {
	key := client.ObjectKey{Namespace: r.opts.Namespace, Name: r.opts.SecretName}
	names := r.opts.names()
	for try := 0; try < 5; try++ {
		now := time.Now()
		sec := &corev1.Secret{}
		err := r.reader.Get(ctx, key, sec)
		if apierrors.IsNotFound(err) {
			set, err := newCertSet(now, r.opts.Validity, names)
			if err != nil {
				return nil, err
			}
			sec = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name,
					Labels: map[string]string{"app.kubernetes.io/part-of": "skein"}},
				Type: corev1.SecretTypeOpaque,
				Data: set.data,
			}
			err = r.writer.Create(ctx, sec)
			if apierrors.IsAlreadyExists(err) {
				continue // another replica made it first: use its
			}
			if err != nil {
				return nil, fmt.Errorf("create secret %s: %w", key, err)
			}
			return set, nil
		}
		if err != nil {
			return nil, fmt.Errorf("get secret %s: %w", key, err)
		}
		var set *certSet
		var why string
		old, perr := parseCertSet(sec.Data, true)
		cas, caErr := parseCertSet(sec.Data, false)
		switch {
		case perr != nil && caErr == nil:
			// The serving certificate is damaged but the CAs are sound: a
			// new one from the current CA, which the API server and the
			// other replicas trust already. New CAs would leave every
			// replica serving a certificate the new bundle does not trust
			// until its next check.
			why = "serving certificate unreadable (" + perr.Error() + "): reissued from the current CA"
			set, err = cas.withLeaf(now, r.opts.Validity, names)
		case perr != nil:
			why = "unreadable: " + perr.Error()
			set, err = newCertSet(now, r.opts.Validity, names)
		case force:
			why = "rotation asked for"
			set, err = old.rotate(now, r.opts.Validity, names)
		default:
			if why = old.due(now, r.opts.Validity, names); why == "" {
				return old, nil
			}
			set, err = old.rotate(now, r.opts.Validity, names)
		}
		if err != nil {
			return nil, err
		}
		sec.Data = set.data // sec carries the resourceVersion read
		err = r.writer.Update(ctx, sec)
		if apierrors.IsConflict(err) {
			force = false // someone else just rotated
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("update secret %s: %w", key, err)
		}
		log.FromContext(ctx).WithName("webhook-cert").Info("webhook certificates rotated", "reason", why)
		return set, nil
	}
	return nil, fmt.Errorf("secret %s keeps changing under this replica; will retry", key)
}

// patchCABundle sets caBundle on every webhook of the configuration,
// retrying on conflicts with other writers.
func (r *rotator) patchCABundle(ctx context.Context, bundle []byte) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{}
		if err := r.reader.Get(ctx, client.ObjectKey{Name: r.opts.ConfigName}, cfg); err != nil {
			return err
		}
		changed := false
		for i := range cfg.Webhooks {
			if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, bundle) {
				cfg.Webhooks[i].ClientConfig.CABundle = bundle
				changed = true
			}
		}
		if !changed {
			return nil
		}
		return r.writer.Update(ctx, cfg)
	})
	if err != nil {
		return fmt.Errorf("patch caBundle of ValidatingWebhookConfiguration %s: %w", r.opts.ConfigName, err)
	}
	return nil
}
