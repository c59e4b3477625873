package kurma

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/skeinnet/skein/internal/kurma/image"
)

// DefaultTimeout bounds one add or del of a network that sets no timeout
// (the contract's one minute).
const DefaultTimeout = 60 * time.Second

// TypeSkein is the plugin type skeind serves itself when a network names no
// image: a pool of skein's own.
const TypeSkein = "skein"

// DefaultPool is the pool of a skein network without a "pool" key.
const DefaultPool = "default"

// Network is one entry of the podNetworks configuration.
type Network struct {
	// Name identifies the network; pods ask for it by name.
	Name string
	// Image is the plugin image reference as written ("" for a built-in
	// skein network); Ref is it parsed.
	Image string
	Ref   image.Ref
	// Default networks are attached when a pod asks for none.
	Default bool
	// ContainerInterface is the interface name template ("" = none).
	ContainerInterface string
	// Optional: a failed add is skipped and reported, not fatal.
	Optional bool
	// Timeout bounds one add or del. Default DefaultTimeout.
	Timeout time.Duration
	// Type is the entry's "type" key (CNI's plugin type).
	Type string
	// Pool is the pool of a built-in skein network (its "pool" key,
	// default DefaultPool); empty for image networks.
	Pool string
	// Raw is the whole entry as written: the plugin's stdin.
	Raw json.RawMessage
	// AllowedNamespaces and NamespaceSelector say which Kubernetes
	// namespaces' pods may use the network (Admits). Nil selector: none.
	AllowedNamespaces []string
	NamespaceSelector *NamespaceSelector
}

// NamespaceSelector selects namespaces by their labels: every label in
// MatchLabels must be on the namespace. An empty one selects every
// namespace (an open network, said out loud).
type NamespaceSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

// Restricted reports whether the network has an allow-list.
func (n *Network) Restricted() bool {
	return len(n.AllowedNamespaces) > 0 || n.NamespaceSelector != nil
}

// NeedsLabels reports whether Admits needs the namespace's labels.
func (n *Network) NeedsLabels() bool { return n.NamespaceSelector != nil }

// Admits reports whether pods of Kubernetes namespace ns, labelled labels,
// may use the network: ns is in AllowedNamespaces or its labels match
// NamespaceSelector. A network with neither admits every namespace only
// if it is a default network (what a pod gets without asking); any other
// network must say who may use it, so that a pod's annotation, which its
// owner writes, cannot put it on another team's network.
func (n *Network) Admits(ns string, labels map[string]string) bool {
	if !n.Restricted() {
		return n.Default
	}
	if slices.Contains(n.AllowedNamespaces, ns) {
		return true
	}
	if n.NamespaceSelector == nil {
		return false
	}
	for k, v := range n.NamespaceSelector.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// namespaceName is a Kubernetes namespace name (an RFC 1123 label).
var namespaceName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// parseAllowList reads allowedNamespaces and namespaceSelector. The
// selector is decoded strictly: a key skein does not know (matchExpressions)
// would otherwise be dropped and the network left open to namespaces the
// administrator meant to keep out.
func parseAllowList(n *Network, obj map[string]json.RawMessage) error {
	if raw, ok := obj["allowedNamespaces"]; ok {
		if err := json.Unmarshal(raw, &n.AllowedNamespaces); err != nil {
			return fmt.Errorf("allowedNamespaces: want a list of namespace names: %w", err)
		}
		for _, ns := range n.AllowedNamespaces {
			if !namespaceName.MatchString(ns) {
				return fmt.Errorf("allowedNamespaces: %q is not a namespace name", ns)
			}
		}
	}
	if raw, ok := obj["namespaceSelector"]; ok {
		// null would decode as the empty selector, which admits every
		// namespace: in JSON and in Kubernetes null means "not given".
		if bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
			return errors.New(`namespaceSelector: null; leave it out (only allowedNamespaces then), or write {} to admit every namespace`)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var sel NamespaceSelector
		if err := dec.Decode(&sel); err != nil {
			return fmt.Errorf("namespaceSelector: want {\"matchLabels\": {…}} (only matchLabels is supported): %w", err)
		}
		for k := range sel.MatchLabels {
			if k == "" {
				return errors.New("namespaceSelector: an empty label key")
			}
		}
		n.NamespaceSelector = &sel
	}
	return nil
}

// Builtin reports whether skeind serves the network itself.
func (n *Network) Builtin() bool { return n.Image == "" }

// entry holds the keys of an entry skein reads; the rest only travels.
type entry struct {
	Name               string          `json:"name"`
	Image              string          `json:"image"`
	ACI                string          `json:"aci"`
	Digest             string          `json:"digest"`
	AllowTags          bool            `json:"allowTags"`
	Insecure           bool            `json:"insecure"`
	Default            bool            `json:"default"`
	ContainerInterface string          `json:"containerInterface"`
	Optional           bool            `json:"optional"`
	Timeout            json.RawMessage `json:"timeout"`
	Type               string          `json:"type"`
	Pool               string          `json:"pool"`
}

var networkName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)

// ParseNetworks parses and validates the podNetworks list (a JSON array of
// objects; null or empty means none). Every error names the entry.
func ParseNetworks(raw json.RawMessage) ([]Network, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var entries []json.RawMessage
	if err := json.Unmarshal(raw, &entries); err != nil {
		return nil, fmt.Errorf("podNetworks: want a list of objects: %w", err)
	}
	var out []Network
	seen := map[string]bool{}
	for i, e := range entries {
		n, err := ParseNetwork(e)
		if err != nil {
			return nil, fmt.Errorf("podNetworks[%d]: %w", i, err)
		}
		if seen[n.Name] {
			return nil, fmt.Errorf("podNetworks[%d]: network %q defined twice", i, n.Name)
		}
		seen[n.Name] = true
		out = append(out, n)
	}
	return out, nil
}

// ParseNetwork parses one entry.
func ParseNetwork(raw json.RawMessage) (Network, error) {
	var e entry
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&e); err != nil {
		return Network{}, fmt.Errorf("decode network entry: %w", err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return Network{}, errors.New("network entry: want a JSON object")
	}
	n := Network{
		Name:               e.Name,
		Default:            e.Default,
		ContainerInterface: e.ContainerInterface,
		Optional:           e.Optional,
		Type:               e.Type,
		Timeout:            DefaultTimeout,
		Raw:                append(json.RawMessage(nil), bytes.TrimSpace(raw)...),
	}
	if !networkName.MatchString(e.Name) {
		return n, fmt.Errorf("network name %q: want 1-63 letters, digits, '_', '.' or '-', starting with a letter or digit", e.Name)
	}
	where := fmt.Sprintf("network %q", e.Name)
	if e.Image != "" && e.ACI != "" && e.Image != e.ACI {
		return n, fmt.Errorf("%s: both image and its alias aci are set, to different values", where)
	}
	n.Image = e.Image
	if n.Image == "" {
		n.Image = e.ACI
	}
	if len(e.Timeout) > 0 {
		d, err := parseTimeout(e.Timeout)
		if err != nil {
			return n, fmt.Errorf("%s: timeout: %w", where, err)
		}
		n.Timeout = d
	}
	if _, err := parseTemplate(n.ContainerInterface); err != nil {
		return n, fmt.Errorf("%s: containerInterface: %w", where, err)
	}
	if err := parseAllowList(&n, obj); err != nil {
		return n, fmt.Errorf("%s: %w", where, err)
	}
	if n.Image == "" {
		if e.Type != TypeSkein {
			return n, fmt.Errorf("%s: no image (or aci) given, and only a network of type %q can do without one", where, TypeSkein)
		}
		n.Pool = e.Pool
		if n.Pool == "" {
			n.Pool = DefaultPool
		}
		if n.ContainerInterface == "" {
			return n, fmt.Errorf("%s: a skein network needs a containerInterface", where)
		}
		return n, nil
	}
	ref, err := image.Parse(image.Source{Image: n.Image, Digest: e.Digest, AllowTags: e.AllowTags, Insecure: e.Insecure})
	if err != nil {
		return n, fmt.Errorf("%s: image: %w", where, err)
	}
	n.Ref = ref
	return n, nil
}

// parseTimeout accepts a Go duration string ("90s") or a number of seconds.
func parseTimeout(raw json.RawMessage) (time.Duration, error) {
	var d time.Duration
	var s string
	var f float64
	switch {
	case json.Unmarshal(raw, &s) == nil:
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, err
		}
	case json.Unmarshal(raw, &f) == nil:
		d = time.Duration(f * float64(time.Second))
	default:
		return 0, fmt.Errorf("%s: want a duration (\"90s\") or seconds", raw)
	}
	if d <= 0 || d > time.Hour {
		return 0, fmt.Errorf("%v: want more than 0 and at most 1h", d)
	}
	return d, nil
}

// Defaults returns the names of the default networks, in config order.
func Defaults(nets []Network) []string {
	var out []string
	for _, n := range nets {
		if n.Default {
			out = append(out, n.Name)
		}
	}
	return out
}

// Find returns the network named name.
func Find(nets []Network, name string) (Network, bool) {
	i := slices.IndexFunc(nets, func(n Network) bool { return n.Name == name })
	if i < 0 {
		return Network{}, false
	}
	return nets[i], true
}
