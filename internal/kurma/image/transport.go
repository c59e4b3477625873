package image

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// ErrInsecure is wrapped by the error for a plain-http registry request to
// a host that is not loopback while Source.Insecure is off.
var ErrInsecure = errors.New("plain http to a non-loopback registry (set insecure to allow)")

// httpGuard refuses plain-http requests except to loopback hosts.
// go-containerregistry falls back to http for private (RFC 1918) and
// *.local registries on its own; here that takes an explicit Insecure.
type httpGuard struct {
	next     http.RoundTripper
	insecure bool
}

func (g httpGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && !g.insecure && !loopbackHost(req.URL.Hostname()) {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("request %s: %w", req.URL.Redacted(), ErrInsecure)
	}
	return g.next.RoundTrip(req)
}

func loopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
