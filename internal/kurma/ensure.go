package kurma

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/skeinnet/skein/internal/kurma/sandbox"
)

// ensure returns the network's active state, acquiring its image and
// starting its main exec on first use, and a reference of the caller's own
// to its image (release it when done): the state's may be dropped at any
// moment by a reload, and the image pruned with it.
//
// One network's first use starts one main exec, however many attaches ask
// at once: the first starts it (m.starting), the others wait for it. A
// network planned from a config a reload has since replaced gets its image
// for this call and no main exec; the configured network's main exec is
// never touched from here (SetNetworks owns stopping it).
func (m *Manager) ensure(ctx context.Context, n Network) (*netState, func(), error) {
	if m.images == nil {
		return nil, nil, fmt.Errorf("network %q: no image cache configured", n.Name)
	}
	if _, _, err := m.sandbox(); err != nil {
		return nil, nil, fmt.Errorf("network %q: %w", n.Name, err)
	}
	for {
		m.mu.Lock()
		if s := m.active[n.Name]; s != nil && string(s.raw) == string(n.Raw) {
			// Under m.mu: a reload drops the state from m.active before
			// releasing its image.
			defer m.mu.Unlock()
			return m.hold(n.Name, s)
		}
		if cfg, ok := Find(m.nets, n.Name); !ok || string(cfg.Raw) != string(n.Raw) || m.closed {
			m.mu.Unlock()
			return m.ensureStale(ctx, n)
		}
		if st := m.starting[n.Name]; st != nil {
			m.mu.Unlock()
			select {
			case <-st:
				continue // started (or failed: then try ourselves)
			case <-ctx.Done():
				return nil, nil, fmt.Errorf("network %q: %w", n.Name, ctx.Err())
			}
		}
		st := make(chan struct{})
		m.starting[n.Name] = st
		m.mu.Unlock()

		// Fetching and starting take long: not under m.mu.
		s, err := m.start(ctx, n)

		m.mu.Lock()
		delete(m.starting, n.Name)
		close(st)
		if err != nil {
			m.mu.Unlock()
			return nil, nil, err
		}
		cfg, ok := Find(m.nets, n.Name)
		if ok && string(cfg.Raw) == string(n.Raw) && m.active[n.Name] == nil && !m.closed {
			m.active[n.Name] = s
			defer m.mu.Unlock()
			return m.hold(n.Name, s)
		}
		m.mu.Unlock()
		// A reload (or Close) came while it started: this call keeps the
		// image, the main exec stops.
		held, release, err := m.hold(n.Name, s)
		s.close(m.log, n.Name)
		return held, release, err
	}
}

// ensureStale serves a network planned from a config that is no longer
// the current one: its image only, for this call.
func (m *Manager) ensureStale(ctx context.Context, n Network) (*netState, func(), error) {
	img, release, err := m.images.Acquire(ctx, n.Ref)
	if err != nil {
		return nil, nil, fmt.Errorf("network %q: image: %w", n.Name, err)
	}
	return &netState{raw: n.Raw, img: img, release: release}, release, nil
}

// hold takes the caller's own reference to s's image while s still holds
// its own.
func (m *Manager) hold(name string, s *netState) (*netState, func(), error) {
	if release, ok := m.images.Hold(s.img.Digest); ok {
		return s, release, nil
	}
	_, release, err := m.images.Lookup(s.img.Digest)
	if err != nil {
		return nil, nil, fmt.Errorf("network %q: image: %w", name, err)
	}
	return s, release, nil
}

// start acquires a network's image and starts its main exec, if it has
// one.
func (m *Manager) start(ctx context.Context, n Network) (*netState, error) {
	sb, _, err := m.sandbox()
	if err != nil {
		return nil, fmt.Errorf("network %q: %w", n.Name, err)
	}
	img, release, err := m.images.Acquire(ctx, n.Ref)
	if err != nil {
		return nil, fmt.Errorf("network %q: image: %w", n.Name, err)
	}
	s := &netState{raw: n.Raw, img: img, release: release}
	if len(img.MainExec) == 0 {
		return s, nil
	}
	dir, err := m.stateDir(n.Name)
	if err == nil && !filepath.IsAbs(img.MainExec[0]) {
		err = fmt.Errorf("main exec %q: want an absolute path", img.MainExec[0])
	}
	if err == nil {
		s.sv, err = sb.Supervise(sandbox.SupervisorOptions{
			Network: n.Name,
			Spec: sandbox.Spec{
				Rootfs: img.Root, Path: img.MainExec[0], Args: img.MainExec[1:],
				Stdin: n.Raw, Env: img.Env, StateDir: dir,
			},
			Logger: m.log,
		})
	}
	if err != nil {
		release()
		return nil, fmt.Errorf("network %q: start main exec: %w", n.Name, err)
	}
	return s, nil
}

func (m *Manager) stateDir(network string) (string, error) {
	dir := filepath.Join(m.state, network)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("state directory of network %q: %w", network, err)
	}
	return dir, nil
}
