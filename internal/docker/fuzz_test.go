package docker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/skeinnet/skein/internal/dataplane"
	"github.com/skeinnet/skein/internal/ipam"
	"github.com/skeinnet/skein/internal/store"
)

// testdata/docker-20.10-session.json is every request Docker 20.10
// (Debian's docker.io) sent to skein's plugin, and skein's replies, for:
// network create without --subnet; with --subnet, --ip-range, --gateway
// and --aux-address; dual stack with --ipv6; docker run with --ip,
// --network-alias and --ip6; network connect; a run refused for an
// address in use; rm -f of both containers; network rm of all three. It
// was recorded by a proxy between dockerd and skeind (test/docker's
// set-up). The seed corpus under testdata/fuzz/FuzzRequest holds requests
// taken from it.

// recorded is one request of the session and skein's reply to it.
type recorded struct {
	Method  string `json:"method"`
	Request string `json:"request"`
	Reply   string `json:"reply"`
}

func loadSession(t testing.TB) []recorded {
	t.Helper()
	b, err := os.ReadFile("testdata/docker-20.10-session.json")
	if err != nil {
		t.Fatal(err)
	}
	var s []recorded
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// replayer drives a fresh driver through recorded requests. Pool IDs are
// random, so the IDs of the recording are mapped to the ones this driver
// answered with before a request is sent.
type replayer struct {
	env *tenv
	h   http.Handler
	ids map[string]string // recorded PoolID → this driver's
}

func newReplayer(t testing.TB, dir string) *replayer {
	t.Helper()
	st, err := store.OpenBolt(filepath.Join(dir, "skein.db"), store.BoltOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := ipam.NewManager(ipam.Options{Store: st, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := m.CreatePool(ctx, store.Pool{Name: "default", Subnets: []netip.Prefix{
		netip.MustParsePrefix("10.64.0.0/16"), netip.MustParsePrefix("fd00:64::/112")}}); err != nil {
		t.Fatal(err)
	}
	dp := &fakePlumber{links: map[string]dataplane.Pair{}}
	d, err := New(Options{Store: st, IPAM: m, Dataplane: dp, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return &replayer{env: &tenv{st: st, dp: dp}, h: d.Handler(), ids: map[string]string{}}
}

func (r *replayer) close() { r.env.st.Close() }

// translate puts this driver's pool IDs in place of the recorded ones.
func (r *replayer) translate(body []byte) []byte {
	for rec, live := range r.ids {
		body = bytes.ReplaceAll(body, []byte(rec), []byte(live))
	}
	return body
}

// serve sends one request straight to the handler (no net/http server,
// whose recover would hide a panic) and returns the response.
func (r *replayer) serve(method string, body io.Reader) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r.h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/"+method, body))
	return w
}

// replay sends the recorded requests; each must succeed or fail as it did
// when recorded.
func (r *replayer) replay(t testing.TB, session []recorded) {
	t.Helper()
	for i, c := range session {
		w := r.serve(c.Method, bytes.NewReader(r.translate([]byte(c.Request))))
		wantErr := strings.Contains(c.Reply, `"Err"`)
		if (w.Code != http.StatusOK) != wantErr {
			t.Fatalf("request %d %s %s: HTTP %d %s; recorded: %s", i, c.Method, c.Request, w.Code, w.Body, c.Reply)
		}
		if c.Method == "IpamDriver.RequestPool" && !wantErr {
			var rec, live requestPoolResponse
			if json.Unmarshal([]byte(c.Reply), &rec) != nil || json.Unmarshal(w.Body.Bytes(), &live) != nil {
				t.Fatalf("request %d: RequestPool replies %s, %s", i, c.Reply, w.Body)
			}
			r.ids[rec.PoolID] = live.PoolID
		}
	}
}

// TestRecordedSession replays the whole Docker session: every request
// succeeds or fails as it did against the real engine, and the store and
// the links are left as they were before it.
func TestRecordedSession(t *testing.T) {
	r := newReplayer(t, t.TempDir())
	defer r.close()
	before := r.env.state(t)
	r.replay(t, loadSession(t))
	if after := r.env.state(t); after != before {
		t.Errorf("the session left state behind:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// fuzzPrefix is how much of the session builds the state requests are
// fuzzed against: all three networks created, each container's endpoint
// created and joined, nothing removed yet.
const fuzzPrefix = 36

// spaces pads a request past MaxBody with JSON whitespace.
var spaces = bytes.Repeat([]byte(" "), MaxBody+1)

// FuzzRequest sends one request to a driver that has served the first
// fuzzPrefix requests of the session. Nothing panics; every answer is
// JSON of the right shape (an error: HTTP 500 with Err; otherwise the
// method's reply type and nothing else); a refused request changes
// nothing; a body padded past MaxBody is refused whatever it holds; and
// requests decode and encode consistently.
func FuzzRequest(f *testing.F) {
	session := loadSession(f)[:fuzzPrefix]
	dir := f.TempDir()
	if d, err := os.MkdirTemp("/dev/shm", "skein-docker-fuzz-"); err == nil { // the store off the disk
		dir = d
		f.Cleanup(func() { os.RemoveAll(d) })
	}
	f.Fuzz(func(t *testing.T, method string, body []byte, pad bool) {
		m := findMethod(method)
		db := filepath.Join(dir, "skein.db")
		os.Remove(db)
		r := newReplayer(t, dir)
		defer r.close()
		r.replay(t, session)
		before := r.env.state(t)

		req := r.translate(body)
		var in io.Reader = bytes.NewReader(req)
		if pad {
			in = io.MultiReader(in, bytes.NewReader(spaces))
		}
		w := r.serve(m.name, in)

		if ct := w.Header().Get("Content-Type"); ct != "application/vnd.docker.plugins.v1+json" {
			t.Fatalf("Content-Type %q", ct)
		}
		switch w.Code {
		case http.StatusInternalServerError:
			var e errorResponse
			dec := json.NewDecoder(w.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(&e); err != nil || e.Err == "" || e.Error != e.Err {
				t.Fatalf("error reply %q (%v): want {Err, Error} both set", w.Body, err)
			}
			if after := r.env.state(t); after != before {
				t.Fatalf("refused %s %q (%s) changed the state:\nbefore:\n%s\nafter:\n%s", m.name, req, e.Err, before, after)
			}
			if pad && !strings.Contains(e.Err, "larger than") {
				t.Fatalf("padded request refused for another reason: %s", e.Err)
			}
			return
		case http.StatusOK:
			if pad {
				t.Fatalf("a body of more than %d bytes was accepted", MaxBody)
			}
		default:
			t.Fatalf("HTTP %d %s", w.Code, w.Body)
		}
		checkReply(t, m.name, w.Body.Bytes())
		if m.newReq != nil && len(bytes.TrimSpace(req)) > 0 {
			checkRoundTrip(t, m.newReq, req)
		}
	})
}

// findMethod maps a fuzzed name onto a method of the driver. An unknown
// name picks one by its length, so that mutations of the name still reach
// a handler (the mux answers unknown paths with 404 itself).
func findMethod(name string) method {
	ms := (&Driver{}).methods()
	for _, m := range ms {
		if m.name == name {
			return m
		}
	}
	return ms[len(name)%len(ms)]
}

// replyTypes are the reply bodies of methods that answer more than {}.
var replyTypes = map[string]func() any{
	"Plugin.Activate":                    func() any { return &activateResponse{} },
	"NetworkDriver.GetCapabilities":      func() any { return &capabilitiesResponse{} },
	"NetworkDriver.AllocateNetwork":      func() any { return &allocateNetworkResponse{} },
	"NetworkDriver.CreateEndpoint":       func() any { return &createEndpointResponse{} },
	"NetworkDriver.EndpointOperInfo":     func() any { return &endpointInfoResponse{} },
	"NetworkDriver.Join":                 func() any { return &joinResponse{} },
	"IpamDriver.GetCapabilities":         func() any { return &ipamCapabilitiesResponse{} },
	"IpamDriver.GetDefaultAddressSpaces": func() any { return &addressSpacesResponse{} },
	"IpamDriver.RequestPool":             func() any { return &requestPoolResponse{} },
	"IpamDriver.RequestAddress":          func() any { return &requestAddressResponse{} },
}

// checkReply: a success is the method's reply type exactly (no unknown
// fields, encoding again gives the same bytes), with valid addresses.
func checkReply(t *testing.T, name string, b []byte) {
	t.Helper()
	mk, ok := replyTypes[name]
	if !ok {
		mk = func() any { return &struct{}{} }
	}
	v := mk()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s reply %s: %v", name, b, err)
	}
	again, _ := json.Marshal(v)
	if !bytes.Equal(bytes.TrimSpace(b), again) {
		t.Fatalf("%s reply %s encodes again as %s", name, b, again)
	}
	switch r := v.(type) {
	case *requestPoolResponse:
		if _, err := netip.ParsePrefix(r.Pool); err != nil || r.PoolID == "" {
			t.Fatalf("RequestPool answered %+v", r)
		}
	case *requestAddressResponse:
		if _, err := netip.ParsePrefix(r.Address); err != nil {
			t.Fatalf("RequestAddress answered %+v", r)
		}
	}
}

// checkRoundTrip: a request body the handler accepted decodes into its
// type, and encoding that and decoding again gives the same value.
func checkRoundTrip(t *testing.T, newReq func() any, body []byte) {
	t.Helper()
	a := newReq()
	if err := json.Unmarshal(body, a); err != nil {
		t.Fatalf("accepted body %q does not decode: %v", body, err)
	}
	enc, err := json.Marshal(a)
	if err != nil {
		t.Fatalf("decoded request %+v does not encode: %v", a, err)
	}
	b := newReq()
	if err := json.Unmarshal(enc, b); err != nil {
		t.Fatalf("encoded request %s does not decode: %v", enc, err)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("request %q decodes to %+v, encoded %s decodes to %+v", body, a, enc, b)
	}
}
