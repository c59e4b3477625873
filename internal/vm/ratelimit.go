package vm

import "time"

// A guest decides how many frames it sends; the answers skeind owes it must
// not grow with them. Answers that a well-behaved client needs only a few
// of — router advertisements solicited by a router solicitation, and
// replies to bad requests (DHCPv4 NAKs, DHCPv6 replies with an error
// status) — are each limited per VM port by a token bucket. Leases
// themselves (OFFER, ACK, DHCPv6 replies) are not: a client renewing or
// rebooting in a loop gets what it asks for, as from any DHCP server.
var (
	// solicitedRALimit: a booting guest sends up to 3 solicitations 4 s
	// apart (RFC 4861 MAX_RTR_SOLICITATIONS, RTR_SOLICITATION_INTERVAL),
	// and routers answer at most one per MIN_DELAY_BETWEEN_RAS (3 s).
	solicitedRALimit = limit{burst: 3, every: 3 * time.Second}
	// badRequestLimit: NAKs and DHCPv6 error replies. A client that
	// rebooted with a stale address needs one.
	badRequestLimit = limit{burst: 4, every: time.Second}
	// warningLimit: socket errors logged per port (the rest counted).
	warningLimit = limit{burst: 3, every: 10 * time.Second}
)

// limit is a token bucket's shape: burst answers at once, then one more
// per every.
type limit struct {
	burst int
	every time.Duration
}

// bucket is a token bucket of a limit. The zero value is not usable: make
// it with newBucket. Not safe for concurrent use (each Server's frames are
// handled by one goroutine).
type bucket struct {
	limit
	tokens float64
	last   time.Time
}

func newBucket(l limit) *bucket {
	return &bucket{limit: l, tokens: float64(l.burst)}
}

// allow takes a token at time now if there is one. Time going backwards
// (a clock step) refills nothing.
func (b *bucket) allow(now time.Time) bool {
	if !b.last.IsZero() && now.After(b.last) {
		b.tokens += float64(now.Sub(b.last)) / float64(b.every)
		if b.tokens > float64(b.burst) {
			b.tokens = float64(b.burst)
		}
	}
	if b.last.IsZero() || now.After(b.last) {
		b.last = now
	}
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
