package egresscontroller

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
)

// AnnotationAllowCustomEgressPods on a Namespace, "true", lets the
// Egresses of that namespace run router pods their template changes
// beyond what TemplatePolicy allows. Only who may edit Namespaces (a
// cluster administrator) sets it.
const AnnotationAllowCustomEgressPods = "egress.skein.dev/allow-custom-pods"

// ReasonEgressTemplateRefused is the Event of an Egress whose template
// asks for what its namespace may not have.
const ReasonEgressTemplateRefused = "TemplateRefused"

// templateViolations lists what eg's template asks for that a tenant's
// Egress may not: the controller writes the routers' Deployment with its
// own rights and makes the router container privileged, so an Egress
// author must not get through it what they could not create themselves.
// It allows, and refuses everything else, field by field, including
// fields a later Kubernetes adds:
//
//   - in the pod: where it runs (nodeSelector, affinity, tolerations,
//     topologySpreadConstraints, priorityClassName, preemptionPolicy),
//     terminationGracePeriodSeconds, DNS, imagePullSecrets,
//     enableServiceLinks, pod-level resources, hostUsers false (a user
//     namespace: more confined), and the controller's own account;
//   - in the router container (the only container): the controller's
//     image, imagePullPolicy, resources, resizePolicy, and environment
//     variables the controller does not set;
//   - in the metadata: labels, and annotations outside the kubernetes.io
//     and skein.dev domains.
//
// So no command, arguments, probes or lifecycle hooks (an exec probe or
// hook runs the tenant's program in the privileged router), no volumes
// (an image or configMap volume would bring it), no ports, no host
// namespaces, no other containers. Nil means allowed. image is the
// controller's --egress-image.
func templateViolations(eg *skeinv1.Egress, image string) []string {
	if eg.Spec.Template == nil {
		return nil
	}
	s := eg.Spec.Template.Spec
	var v []string
	// The named ones first, in the words the docs use.
	if s.HostNetwork || s.HostPID || s.HostIPC {
		v = append(v, "hostNetwork, hostPID or hostIPC")
	}
	if s.HostUsers != nil && *s.HostUsers {
		v = append(v, "hostUsers")
	}
	for _, vol := range s.Volumes {
		if vol.HostPath != nil {
			v = append(v, fmt.Sprintf("hostPath volume %q", vol.Name))
		} else {
			v = append(v, fmt.Sprintf("volume %q", vol.Name))
		}
	}
	if s.ServiceAccountName != "" && s.ServiceAccountName != EgressServiceAccount {
		v = append(v, fmt.Sprintf("serviceAccountName %q (router pods run as %s)", s.ServiceAccountName, EgressServiceAccount))
	}
	if s.DeprecatedServiceAccount != "" && s.DeprecatedServiceAccount != EgressServiceAccount {
		v = append(v, fmt.Sprintf("serviceAccount %q", s.DeprecatedServiceAccount))
	}
	if len(s.InitContainers) > 0 || len(s.EphemeralContainers) > 0 {
		v = append(v, "initContainers or ephemeralContainers")
	}
	if s.SecurityContext != nil {
		v = append(v, "a pod securityContext")
	}
	// Then every other field of the pod that is set and not allowed.
	for _, f := range setFields(s, podAllowed) {
		v = append(v, "spec."+f)
	}
	controllerEnv := map[string]bool{}
	for _, e := range egressEnv() {
		controllerEnv[e.Name] = true
	}
	for _, c := range s.Containers {
		if c.Name != skeinv1.EgressContainerName {
			v = append(v, fmt.Sprintf("container %q beside the router", c.Name))
			continue
		}
		if c.Image != "" && c.Image != image {
			v = append(v, fmt.Sprintf("image %q (the controller's is %q)", c.Image, image))
		}
		if c.SecurityContext != nil {
			v = append(v, "the router container's securityContext")
		}
		if len(c.Command) > 0 {
			v = append(v, "the router container's command")
		}
		for _, d := range c.VolumeDevices {
			v = append(v, fmt.Sprintf("volumeDevice %q", d.Name))
		}
		for _, e := range c.Env {
			if controllerEnv[e.Name] {
				v = append(v, fmt.Sprintf("the router container's %s (the controller sets it)", e.Name))
			}
		}
		for _, f := range setFields(c, containerAllowed) {
			v = append(v, "the router container's "+f)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(eg.Spec.Template.Metadata.Annotations)) {
		if reservedKey(k) {
			v = append(v, fmt.Sprintf("annotation %q", k))
		}
	}
	return v
}

// podAllowed and containerAllowed are the fields (JSON names) a tenant's
// template may set without checks of their own; the fields checked above
// are listed too, so that setFields does not name them twice.
var (
	podAllowed = map[string]bool{
		"nodeSelector": true, "affinity": true, "tolerations": true, "topologySpreadConstraints": true,
		"priorityClassName": true, "preemptionPolicy": true, "terminationGracePeriodSeconds": true,
		"dnsPolicy": true, "dnsConfig": true, "imagePullSecrets": true, "enableServiceLinks": true,
		"resources": true, "containers": true,
		// checked above
		"hostNetwork": true, "hostPID": true, "hostIPC": true, "hostUsers": true, "volumes": true,
		"serviceAccountName": true, "serviceAccount": true, "initContainers": true,
		"ephemeralContainers": true, "securityContext": true,
	}
	containerAllowed = map[string]bool{
		"name": true, "image": true, "imagePullPolicy": true, "resources": true, "resizePolicy": true, "env": true,
		// checked above
		"securityContext": true, "command": true, "volumeDevices": true,
	}
)

// setFields names the fields of struct v (by their JSON names) that are
// set and not in allowed.
func setFields(v any, allowed map[string]bool) []string {
	rv := reflect.ValueOf(v)
	var out []string
	for i := range rv.NumField() {
		f := rv.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			name = f.Name
		}
		if !allowed[name] && !rv.Field(i).IsZero() {
			out = append(out, name)
		}
	}
	return out
}

// reservedKey: annotations of the kubernetes.io and skein.dev domains
// change how Kubernetes or skein treat the pod (its networks, its
// egress, a security profile): not a tenant's to set on a router.
func reservedKey(k string) bool {
	domain, _, ok := strings.Cut(k, "/")
	if !ok {
		return false
	}
	for _, d := range []string{"kubernetes.io", "k8s.io", "skein.dev"} {
		if domain == d || strings.HasSuffix(domain, "."+d) {
			return true
		}
	}
	return false
}

// templateAllowed reports nil when eg's template may be used: it asks for
// nothing templateViolations refuses, or its namespace carries
// AnnotationAllowCustomEgressPods "true". Otherwise an error naming what
// was refused and how an administrator allows it.
func (r *Reconciler) templateAllowed(ctx context.Context, eg *skeinv1.Egress, image string) error {
	v := templateViolations(eg, image)
	if len(v) == 0 {
		return nil
	}
	var ns corev1.Namespace
	if err := r.Client.Get(ctx, client.ObjectKey{Name: eg.Namespace}, &ns); err != nil {
		return fmt.Errorf("read namespace %s for %s: %w", eg.Namespace, AnnotationAllowCustomEgressPods, err)
	}
	if ns.Annotations[AnnotationAllowCustomEgressPods] == "true" {
		return nil
	}
	return fmt.Errorf("spec.template asks for %s, which router pods may not have unless an administrator annotates namespace %s with %s: \"true\"",
		strings.Join(v, ", "), eg.Namespace, AnnotationAllowCustomEgressPods)
}
