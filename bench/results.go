package bench

import "time"

// Report is everything one run measured; results.json is its encoding.
type Report struct {
	Machine Machine      `json:"machine"`
	Config  Config       `json:"config"`
	Started time.Time    `json:"started"`
	Seconds float64      `json:"seconds"`
	Latency []LatencyRow `json:"latency"`
	// HeadToHead: skein, the exec floor and the floor (and the dual-stack
	// pair at c=1) at the first level, taking turns (measureHeadToHead).
	HeadToHead []LatencyRow `json:"head_to_head,omitempty"`
	// DualStack: skein and the floor with dual-stack pools at
	// Config.DualLevels, c=1.
	DualStack []LatencyRow `json:"dual_stack,omitempty"`
	Preload   []PreloadRow `json:"preload"`
	DataPath  *DataPath    `json:"data_path,omitempty"`
	Restart   *Restart     `json:"restart,omitempty"`
	RSS       []RSSRow     `json:"skeind_rss"`
	Errors    []string     `json:"errors,omitempty"`
	order     []string     // contenders in run order
}

// Machine identifies where the figures come from.
type Machine struct {
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpu_model"`
	MemoryMiB int    `json:"memory_mib"`
	Kernel    string `json:"kernel"`
	Go        string `json:"go"`
	Plugins   string `json:"reference_plugins"`
	Skein     string `json:"skein"`
}

// LatencyRow is one contender at one node size and concurrency: Ops
// ADD+DEL pairs, each worker doing ADD then DEL of one pod.
type LatencyRow struct {
	Contender   string  `json:"contender"`
	Attachments int     `json:"attachments"`
	Concurrency int     `json:"concurrency"`
	Add         Dist    `json:"add"`
	Del         Dist    `json:"del"`
	Wall        float64 `json:"wall_seconds"`
	// PerSecond is the churn throughput: ADD+DEL pairs completed per second.
	PerSecond float64 `json:"attachments_per_second"`
	// CPUPerPair is the CPU time per ADD+DEL pair while the cell ran, ms:
	// the benchmark process (libcni, the floor's netlink calls), the
	// plugins it exec'd and the contender's daemons (skeind); kernel
	// threads' deferred work is not in it.
	CPUPerPair float64 `json:"cpu_ms_per_pair,omitempty"`
	// CPU is CPUPerPair by where it ran.
	CPU    *CPUSplit `json:"cpu_ms_per_pair_by_process,omitempty"`
	Failed int       `json:"failed"`
	// NA says why the cell could not be measured (empty: it was).
	NA       string `json:"not_applicable,omitempty"`
	FirstErr string `json:"first_error,omitempty"`
}

// CPUSplit is a cell's CPU time per ADD+DEL pair, ms, by process: the
// benchmark process (the runtime's side: libcni, which execs the plugins
// and waits for them; the floor's netlink calls run here too), the
// plugins libcni exec'd, and the contender's daemons.
type CPUSplit struct {
	Runtime float64 `json:"runtime"`
	Plugins float64 `json:"plugins"`
	Daemons float64 `json:"daemons"`
}

// PreloadRow: how long filling the node up to Attachments took (setup, not
// a measurement of the contender's latency).
type PreloadRow struct {
	Contender   string  `json:"contender"`
	Attachments int     `json:"attachments"`
	Seconds     float64 `json:"seconds"`
}

// DataPath compares two pods on one skein node with a bare veth pair.
type DataPath struct {
	VethGbps  []float64 `json:"veth_gbps"`
	SkeinGbps []float64 `json:"skein_gbps"`
	VethRTT   Dist      `json:"veth_tcp_rr"`
	SkeinRTT  Dist      `json:"skein_tcp_rr"`
}

// Restart: skeind stopped (SIGTERM) with Attachments on its node and
// started again; ToFirstADD is from exec until an ADD through the plugin
// succeeds, Reconcile what skeind logged for its startup reconcile.
type Restart struct {
	Attachments int       `json:"attachments"`
	ToFirstADD  []float64 `json:"to_first_add_ms"`
	Reconcile   []string  `json:"reconcile_logged"`
	RSSKiB      int       `json:"rss_kib_after_restart"`
}

// RSSRow: skeind's VmRSS with Attachments on its node.
type RSSRow struct {
	Attachments int    `json:"attachments"`
	KiB         int    `json:"rss_kib"`
	When        string `json:"when"`
}
