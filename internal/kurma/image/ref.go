package image

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Scheme is how an image is located.
type Scheme string

// The schemes a reference may use.
const (
	SchemeFile   Scheme = "file"
	SchemeHTTP   Scheme = "http" // http and https
	SchemeDocker Scheme = "docker"
)

// ErrTagNotAllowed is returned for a docker:// reference that names a tag
// (or nothing, meaning "latest") while tags are not allowed.
var ErrTagNotAllowed = errors.New("image reference is not pinned to a digest (set allowTags to use tags)")

// Source is what a pod network's config says about its image.
type Source struct {
	// Image is the reference: file:///…, http(s)://… or docker://….
	Image string
	// Digest is "sha256:<64 hex>". Required for http(s); for file and
	// docker references it is optional and, when set, must match.
	Digest string
	// AllowTags lets a docker:// reference name a tag; the zero value
	// requires a digest.
	AllowTags bool
	// Insecure allows plain http to any registry; the zero value allows it
	// only for loopback registries.
	Insecure bool
}

// Ref is a parsed Source.
type Ref struct {
	Scheme Scheme
	// Path is the absolute file path (SchemeFile).
	Path string
	// URL is the http(s) address (SchemeHTTP).
	URL string
	// Name is the registry reference (SchemeDocker); when Digest is set it
	// is already the digest reference.
	Name name.Reference
	// Digest is the pinned digest; zero when not known before fetching.
	Digest v1.Hash
	// Insecure is Source.Insecure.
	Insecure bool
	// Original is the reference as written, for messages.
	Original string
}

// Pinned reports whether the digest is known without fetching anything.
func (r Ref) Pinned() bool { return r.Digest.Hex != "" }

func (r Ref) String() string { return r.Original }

// ParseDigest parses "sha256:<64 lowercase hex>".
func ParseDigest(s string) (v1.Hash, error) {
	h, err := v1.NewHash(s)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("parse digest %q: %w", s, err)
	}
	if h.Algorithm != "sha256" {
		return v1.Hash{}, fmt.Errorf("parse digest %q: algorithm %q is not sha256", s, h.Algorithm)
	}
	if len(h.Hex) != 64 || strings.ToLower(h.Hex) != h.Hex {
		return v1.Hash{}, fmt.Errorf("parse digest %q: want 64 lowercase hex digits", s)
	}
	return h, nil
}

// Parse checks a Source and returns its Ref. It does no I/O.
func Parse(src Source) (Ref, error) {
	ref := Ref{Insecure: src.Insecure, Original: src.Image}
	if src.Digest != "" {
		h, err := ParseDigest(src.Digest)
		if err != nil {
			return Ref{}, fmt.Errorf("image %q: %w", src.Image, err)
		}
		ref.Digest = h
	}
	scheme, rest, ok := strings.Cut(src.Image, "://")
	if !ok {
		return Ref{}, fmt.Errorf("image %q: no scheme (want file://, http://, https:// or docker://)", src.Image)
	}
	switch strings.ToLower(scheme) {
	case "file":
		return parseFile(ref, src.Image)
	case "http", "https":
		return parseHTTP(ref, src.Image)
	case "docker":
		return parseDocker(ref, rest, src.AllowTags)
	default:
		return Ref{}, fmt.Errorf("image %q: unknown scheme %q (want file://, http://, https:// or docker://)", src.Image, scheme)
	}
}

func parseFile(ref Ref, s string) (Ref, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Ref{}, fmt.Errorf("image %q: %w", s, err)
	}
	if u.Host != "" && u.Host != "localhost" {
		return Ref{}, fmt.Errorf("image %q: a file reference names a local absolute path (file:///path), not host %q", s, u.Host)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return Ref{}, fmt.Errorf("image %q: a file reference has no query or fragment", s)
	}
	if !path.IsAbs(u.Path) || path.Clean(u.Path) == "/" {
		return Ref{}, fmt.Errorf("image %q: want an absolute file path (file:///path)", s)
	}
	ref.Scheme, ref.Path = SchemeFile, path.Clean(u.Path)
	return ref, nil
}

func parseHTTP(ref Ref, s string) (Ref, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Ref{}, fmt.Errorf("image %q: %w", s, err)
	}
	if u.Host == "" {
		return Ref{}, fmt.Errorf("image %q: no host", s)
	}
	if !ref.Pinned() {
		return Ref{}, fmt.Errorf("image %q: an http(s) image needs a digest field (digest: sha256:…)", s)
	}
	ref.Scheme, ref.URL = SchemeHTTP, u.String()
	return ref, nil
}

func parseDocker(ref Ref, rest string, allowTags bool) (Ref, error) {
	// Kurma's document writes docker:///user/repo for Docker Hub: an empty
	// host means the default registry.
	rest = strings.TrimPrefix(rest, "/")
	if rest == "" {
		return Ref{}, fmt.Errorf("image %q: no repository", ref.Original)
	}
	var opts []name.Option
	if ref.Insecure {
		opts = append(opts, name.Insecure)
	}
	n, err := name.ParseReference(rest, opts...)
	if err != nil {
		return Ref{}, fmt.Errorf("image %q: %w", ref.Original, err)
	}
	switch n := n.(type) {
	case name.Digest:
		h, err := ParseDigest(n.DigestStr())
		if err != nil {
			return Ref{}, fmt.Errorf("image %q: %w", ref.Original, err)
		}
		if ref.Pinned() && ref.Digest != h {
			return Ref{}, fmt.Errorf("image %q: digest field %s differs from the reference's %s", ref.Original, ref.Digest, h)
		}
		ref.Digest = h
	case name.Tag:
		switch {
		case ref.Pinned():
			// The digest field pins the tag's repository.
			n2 := n.Context().Digest(ref.Digest.String())
			ref.Scheme, ref.Name = SchemeDocker, n2
			return ref, nil
		case !allowTags:
			return Ref{}, fmt.Errorf("image %q: %w", ref.Original, ErrTagNotAllowed)
		}
	}
	ref.Scheme, ref.Name = SchemeDocker, n
	return ref, nil
}
