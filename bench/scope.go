package bench

import (
	"fmt"
	"os"
	"sync"
	"testing"
)

// scope stands in for testing.TB so that the benchmark command can reuse
// the test bed (test/harness namespaces, test/skeintest daemons) outside
// `go test`. Only the methods those packages call are implemented; the
// embedded nil testing.TB satisfies the interface's unexported method and
// would panic if anything else were called.
//
// Fatal and Skip panic with a *fatal value; Run and the workers recover it.
// Cleanups run, last first, when the scope is closed — a scope per
// contender so that its namespaces go as soon as it is measured.
type scope struct {
	testing.TB
	name     string
	mu       sync.Mutex
	cleanups []func()
	failed   bool
	verbose  bool
}

// fatal is the panic value of scope.Fatal.
type fatal struct{ msg string }

func (f *fatal) Error() string { return f.msg }

func newScope(name string, verbose bool) *scope { return &scope{name: name, verbose: verbose} }

func (s *scope) Helper()      {}
func (s *scope) Name() string { return s.name }

func (s *scope) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *scope) Failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

func (s *scope) Errorf(format string, args ...any) {
	s.mu.Lock()
	s.failed = true
	s.mu.Unlock()
	fmt.Fprintf(os.Stderr, "\nskein-bench: %s: %s\n", s.name, fmt.Sprintf(format, args...))
}
func (s *scope) Error(args ...any) { s.Errorf("%s", fmt.Sprint(args...)) }
func (s *scope) Fatalf(format string, args ...any) {
	s.mu.Lock()
	s.failed = true
	s.mu.Unlock()
	panic(&fatal{fmt.Sprintf("%s: %s", s.name, fmt.Sprintf(format, args...))})
}
func (s *scope) Fatal(args ...any)                { s.Fatalf("%s", fmt.Sprint(args...)) }
func (s *scope) FailNow()                         { s.Fatalf("failed") }
func (s *scope) Skipf(format string, args ...any) { s.Fatalf("cannot run: "+format, args...) }
func (s *scope) Skip(args ...any)                 { s.Fatalf("cannot run: %s", fmt.Sprint(args...)) }
func (s *scope) SkipNow()                         { s.Fatalf("cannot run") }
func (s *scope) Log(args ...any)                  { s.Logf("%s", fmt.Sprint(args...)) }
func (s *scope) Logf(format string, args ...any) {
	if s.verbose {
		fmt.Fprintf(os.Stderr, "\n%s: %s\n", s.name, fmt.Sprintf(format, args...))
	}
}

func (s *scope) TempDir() string {
	d, err := os.MkdirTemp("", "skein-bench-")
	if err != nil {
		s.Fatalf("temp dir: %v", err)
	}
	s.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// close runs the cleanups, last registered first; a cleanup that panics
// does not stop the others.
func (s *scope) close() {
	for {
		s.mu.Lock()
		n := len(s.cleanups)
		if n == 0 {
			s.mu.Unlock()
			return
		}
		f := s.cleanups[n-1]
		s.cleanups = s.cleanups[:n-1]
		s.mu.Unlock()
		func() {
			defer func() {
				if r := recover(); r != nil {
					fmt.Fprintf(os.Stderr, "\nskein-bench: cleanup of %s: %v\n", s.name, r)
				}
			}()
			f()
		}()
	}
}

// catch runs fn and turns a scope.Fatal panic into an error.
func catch(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(*fatal); ok {
				err = f
				return
			}
			panic(r)
		}
	}()
	fn()
	return nil
}
