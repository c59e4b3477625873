package v1alpha1

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// WantedEgresses lists the Egresses a pod's annotations name, sorted by
// namespace/name, without repeats: egress.skein.dev/<namespace> holds a
// comma-separated list of names in <namespace>; spaces around names and
// empty items are ignored.
func WantedEgresses(annotations map[string]string) []types.NamespacedName {
	var out []types.NamespacedName
	for k, v := range annotations {
		ns, ok := strings.CutPrefix(k, AnnotationEgressPrefix)
		if !ok || ns == "" {
			continue
		}
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				out = append(out, types.NamespacedName{Namespace: ns, Name: name})
			}
		}
	}
	slices.SortFunc(out, func(a, b types.NamespacedName) int { return strings.Compare(a.String(), b.String()) })
	return slices.Compact(out)
}
