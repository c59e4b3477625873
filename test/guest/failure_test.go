package guest_test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/skeinnet/skein/test/guest"
)

// envSelfTest tells TestGuestSelfTestInside what to do in the guest.
const envSelfTest = "SKEIN_GUEST_SELFTEST"

// TestGuestSelfTestInside is the inner test of TestGuestFailures: it fails
// or hangs on request, and does nothing (skips) otherwise.
func TestGuestSelfTestInside(t *testing.T) {
	guest.RequireGuest(t)
	switch os.Getenv(envSelfTest) {
	case "fail":
		t.Error("failing on purpose")
	case "hang":
		time.Sleep(time.Hour)
	default:
		t.Skipf("skipping: only TestGuestFailures runs this (with %s set)", envSelfTest)
	}
}

// recorder passes everything to the real test except failures, which it
// keeps, so that a guest run meant to fail can be checked.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Error(args ...any) { r.errors = append(r.errors, fmt.Sprint(args...)) }
func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// TestGuestFailures: the ways a guest run goes wrong reach the outer test
// as failures that say what happened: a module that does not load (named),
// an inner test that fails (named), a guest that does not finish in time
// (killed, console shown).
func TestGuestFailures(t *testing.T) {
	cases := []struct {
		name string
		cfg  guest.Config
		want []string
	}{
		// crc32c-intel needs SSE4.2, which TCG's default CPU lacks.
		{"module", guest.Config{Modules: []string{"veth", "crc32c_intel"}}, []string{"kernel module crc32c_intel", "failed to load"}},
		{"inner failure", guest.Config{Env: []string{envSelfTest + "=fail"}}, []string{"failed (exit 1)", "--- FAIL: TestGuestSelfTestInside"}},
		// -test.timeout=0 after the harness's own: only the guest's
		// timeout is left to end the run.
		{"timeout", guest.Config{Env: []string{envSelfTest + "=hang"}, Args: []string{"-test.timeout=0"}, Timeout: 15 * time.Second}, []string{"did not finish", "console:", "killed"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.cfg.Package, c.cfg.Run = "./test/guest", "^TestGuestSelfTestInside$"
			c.cfg.CPUs, c.cfg.MemoryMB = 1, 256
			r := &recorder{TB: t}
			res := guest.Run(r, c.cfg)
			got := strings.Join(r.errors, "\n")
			if res.Passed || got == "" {
				t.Fatalf("the run passed (exit %d) or failed silently; errors: %q\noutput:\n%s", res.ExitCode, got, res.Output)
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("the failure lacks %q:\n%s", w, got)
				}
			}
		})
	}
}
