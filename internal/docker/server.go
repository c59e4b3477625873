package docker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/keylock"
	"github.com/skeinnet/skein/internal/store"
	"github.com/skeinnet/skein/internal/unixsock"
)

// DefaultSocket is where Docker discovers the plugin named "skein".
const DefaultSocket = "/run/docker/plugins/skein.sock"

// MaxBody bounds a request body; Docker's largest (CreateNetwork with many
// options) is a few KiB.
const MaxBody = 1 << 20

// Address spaces announced by GetDefaultAddressSpaces. Both map to the
// same skein pools; a Docker network's scope only decides which one
// Docker names.
const (
	LocalAddressSpace  = "skein-local"
	GlobalAddressSpace = "skein-global"
)

// Owner marks store attachments made by this front door: endpoints (one
// per container interface) and IPAM leases (one per address Docker holds).
const Owner = "docker"

// Plumber is what the driver needs from the dataplane
// (*dataplane.Dataplane). Both return when what they made or removed is
// in place or gone (Teardown before the kernel has freed the pair's
// memory); Teardown succeeds when the link is already gone.
type Plumber interface {
	SetupPair(dataplane.Pair) (dataplane.Applied, error)
	Teardown(hostName, netnsPath, ifName string, addrs []netip.Addr) error
	Config() dataplane.Config
}

var _ Plumber = (*dataplane.Dataplane)(nil)

// Options configures a Driver.
type Options struct {
	// Store holds every record (required).
	Store store.Store
	// IPAM hands out addresses (required).
	IPAM *ipam.Manager
	// Dataplane plumbs endpoints (required).
	Dataplane Plumber
	// DefaultPool serves networks created without --subnet or
	// skein.pool; "" = "default".
	DefaultPool string
	// MTU of endpoints; 0 = the dataplane's default.
	MTU int
	// Logger; nil = slog.Default().
	Logger *slog.Logger
	// Observe, if set, is told of every request: its method, 0 or the
	// HTTP status of the error, and how long it took.
	Observe func(method string, code uint, took time.Duration)
}

// Driver is skein's libnetwork remote NetworkDriver and IpamDriver. Its
// state lives in the store only, so a restarted skeind answers Docker at
// once: Docker does not activate a plugin again.
type Driver struct {
	o   Options
	log *slog.Logger
	gw4 netip.Addr
	gw6 netip.Addr

	// mu orders network-level changes (pools, networks: rare) against
	// everything else; endpoint and address calls share it.
	mu sync.RWMutex
	// endpoints serialises the calls of one endpoint (by record key).
	endpoints keylock.Locks
}

// New returns a Driver; it does not listen (see Handler and Listen).
func New(o Options) (*Driver, error) {
	if o.Store == nil || o.IPAM == nil || o.Dataplane == nil {
		return nil, errors.New("docker driver: Store, IPAM and Dataplane are required")
	}
	if o.DefaultPool == "" {
		o.DefaultPool = "default"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	cfg := o.Dataplane.Config()
	d := &Driver{o: o, log: o.Logger, gw4: cfg.GatewayV4, gw6: cfg.GatewayV6}
	if err := d.markBorrowed(context.Background()); err != nil {
		return nil, err
	}
	return d, nil
}

// markBorrowed marks endpoint records written before store.Attachment had
// Borrowed: their addresses are their leases'. (Until it runs once, the
// daemon's start reports such addresses as restored twice.)
func (d *Driver) markBorrowed(ctx context.Context) error {
	atts, err := d.o.Store.ListAttachments(ctx)
	if err != nil {
		return fmt.Errorf("docker: list attachments: %w", err)
	}
	for _, a := range atts {
		if a.Owner != Owner || a.HostLink == "" || a.Borrowed {
			continue
		}
		a.Borrowed = true
		if err := d.o.Store.UpdateAttachment(ctx, a); err != nil {
			return fmt.Errorf("docker: mark endpoint %s as borrowing its addresses: %w", a.AttachmentKey, err)
		}
	}
	return nil
}

// method is one endpoint: newReq makes the request to decode into (nil:
// the body is read but not decoded), call returns the reply to encode.
type method struct {
	name   string
	newReq func() any
	call   func(*http.Request, any) (any, error)
}

// Handler serves every endpoint of both driver APIs.
func (d *Driver) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, m := range d.methods() {
		mux.Handle("/"+m.name, d.wrap(m))
	}
	return mux
}

// wrap turns a method into an HTTP handler: POST only, body at most
// MaxBody, JSON in, JSON out, errors as HTTP 500 {"Err": …}.
func (d *Driver) wrap(m method) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		reply, err := d.serve(m, w, r)
		code := uint(0)
		w.Header().Set("Content-Type", "application/vnd.docker.plugins.v1+json")
		if err != nil {
			code = http.StatusInternalServerError
			d.log.Warn("docker request failed", "method", m.name, "err", err)
			w.WriteHeader(http.StatusInternalServerError)
			_ = json.NewEncoder(w).Encode(errorResponse{Err: err.Error(), Error: err.Error()})
		} else {
			d.log.Debug("docker request", "method", m.name, "took", time.Since(start))
			if reply == nil {
				reply = struct{}{}
			}
			_ = json.NewEncoder(w).Encode(reply)
		}
		if d.o.Observe != nil {
			d.o.Observe(m.name, code, time.Since(start))
		}
	})
}

func (d *Driver) serve(m method, w http.ResponseWriter, r *http.Request) (any, error) {
	if r.Method != http.MethodPost {
		return nil, fmt.Errorf("%s: method %s not allowed, use POST", m.name, r.Method)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, fmt.Errorf("%s: request body larger than %d bytes (1 MiB)", m.name, MaxBody)
		}
		return nil, fmt.Errorf("%s: read request: %w", m.name, err)
	}
	var req any
	if m.newReq != nil {
		req = m.newReq()
		if s := strings.TrimSpace(string(body)); s != "" {
			if err := json.Unmarshal(body, req); err != nil {
				return nil, fmt.Errorf("%s: malformed JSON request: %w", m.name, err)
			}
		}
	}
	return m.call(r, req)
}

func (d *Driver) methods() []method {
	none := func(f func() (any, error)) func(*http.Request, any) (any, error) {
		return func(*http.Request, any) (any, error) { return f() }
	}
	return []method{
		{"Plugin.Activate", nil, none(func() (any, error) {
			return activateResponse{Implements: []string{"NetworkDriver", "IpamDriver"}}, nil
		})},
		{"NetworkDriver.GetCapabilities", nil, none(func() (any, error) {
			return capabilitiesResponse{Scope: "local", ConnectivityScope: "local"}, nil
		})},
		{"NetworkDriver.CreateNetwork", func() any { return &createNetworkRequest{} }, func(r *http.Request, q any) (any, error) {
			return nil, d.createNetwork(r.Context(), q.(*createNetworkRequest))
		}},
		{"NetworkDriver.DeleteNetwork", func() any { return &networkRequest{} }, func(r *http.Request, q any) (any, error) {
			return nil, d.deleteNetwork(r.Context(), q.(*networkRequest).NetworkID)
		}},
		// Allocate/FreeNetwork are swarm's (global scope) and never sent to
		// a local-scope driver; answered for completeness.
		{"NetworkDriver.AllocateNetwork", func() any { return &allocateNetworkRequest{} }, func(_ *http.Request, q any) (any, error) {
			if q.(*allocateNetworkRequest).NetworkID == "" {
				return nil, errors.New("AllocateNetwork: NetworkID is required")
			}
			return allocateNetworkResponse{Options: map[string]string{}}, nil
		}},
		{"NetworkDriver.FreeNetwork", func() any { return &networkRequest{} }, func(_ *http.Request, q any) (any, error) {
			if q.(*networkRequest).NetworkID == "" {
				return nil, errors.New("FreeNetwork: NetworkID is required")
			}
			return nil, nil
		}},
		{"NetworkDriver.CreateEndpoint", func() any { return &createEndpointRequest{} }, func(r *http.Request, q any) (any, error) {
			return d.createEndpoint(r.Context(), q.(*createEndpointRequest))
		}},
		{"NetworkDriver.EndpointOperInfo", func() any { return &endpointRequest{} }, func(r *http.Request, q any) (any, error) {
			return d.endpointInfo(r.Context(), q.(*endpointRequest))
		}},
		{"NetworkDriver.DeleteEndpoint", func() any { return &endpointRequest{} }, func(r *http.Request, q any) (any, error) {
			return nil, d.deleteEndpoint(r.Context(), q.(*endpointRequest))
		}},
		{"NetworkDriver.Join", func() any { return &joinRequest{} }, func(r *http.Request, q any) (any, error) {
			return d.join(r.Context(), q.(*joinRequest))
		}},
		{"NetworkDriver.Leave", func() any { return &endpointRequest{} }, func(r *http.Request, q any) (any, error) {
			_, err := d.endpoint(r.Context(), q.(*endpointRequest))
			return nil, err
		}},
		// External connectivity is routing, always on: the node routes the
		// pod addresses like CNI's.
		{"NetworkDriver.ProgramExternalConnectivity", func() any { return &endpointRequest{} }, func(r *http.Request, q any) (any, error) {
			_, err := d.endpoint(r.Context(), q.(*endpointRequest))
			return nil, err
		}},
		{"NetworkDriver.RevokeExternalConnectivity", func() any { return &endpointRequest{} }, func(_ *http.Request, q any) (any, error) {
			return nil, validIDs(q.(*endpointRequest).NetworkID, q.(*endpointRequest).EndpointID)
		}},
		{"NetworkDriver.DiscoverNew", func() any { return &discoveryNotification{} }, none(func() (any, error) { return nil, nil })},
		{"NetworkDriver.DiscoverDelete", func() any { return &discoveryNotification{} }, none(func() (any, error) { return nil, nil })},

		{"IpamDriver.GetCapabilities", nil, none(func() (any, error) {
			return ipamCapabilitiesResponse{}, nil
		})},
		{"IpamDriver.GetDefaultAddressSpaces", nil, none(func() (any, error) {
			return addressSpacesResponse{LocalDefaultAddressSpace: LocalAddressSpace, GlobalDefaultAddressSpace: GlobalAddressSpace}, nil
		})},
		{"IpamDriver.RequestPool", func() any { return &requestPoolRequest{} }, func(r *http.Request, q any) (any, error) {
			return d.requestPool(r.Context(), q.(*requestPoolRequest))
		}},
		{"IpamDriver.ReleasePool", func() any { return &releasePoolRequest{} }, func(r *http.Request, q any) (any, error) {
			return nil, d.releasePool(r.Context(), q.(*releasePoolRequest).PoolID)
		}},
		{"IpamDriver.RequestAddress", func() any { return &requestAddressRequest{} }, func(r *http.Request, q any) (any, error) {
			return d.requestAddress(r.Context(), q.(*requestAddressRequest))
		}},
		{"IpamDriver.ReleaseAddress", func() any { return &releaseAddressRequest{} }, func(r *http.Request, q any) (any, error) {
			return nil, d.releaseAddress(r.Context(), q.(*releaseAddressRequest))
		}},
	}
}

// Server is a Driver serving on a UNIX socket.
type Server struct {
	path string
	http *http.Server
	done chan struct{}
}

// Listen serves d on a UNIX socket at path (mode 0600; a stale socket is
// replaced) until Close.
func Listen(d *Driver, path string) (*Server, error) {
	l, err := unixsock.Listen("unix", path) // mode 0600 from the start
	if err != nil {
		return nil, fmt.Errorf("docker plugin: %w", err)
	}
	s := &Server{path: path, http: &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := s.http.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("docker plugin server stopped", "err", err)
		}
	}()
	d.log.Info("docker plugin serving", "socket", path)
	return s, nil
}

// Close stops accepting, waits for calls in flight and removes the socket
// (closing the listener does, unless another socket replaced it).
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.http.Shutdown(ctx); err != nil {
		_ = s.http.Close()
	}
	<-s.done
}
