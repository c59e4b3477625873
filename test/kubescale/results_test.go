package kubescale

// Results are what the benchmark reports (results.json). The fields of
// the BlockRequest protocol's benchmark keep their names; a "grant" is now
// a node's claims of one block, from its first create to the one that got
// it (one create unless another node had the index first).
type Results struct {
	Date, Machine, Command string
	Nodes, Pods            int
	BlockSizeBits          int
	RatePerSecond          float64 `json:",omitempty"`
	ControllerQPS          int
	// What ran: skeind's priority level (deploy/kubernetes/
	// skeind-flowcontrol.yaml) applied; skein-controller's validating
	// webhooks (the AddressBlock one on every claim); nodes renewing their
	// Lease every 10 s; each node watching blocks and pools.
	FlowSchema, Webhook, Leases, Watches bool
	// CacheCopies: the nodes' shared cache deep-copied what it handed out
	// (as skeind's own does; off, a thousand nodes' copies do not take
	// the API server's CPU).
	CacheCopies bool
	// Fanout: every block event ran every node's handlers in this process
	// (as a thousand skeinds do, each on its own CPU); off, each node's
	// handlers get the events of its own blocks (dispatch_test.go).
	Fanout bool
	// LoadAverage is the machine's one-minute load average when the nodes
	// started, when the burst ended, and the highest in between (the
	// machine is shared with other jobs).
	LoadAverageStart, LoadAverageEnd float64
	LoadAverageMax                   float64 // sampled every 5 s while the nodes claim

	Blocks                 int64 // blocks obtained by the nodes (burst and startup)
	BurstSeconds           float64
	AddsPerSecond          float64
	GrantP50ms, GrantP99ms float64
	GrantMaxms             float64
	GrantErrors            int
	// ClaimP50ms, ClaimP99ms: one ClaimBlock, i.e. one create of an
	// AddressBlock (and the read of the pool after it, or of the block
	// found in its place), every try counted. Startup is the first round
	// alone (every node's first block, all at once).
	ClaimP50ms, ClaimP99ms, ClaimMaxms float64
	StartupClaimP99ms                  float64
	// ClaimClientP99ms: the part of a claim spent in the node's client
	// before and between its requests (client-go's rate limiter, this
	// process's scheduling), p99.
	ClaimClientP99ms float64
	// ClaimRateLimiterP99ms: of that, the wait in client-go's rate limiter
	// (each node's own: client-go's default QPS 5, burst 10), p99.
	ClaimRateLimiterP99ms float64
	// CacheLagP50ms, CacheLagP99ms: from a block's create returning to its
	// node until the shared cache's last handler (behind every node's)
	// saw it. A claim chooses its index from the cache: a lagging cache
	// means collisions.
	CacheLagP50ms, CacheLagP99ms float64
	Claims                       int // ClaimBlock calls
	// WritesPerClaim is AddressBlock creates attempted per block obtained
	// (1 + Collisions/Blocks); Collisions are the creates refused with 409
	// (another node had the index), as kubestore counts them
	// (skein_block_claim_conflicts_total).
	WritesPerClaim float64
	Collisions     int64
	// SelfCollisions are the Collisions on the claimant's own block: its
	// cache did not show it its last claim yet, and it chose that index
	// again.
	SelfCollisions int64
	// TriesPerGrantP99, MaxTriesPerGrant: creates a node made for one
	// block (a grant gives up after 32).
	TriesPerGrantP99, MaxTriesPerGrant int
	// Rejected429 is the increase of the API server's
	// apiserver_flowcontrol_rejected_requests_total over the run (all
	// priority levels); Responses429 are the 429 answers the nodes'
	// clients saw (client-go retries them, so they cost time, not
	// claims). RequestsOutsideLevel counts the nodes' requests that API
	// Priority and Fairness put into another priority level than
	// skeind's (with FlowSchema).
	Rejected429          int64
	Responses429         int64
	RequestsOutsideLevel int64
	// QueueWaitP50ms, QueueWaitP99ms: the wait of skeind's requests in
	// its priority level's queues (apiserver_flowcontrol_request_wait_
	// duration_seconds, the upper bound of the bucket; 0 = none queued).
	QueueWaitP50ms, QueueWaitP99ms float64
	// Duplicates: addresses found on two pods at the end (checked against
	// the API's blocks); BlocksLost: blocks a node's Manager found were
	// not its own any more.
	Duplicates, BlocksLost int
	// AddP50ms, AddP99ms: every pod ADD of the burst (ipam.Allocate),
	// including those that waited for a block. AddsThatClaimed: ADDs whose
	// node had no room left and claimed on the ADD's path (the spare was
	// not there yet).
	AddP50ms, AddP99ms float64
	AddsThatClaimed    int64
	// After the burst, with a spare block present: ADDs through the kube
	// store (AddSpare*) each paired with one through the embedded bbolt
	// store (AddBolt*), alternating, so both see the same machine.
	// AddSpareAPIRequests counts the API requests made on those ADDs'
	// path (none expected).
	AddSpareP50ms, AddSpareP99ms float64
	AddBoltP50ms, AddBoltP99ms   float64
	AddSpareAPIRequests          int64
	// WritesTotal is every non-GET request the nodes made (Lease
	// renewals included); WritesInGrants those made inside claims.
	WritesTotal, WritesInGrants int64
	// WritesPerAddBeyondClaims counts writes made by ADDs that did not
	// claim a block, per such ADD.
	WritesPerAddBeyondClaims float64
	ControllerRSSMiB         float64
	APIServerRSSMiB          float64
	EtcdRSSMiB               float64
	// CPU seconds used from the first claim to the end of the burst: the
	// API server, etcd, skein-controller, and this process (the simulated
	// nodes and the shared cache).
	APIServerCPUSeconds, EtcdCPUSeconds, ControllerCPUSeconds, NodesCPUSeconds float64
	// StatusSeconds: from the burst's end until the pool's status counts
	// every block (the controller's pool status).
	StatusSeconds float64
	// Restart: SIGTERM to the controller, a new one started, and a node
	// that has no block starts; then the time until it has its block
	// (it claims it itself: the controller is not in the way) and until
	// the pool's status counts it.
	RestartToGrantSeconds, RestartToStatusSeconds float64

	// LeaseErrors are failed renewals of the nodes' Leases
	// (skein_node_lease_errors_total, summed): each took up to 10 s; four
	// in a row and a node's Lease expires.
	LeaseErrors int64
	// WatchEventsPerNode: the events each node's watches of blocks and
	// pools received, on average (with Watches).
	WatchEventsPerNode float64
	// Requests are the nodes' requests by method and resource, timed at
	// their transport (after client-go's rate limiter): the API server's
	// time and the wire's.
	Requests []RequestFigures

	problems       []string           // what the run found wrong (the test fails on them)
	claims         []claimSample      // for the chart
	grants         []grantSample      // for the chart
	byLevel        map[string]float64 // 429s by priority level
	storeConflicts float64            // kubestore's skein_block_claim_conflicts_total, summed
}

// RequestFigures are the latencies of one kind of request.
type RequestFigures struct {
	Kind                string
	Count               int
	P50ms, P99ms, Maxms float64
}
