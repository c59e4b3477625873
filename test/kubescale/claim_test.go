package kubescale

import (
	"context"
	"errors"
	"sync"
	"time"

	skeinv1 "github.com/skeinnet/skein/api/v1alpha1"
	"github.com/skeinnet/skein/internal/kubestore"
	"github.com/skeinnet/skein/internal/store"
)

// timedStore is the node's kubestore.Store with ClaimBlock timed: the
// Manager finds it as its ipam.ClusterStore (every other method is the
// Store's own) and so runs kubestore's and ipam's code unchanged. One
// ClaimBlock is one create of an AddressBlock (and a read of the pool
// after it, or of the block that was there); a grant is the claims of
// one block, from the first try to the one that got it.
type timedStore struct {
	*kubestore.Store
	rec  *recorder
	node string

	mu       sync.Mutex
	first    time.Time // of the grant in progress; zero between grants
	tries    int       // creates in the grant in progress
	grants   int       // blocks obtained
	inflight int
	// held are the blocks obtained and not released (by name); a claim
	// that "obtains" one of them again (a 409 on the node's own block,
	// which kubestore answers as success) is a self-collision.
	held           map[string]bool
	selfCollisions int
}

func (s *timedStore) ClaimBlock(ctx context.Context, pool, node string, n uint32, want *uint32, ok func(uint32) bool) (store.Block, error) {
	start := time.Now()
	s.mu.Lock()
	if s.first.IsZero() {
		s.first = start
	}
	s.tries++
	s.inflight++
	s.mu.Unlock()

	ct := &claimTime{}
	b, err := s.Store.ClaimBlock(context.WithValue(ctx, claimKey{}, ct), pool, node, n, want, ok)
	took := time.Since(start)
	client := took - time.Duration(ct.wire.Load()) // rate limiter and this process
	limiter := time.Duration(ct.limiter.Load())

	taken := errors.Is(err, store.ErrConflict)
	s.mu.Lock()
	s.inflight--
	var grant time.Duration
	round, tries := 0, 0
	again := err == nil && s.held[skeinv1.BlockName(pool, b.Index)]
	if again {
		// The node asked for a block it has: its cache had not shown it
		// its own last claim yet. The Manager claims again.
		s.selfCollisions++
		taken = true
	}
	if !taken {
		// The grant ends: with the block, or with an error the Manager
		// gives up on (a refused create is followed by the next index).
		grant = time.Since(s.first)
		tries = s.tries
		s.first, s.tries = time.Time{}, 0
		if err == nil {
			s.grants++
			round = s.grants
			if s.held == nil {
				s.held = map[string]bool{}
			}
			s.held[skeinv1.BlockName(pool, b.Index)] = true
			s.rec.created(skeinv1.BlockName(pool, b.Index))
		}
	}
	s.mu.Unlock()
	s.rec.claim(claimSample{Node: s.node, At: start.Sub(s.rec.t0), Took: took, Client: client, Limiter: limiter, Taken: taken, Self: again,
		Err: err != nil && !taken, Round: round})
	if !taken {
		s.rec.grant(grantSample{At: start.Sub(s.rec.t0), Took: grant, Err: err != nil, Round: round, Tries: tries})
	}
	if err != nil && !taken {
		s.rec.fail(s.node, err)
	}
	return b, err
}

// ReleaseBlock is the Store's, and forgets the block.
func (s *timedStore) ReleaseBlock(ctx context.Context, pool string, index uint32, node string) error {
	err := s.Store.ReleaseBlock(ctx, pool, index, node)
	if err == nil {
		s.mu.Lock()
		delete(s.held, skeinv1.BlockName(pool, index))
		s.mu.Unlock()
	}
	return err
}

func (s *timedStore) selfCollided() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.selfCollisions
}

// busy reports whether a claim is in flight.
func (s *timedStore) busy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight > 0
}

func (s *timedStore) obtained() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grants
}

// claimSample is one ClaimBlock: when it started (since the run's t0), how
// long it took, and how it ended (Taken: 409, another node has the index).
// Round is the node's block count after it (1 = its first block), 0
// unless it obtained a block.
type claimSample struct {
	Node     string
	At, Took time.Duration
	// Client is the part of Took outside the transport: client-go's rate
	// limiter, and this process's scheduling; Limiter the rate limiter's.
	Client, Limiter time.Duration
	Taken, Err      bool
	Self            bool
	Round           int
}

// grantSample is one block obtained (or given up on), all tries included
// (Tries: the creates it took).
type grantSample struct {
	At, Took time.Duration
	Err      bool
	Round    int
	Tries    int
}

type recorder struct {
	t0     time.Time
	mu     sync.Mutex
	claims []claimSample
	grants []grantSample
	errs   []string // the first few failed claims
	nErrs  int
	// The shared cache's lag: when each block's create returned to its
	// node, and when the cache's last handler saw it.
	createdAt, seenAt map[string]time.Time
}

func (r *recorder) created(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.createdAt == nil {
		r.createdAt = map[string]time.Time{}
	}
	if _, ok := r.createdAt[name]; !ok {
		r.createdAt[name] = time.Now()
	}
}

func (r *recorder) seen(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.seenAt == nil {
		r.seenAt = map[string]time.Time{}
	}
	if _, ok := r.seenAt[name]; !ok {
		r.seenAt[name] = time.Now()
	}
}

// cacheLags are, for each block created, how long after its create
// returned the shared cache's handlers reached it (negative: before).
func (r *recorder) cacheLags() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for name, c := range r.createdAt {
		if s, ok := r.seenAt[name]; ok {
			out = append(out, s.Sub(c))
		}
	}
	return out
}

func (r *recorder) claim(s claimSample) {
	r.mu.Lock()
	r.claims = append(r.claims, s)
	r.mu.Unlock()
}

func (r *recorder) grant(s grantSample) {
	r.mu.Lock()
	r.grants = append(r.grants, s)
	r.mu.Unlock()
}

func (r *recorder) fail(node string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nErrs++
	if len(r.errs) < 5 {
		r.errs = append(r.errs, node+": "+err.Error())
	}
}
