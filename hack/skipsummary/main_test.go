package main

import (
	"strings"
	"testing"
)

// A run with skips of several reasons, a subtest skipped, a pass and a
// package result: the line counts each skip under its reason, and only
// a failure makes it fail.
func TestSummarize(t *testing.T) {
	in := `{"Action":"run","Package":"p","Test":"TestRoot"}
{"Action":"output","Package":"p","Test":"TestRoot","Output":"=== RUN   TestRoot\n"}
{"Action":"output","Package":"p","Test":"TestRoot","Output":"    harness_linux.go:40: needs root: uses network namespaces\n"}
{"Action":"output","Package":"p","Test":"TestRoot","Output":"--- SKIP: TestRoot (0.00s)\n"}
{"Action":"skip","Package":"p","Test":"TestRoot"}
{"Action":"output","Package":"p","Test":"TestRoot2","Output":"--- SKIP: TestRoot2 (0.00s)\n"}
{"Action":"output","Package":"p","Test":"TestRoot2","Output":"    x_test.go:9: needs root\n"}
{"Action":"skip","Package":"p","Test":"TestRoot2"}
{"Action":"output","Package":"p","Test":"TestKube/sub","Output":"    kube.go:130: starts a kube-apiserver\n"}
{"Action":"skip","Package":"p","Test":"TestKube/sub"}
{"Action":"skip","Package":"p","Test":"TestBare"}
{"Action":"output","Package":"p","Test":"TestOK","Output":"=== RUN   TestOK\n"}
{"Action":"pass","Package":"p","Test":"TestOK"}
{"Action":"output","Package":"p","Output":"PASS\n"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.01s\n"}
{"Action":"pass","Package":"p"}
`
	var out strings.Builder
	s, err := summarize(strings.NewReader(in), &out)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.line(), "SKIPPED 4 tests: needs root (2), other (1), starts a kube-apiserver (1)"; got != want {
		t.Errorf("line %q, want %q", got, want)
	}
	if s.failed {
		t.Error("skips alone counted as a failure")
	}
	if got := out.String(); got != "ok  \tp\t0.01s\n" {
		t.Errorf("passed through %q, want the package's result line only", got)
	}

	fail := `{"Action":"output","Package":"p","Test":"TestBad","Output":"    x_test.go:3: boom\n"}
{"Action":"fail","Package":"p","Test":"TestBad"}
`
	out.Reset()
	if s, err = summarize(strings.NewReader(fail), &out); err != nil || !s.failed || !strings.Contains(out.String(), "boom") {
		t.Errorf("a failed test: failed %t, output %q, err %v; want failed with its output", s.failed, out.String(), err)
	}
	if _, err := summarize(strings.NewReader("ok  \tp\t0.01s\n"), &out); err == nil {
		t.Error("plain go test output taken for test2json")
	}
}
