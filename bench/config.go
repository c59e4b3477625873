package bench

// Config is one benchmark run.
type Config struct {
	// Out is the directory the report, JSON and charts are written to.
	Out string `json:"-"`
	// Mode names the preset ("full" or "quick").
	Mode string `json:"mode"`
	// Levels are the attachment counts already on the node when latency
	// is measured, ascending; the node is filled up to each in turn.
	Levels []int `json:"levels"`
	// Concurrency are the numbers of concurrent runtime calls.
	Concurrency []int `json:"concurrency"`
	// Ops is the number of ADD+DEL pairs per contender, level and
	// concurrency (each on a fresh pod namespace).
	Ops int `json:"ops"`
	// HeadOps is the number of ADD+DEL pairs per contender and
	// concurrency of the head-to-head phase (0: no such phase).
	HeadOps int `json:"head_to_head_ops"`
	// Warmup pairs run (unrecorded) before a contender's first level.
	Warmup int `json:"warmup"`
	// Dual gives every contender IPv6 too (default IPv4 only: the
	// reference bridge plugin waits for IPv6 DAD, which would measure
	// the kernel's timer rather than the plugin).
	Dual bool `json:"dual_stack"`
	// DualLevels are the node sizes at which skein and the floor are also
	// measured with dual-stack pools (c=1 only), when Dual is off.
	DualLevels []int `json:"dual_stack_levels,omitempty"`
	// Contenders to run, by name; empty = all but floor-poddel.
	Contenders []string `json:"contenders,omitempty"`
	// IperfSeconds and IperfRounds shape the throughput test; RRCount is
	// the number of TCP request/response round trips for RTT.
	IperfSeconds int `json:"iperf_seconds"`
	IperfRounds  int `json:"iperf_rounds"`
	RRCount      int `json:"rr_count"`
	// RestartTrials is how often skeind is restarted with the top level of
	// attachments on its node.
	RestartTrials int `json:"restart_trials"`
	// Verbose logs the test bed's messages.
	Verbose bool `json:"-"`
}

// Full is `make bench`.
func Full() Config {
	return Config{Mode: "full", Levels: []int{10, 1000, 5000}, DualLevels: []int{10, 5000}, Concurrency: []int{1, 8, 32}, Ops: 160, HeadOps: 400, Warmup: 8,
		IperfSeconds: 5, IperfRounds: 3, RRCount: 20000, RestartTrials: 3}
}

// Quick is `make bench-quick`: fewer operations, no 5,000 level.
func Quick() Config {
	return Config{Mode: "quick", Levels: []int{10, 1000}, DualLevels: []int{10, 1000}, Concurrency: []int{1, 8, 32}, Ops: 40, HeadOps: 160, Warmup: 4,
		IperfSeconds: 2, IperfRounds: 1, RRCount: 5000, RestartTrials: 1}
}
