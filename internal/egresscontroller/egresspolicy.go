package egresscontroller

import (
	"context"
	"fmt"
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
// own rights, so an Egress author must not get through it what they could
// not create themselves — the host's namespaces or files, an account or
// image of their choosing, containers beside the router, or a router
// container more privileged than the controller makes it. Nil means
// allowed. image is the controller's --egress-image.
func templateViolations(eg *skeinv1.Egress, image string) []string {
	if eg.Spec.Template == nil {
		return nil
	}
	s := eg.Spec.Template.Spec
	var v []string
	if s.HostNetwork || s.HostPID || s.HostIPC {
		v = append(v, "hostNetwork, hostPID or hostIPC")
	}
	if s.HostUsers != nil && *s.HostUsers {
		// false asks for a user namespace: more confined, allowed.
		v = append(v, "hostUsers")
	}
	for _, vol := range s.Volumes {
		if vol.HostPath != nil {
			v = append(v, fmt.Sprintf("hostPath volume %q", vol.Name))
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
	}
	return v
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
