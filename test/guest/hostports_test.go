package guest_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/guest"
)

// Environment of TestGuestHostPortsInside: the port it may reach, the
// body it must get there, and a port of the host it must not reach.
const (
	envAllowedPort = "SKEIN_GUEST_TEST_ALLOWED"
	envToken       = "SKEIN_GUEST_TEST_TOKEN"
	envOtherPort   = "SKEIN_GUEST_TEST_OTHER"
	guestTokenFile = "/opt/skein/token"
)

// TestGuestHostPorts: a guest given one host loopback port reaches an HTTP
// server there, again and concurrently, and nothing else of the host: a
// second server on the host's loopback, not listed, stays unreachable.
// (It also checks Config.Files, to save a boot.)
func TestGuestHostPorts(t *testing.T) {
	token := fmt.Sprintf("skein-%d", time.Now().UnixNano())
	allowed := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, token)
	}))
	defer allowed.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "must not be reachable")
	}))
	defer other.Close()
	// A file handed in through Files: its content and mode arrive.
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token), 0o750); err != nil {
		t.Fatal(err)
	}
	port := allowed.Listener.Addr().(*net.TCPAddr).Port
	otherPort := other.Listener.Addr().(*net.TCPAddr).Port
	guest.Run(t, guest.Config{
		Package:   "./test/guest",
		Run:       "^TestGuestHostPortsInside$",
		HostPorts: []int{port},
		Files:     map[string]string{guestTokenFile: file},
		Env: []string{
			envAllowedPort + "=" + strconv.Itoa(port), envToken + "=" + token,
			envOtherPort + "=" + strconv.Itoa(otherPort),
		},
	})
}

func TestGuestHostPortsInside(t *testing.T) {
	guest.RequireGuest(t)
	host := os.Getenv(guest.EnvHost)
	port, token := os.Getenv(envAllowedPort), os.Getenv(envToken)
	if host != guest.HostAddr || port == "" || token == "" {
		t.Skipf("skipping: only TestGuestHostPorts runs this (%s=%q, port %q)", guest.EnvHost, host, port)
	}
	if b, err := os.ReadFile(guestTokenFile); err != nil || string(b) != token {
		t.Errorf("%s holds %q (%v), want %q (Config.Files)", guestTokenFile, b, err, token)
	}
	if st, err := os.Stat(guestTokenFile); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("%s: mode %v (%v), want 0750 as on the host", guestTokenFile, st.Mode(), err)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	get := func(addr string) (string, error) {
		resp, err := client.Get("http://" + addr + "/")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	url := net.JoinHostPort(host, port)
	// One connection after another, then several at once.
	for i := 0; i < 3; i++ {
		if body, err := get(url); err != nil || body != token {
			t.Fatalf("GET %s #%d: %q, %v; want %q", url, i+1, body, err, token)
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if body, err := get(url); err != nil || body != token {
				t.Errorf("concurrent GET %s: %q, %v; want %q", url, body, err, token)
			}
		}()
	}
	wg.Wait()

	// The host's other ports stay out of reach, through the forwarding
	// address and through slirp's gateway (the host) alike.
	other := os.Getenv(envOtherPort)
	for _, addr := range []string{net.JoinHostPort(host, other), net.JoinHostPort("10.0.2.2", other)} {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			c.Close()
			t.Errorf("the guest reached %s, a host port not in HostPorts", addr)
		}
	}
}
