package v1alpha1

import (
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Egress is a NAT gateway for chosen pods: skein-controller runs it as a
// Deployment of router pods (skein-egress) behind a Service of the same
// name. Client pods annotated egress.skein.dev/<namespace>: <name> send
// their traffic for spec.destinations through a Foo-over-UDP tunnel to the
// Service; a router SNATs it to its own address.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=skegress,categories=skein
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Egress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec EgressSpec `json:"spec"`
	// +optional
	Status EgressStatus `json:"status,omitempty"`
}

// Session affinity and FoU source port choices of an Egress.
const (
	// FoUSourcePortFixed: every client sends from EgressFoUPort, as the
	// Coil design does; a client's flows all hash to one path.
	FoUSourcePortFixed = "Fixed"
	// FoUSourcePortAuto: the kernel picks the source port per flow
	// (encap-sport auto), which spreads one client's flows over paths
	// that hash on ports.
	FoUSourcePortAuto = "Auto"
	// EgressFoUPort is the UDP port routers listen on for FoU and the
	// port of the Egress Service.
	EgressFoUPort = 5555
	// EgressContainerName is the router container in the Deployment's
	// pod template; a container of spec.template with this name is merged
	// into it.
	EgressContainerName = "egress"
	// LabelEgress on router pods, the Deployment and the Service names
	// their Egress.
	LabelEgress = "egress.skein.dev/name"
	// AnnotationEgressPrefix + <namespace> on a client pod lists, comma
	// separated, the Egresses of that namespace the pod uses.
	AnnotationEgressPrefix = "egress.skein.dev/"
)

// EgressSpec is the desired gateway.
type EgressSpec struct {
	// Destinations are the IPv4 and IPv6 CIDRs whose traffic goes through
	// the gateway, without host bits and without duplicates. Apart from
	// a default route (0.0.0.0/0, ::/0), which clients use only after their
	// routes to the cluster's networks, they may not overlap an
	// AddressPool unless allowPoolOverlap is set.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=128
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self)",message="each destination must be a CIDR such as 192.0.2.0/24 or 2001:db8::/32"
	// +kubebuilder:validation:items:XValidation:rule="!isCIDR(self) || cidr(self) == cidr(self).masked()",message="a destination has host bits set"
	// +kubebuilder:validation:XValidation:rule="self.all(x, self.exists_one(y, x == y))",message="destinations must not repeat"
	// +listType=atomic
	Destinations []string `json:"destinations"`

	// AllowPoolOverlap lets destinations overlap the cluster's
	// AddressPools (e.g. to reach another cluster's pods through NAT).
	// +optional
	AllowPoolOverlap bool `json:"allowPoolOverlap,omitempty"`

	// ClientNamespaces are the namespaces, besides the Egress's own, whose
	// pods may use it ("*": every namespace). A pod annotated for an
	// Egress that does not serve its namespace gets no tunnel, and the
	// routers do not accept its packets.
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:XValidation:rule="self == '*' || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="each entry must be a namespace name or *"
	// +listType=atomic
	// +optional
	ClientNamespaces []string `json:"clientNamespaces,omitempty"`

	// Replicas is the number of router pods (the scale subresource's
	// spec.replicas).
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:default=1
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Strategy replaces router pods, as a Deployment's strategy does.
	// +optional
	Strategy *appsv1.DeploymentStrategy `json:"strategy,omitempty"`

	// Template overrides the router pods: its labels and annotations are
	// added, its pod spec fields replace the defaults, and a container
	// named "egress" is merged into the router container (image, resources,
	// env...); other containers are added.
	// +optional
	Template *EgressPodTemplate `json:"template,omitempty"`

	// SessionAffinity of the Service: ClientIP (default) keeps a client's
	// tunnel on one router, so its NAT state stays in one place; None
	// spreads packets over routers and breaks connections.
	// +kubebuilder:validation:Enum=ClientIP;None
	// +kubebuilder:default=ClientIP
	// +optional
	SessionAffinity corev1.ServiceAffinity `json:"sessionAffinity,omitempty"`

	// SessionAffinityConfig of the Service (the ClientIP timeout; the
	// Kubernetes default is three hours).
	// +optional
	SessionAffinityConfig *corev1.SessionAffinityConfig `json:"sessionAffinityConfig,omitempty"`

	// FoUSourcePort chooses the UDP source port of client tunnels:
	// Fixed (default) sends from 5555, Auto picks one per flow.
	// +kubebuilder:validation:Enum=Fixed;Auto
	// +kubebuilder:default=Fixed
	// +optional
	FoUSourcePort string `json:"fouSourcePort,omitempty"`
}

// EgressPodTemplate is the part of a pod template an Egress may override.
type EgressPodTemplate struct {
	// Metadata: labels and annotations added to router pods.
	// +optional
	Metadata EgressPodMetadata `json:"metadata,omitempty"`
	// Spec overrides of the router pods, a core/v1 PodSpec. The CRD keeps
	// it schemaless (a full PodSpec schema would make the CRD too large for
	// kubectl apply); the API server checks it when the controller writes
	// the Deployment, and the controller reports a refusal as an event.
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	// +kubebuilder:pruning:PreserveUnknownFields
	// +optional
	Spec corev1.PodSpec `json:"spec,omitempty"`
}

// EgressPodMetadata is the metadata of router pods an Egress may set.
type EgressPodMetadata struct {
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// EgressStatus is what the controller observed.
type EgressStatus struct {
	// Replicas is the number of router pods of the Deployment.
	// +optional
	Replicas int32 `json:"replicas"`
	// Selector is the label selector of router pods, in string form, for
	// the scale subresource (an HPA reads it).
	// +optional
	Selector string `json:"selector,omitempty"`
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
}

// EgressList is a list of Egresses.
// +kubebuilder:object:root=true
type EgressList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Egress `json:"items"`
}

// Serves reports whether pods of namespace ns may use the Egress: its own
// namespace's, and those spec.clientNamespaces lists ("*" lists all).
func (eg *Egress) Serves(ns string) bool {
	return ns == eg.Namespace || slices.Contains(eg.Spec.ClientNamespaces, ns) || slices.Contains(eg.Spec.ClientNamespaces, "*")
}
