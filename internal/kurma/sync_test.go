package kurma_test

import (
	"bytes"
	"sync"
)

// syncWriter makes a buffer safe for a logger used from many goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
