package kube

import (
	"context"
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// NodeNameExtra is the user extra the API server sets from the node claim
// of a service account token bound to a Pod (Kubernetes v1.30+,
// ServiceAccountTokenPodNodeInfo; GA in v1.32).
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// tokenSeconds is how long the tokens the helpers ask for live: longer
// than any test.
const tokenSeconds = 3600

// NodeToken returns a service account token of namespace/serviceAccount
// bound to a Pod on node, the token the kubelet would mount into a pod of
// that account on that node: the API server authenticates it as
// system:serviceaccount:<namespace>:<serviceAccount> with the extra
// NodeNameExtra = node. As the admin it creates what is missing: the
// namespace, the Node (a bare object: no kubelet runs), the ServiceAccount
// and the Pod token-<serviceAccount>-<node> (spec.nodeName set; it never
// runs). Deleting that Pod invalidates the token.
func (e *Env) NodeToken(t testing.TB, namespace, serviceAccount, node string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := ensureAccount(ctx, cs, namespace, serviceAccount); err != nil {
		t.Fatal(err)
	}
	err = ignoreExists(cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}))
	if err != nil {
		t.Fatalf("create Node %s: %v", node, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "token-" + serviceAccount + "-" + node},
		Spec: corev1.PodSpec{
			NodeName:           node,
			ServiceAccountName: serviceAccount,
			// test/kube runs without the ServiceAccount admission
			// plugin, which would mount a token volume; say no to it
			// anyway, so a test that turns the plugin on gets the same
			// Pod. The token is asked for below.
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "none", Image: "none.invalid/none"}},
		},
	}
	got, err := cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = cs.CoreV1().Pods(namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err == nil && (got.Spec.NodeName != node || got.Spec.ServiceAccountName != serviceAccount) {
			err = fmt.Errorf("it is on node %q with account %q", got.Spec.NodeName, got.Spec.ServiceAccountName)
		}
	}
	if err != nil {
		t.Fatalf("create Pod %s/%s: %v", namespace, pod.Name, err)
	}
	ref := &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: got.Name, UID: got.UID}
	tok, err := requestToken(ctx, cs, namespace, serviceAccount, ref)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// ServiceAccountToken returns a token of namespace/serviceAccount bound to
// no object (as `kubectl create token` makes): it names no node. It
// creates the namespace and the account if missing.
func (e *Env) ServiceAccountToken(t testing.TB, namespace, serviceAccount string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := ensureAccount(ctx, cs, namespace, serviceAccount); err != nil {
		t.Fatal(err)
	}
	tok, err := requestToken(ctx, cs, namespace, serviceAccount, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TokenConfig reaches the API server with token and nothing else.
func (e *Env) TokenConfig(token string) *rest.Config {
	c := rest.AnonymousClientConfig(e.Config)
	c.BearerToken = token
	return c
}

func ensureAccount(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	err := ignoreExists(cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}))
	if err != nil {
		return fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	if err := ignoreExists(cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{})); err != nil {
		return fmt.Errorf("create ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return nil
}

// requestToken calls the TokenRequest API (serviceaccounts/token) for
// namespace/name, bound to ref when not nil.
func requestToken(ctx context.Context, cs kubernetes.Interface, namespace, name string, ref *authenticationv1.BoundObjectReference) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef:    ref,
		ExpirationSeconds: ptr.To[int64](tokenSeconds),
	}}
	got, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request a token for %s/%s: %w", namespace, name, err)
	}
	return got.Status.Token, nil
}

func ignoreExists[T any](_ T, err error) error {
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
