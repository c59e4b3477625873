// Package cniwire is skeind's socket split: the skein CNI binaries hand
// their whole exec to skeind on the socket gRPC serves (package cnirun:
// one framed request, one reply, no handshake), and Split tells the two
// apart by a connection's first bytes. Every connection that does not
// start with cnirun.RequestMagic goes to the gRPC server, bytes and all
// (skeinctl, front doors, and the CNI binaries of skein releases before
// this protocol: they fall back to gRPC when a skeind answers their own
// short path's magic with an HTTP/2 SETTINGS frame, as this one does).
//
// Why not gRPC for the binaries: a unary call on a fresh connection, as a
// binary makes on every exec, costs skeind grpc-go's per-connection set-up
// and the binary an HTTP/2 client (its package start, the settings
// exchange, HPACK): about 0.4 ms of a 2-core machine's time per ADD (see
// docs/benchmarks/report.md).
package cniwire

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/skeinnet/skein/internal/cnirun"
)

// RunHandler runs one exec of a CNI binary that handed it over whole
// (package cnirun): it returns what the binary prints and exits with.
type RunHandler func(ctx context.Context, req cnirun.Request) cnirun.Reply

const magicLength = len(cnirun.RequestMagic)

// sniffTimeout bounds the wait for a new connection's first bytes. A
// gRPC client writes its preface at once, the skein binary its request.
const sniffTimeout = 5 * time.Second

// Split serves this package's calls on a listener it shares with another
// server (gRPC): Listener returns the connections that are not ours, their
// first bytes replayed. Close it to stop both.
type Split struct {
	l      net.Listener
	run    RunHandler
	routes []Route
	other  chan net.Conn
	idle   chan net.Conn
	done   chan struct{}
	once   sync.Once
	calls  sync.WaitGroup
	// base ends calls in flight when Close is called with Abort.
	base   context.Context
	cancel context.CancelFunc
	err    error // the Accept error that ended the loop
}

// Route sends the connections that open with Magic (as long as
// cnirun.RequestMagic) to Serve, on the goroutine that read it, Magic
// read and the rest of what was read in r. Serve closes the connection.
type Route struct {
	Magic string
	Serve func(c net.Conn, r *bufio.Reader)
}

// NewSplit starts accepting on l: the CNI binaries' execs go to run, the
// connections of routes to theirs.
func NewSplit(l net.Listener, run RunHandler, routes ...Route) *Split {
	for _, r := range routes {
		if len(r.Magic) != magicLength {
			panic("cniwire: a route's magic must be " + strconv.Itoa(magicLength) + " bytes long")
		}
	}
	s := &Split{l: l, run: run, routes: routes, other: make(chan net.Conn), done: make(chan struct{}), idle: make(chan net.Conn)}
	s.base, s.cancel = context.WithCancel(context.Background())
	go s.accept()
	return s
}

func (s *Split) accept() {
	var backoff time.Duration
	for {
		c, err := s.l.Accept()
		if err != nil {
			// Out of file descriptors and the like: wait and try again,
			// as grpc-go's own loop does, rather than stop serving.
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-s.done:
				}
			}
			s.closeWith(err)
			return
		}
		backoff = 0
		select {
		case s.idle <- c:
		default:
			go s.worker(c)
		}
	}
}

// worker serves c, then waits up to a minute for another connection. A
// call served on a goroutine that served one before does not grow its
// stack through the handler's first calls again (40–70 % of those
// stages' time on a fresh goroutine: docs/benchmarks/report.md).
func (s *Split) worker(c net.Conn) {
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	for {
		s.sniff(c)
		t.Reset(time.Minute)
		select {
		case c = <-s.idle:
		case <-t.C:
			return
		case <-s.done:
			return
		}
	}
}

// sniff reads a connection's first bytes and routes it.
func (s *Split) sniff(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(sniffTimeout))
	br := bufio.NewReader(c)
	first, err := br.Peek(magicLength)
	if err == nil && string(first) == cnirun.RequestMagic {
		br.Discard(magicLength)
		s.calls.Add(1)
		defer s.calls.Done()
		s.serve(c, br)
		return
	}
	if len(first) == 0 {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	for _, r := range s.routes {
		if err == nil && string(first) == r.Magic {
			br.Discard(magicLength)
			r.Serve(c, br)
			return
		}
	}
	select {
	case s.other <- &peeked{Conn: c, r: br}:
	case <-s.done:
		c.Close()
	}
}

// serve reads an exec's request, runs it and answers once.
func (s *Split) serve(c net.Conn, br *bufio.Reader) {
	defer c.Close()
	req, err := cnirun.ReadRequest(br)
	if err != nil {
		return // malformed or cut short: nothing was run
	}
	c.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithCancel(s.base)
	defer cancel()
	if req.TimeoutMS > 0 {
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMS)*time.Millisecond)
		defer cancel()
	}
	c.Write(cnirun.AppendReply(nil, s.run(ctx, req)))
}

// Listener is what a gRPC server serves: the connections that are not
// this package's calls.
func (s *Split) Listener() net.Listener { return otherListener{s} }

// Close stops accepting. Calls in flight go on (Wait waits for them).
func (s *Split) Close() error { return s.closeWith(nil) }

// closeWith closes once; cause (an Accept error) is what the other
// listener's Accept returns from then on.
func (s *Split) closeWith(cause error) error {
	var err error
	s.once.Do(func() {
		s.err = cause
		close(s.done)
		err = s.l.Close()
	})
	return err
}

// Abort cancels the calls in flight.
func (s *Split) Abort() { s.cancel() }

// Wait waits for the calls in flight.
func (s *Split) Wait() { s.calls.Wait() }

type otherListener struct{ s *Split }

func (o otherListener) Accept() (net.Conn, error) {
	select {
	case c := <-o.s.other:
		return c, nil
	case <-o.s.done:
		if o.s.err != nil {
			return nil, o.s.err
		}
		return nil, net.ErrClosed
	}
}

func (o otherListener) Close() error   { return o.s.Close() }
func (o otherListener) Addr() net.Addr { return o.s.l.Addr() }

// peeked is a connection whose first bytes were read into r.
type peeked struct {
	net.Conn
	r *bufio.Reader
}

func (p *peeked) Read(b []byte) (int, error) { return p.r.Read(b) }
