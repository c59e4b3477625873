package kube

import (
	"testing"
	"time"
)

// Eventually polls cond every 20 ms until it returns "" or within passes,
// then fails the test with cond's last complaint ("still <complaint>").
func Eventually(t testing.TB, within time.Duration, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s after %v", what, msg, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
