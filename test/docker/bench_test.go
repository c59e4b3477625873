package docker_test

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkDockerRun measures what a Docker user waits for,
// `docker run --rm --net N busybox true`, on a skein network and on a
// user-defined network of Docker's built-in bridge driver: one engine, the
// two alternating run by run so that load from elsewhere on the machine
// hits both alike. It reports each one's median and p90, and the time
// skeind spent in the plugin calls of a skein run (from its log).
//
//	go test -run '^$' -bench DockerRun -benchtime 30x ./test/docker/
func BenchmarkDockerRun(b *testing.B) {
	e := newEnv(b)
	e.network(b, "bench-skein")
	e.mustDocker(b, "network", "create", "-d", "bridge", "--subnet", "10.199.0.0/24", "bench-bridge")
	b.Cleanup(func() { e.docker("network", "rm", "bench-skein", "bench-bridge") })
	nets := []string{"bench-skein", "bench-bridge"}
	for _, n := range nets { // warm up
		e.mustDocker(b, "run", "--rm", "--net", n, image, "true")
	}
	lat := make([][]time.Duration, len(nets))
	logStart := len(e.sk.Log())
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j, n := range nets {
			start := time.Now()
			e.mustDocker(b, "run", "--rm", "--net", n, image, "true")
			lat[j] = append(lat[j], time.Since(start))
		}
	}
	b.StopTimer()
	for j, name := range []string{"skein", "bridge"} {
		slices.Sort(lat[j])
		b.ReportMetric(ms(lat[j][len(lat[j])/2]), name+"-p50-ms")
		b.ReportMetric(ms(lat[j][len(lat[j])*9/10]), name+"-p90-ms")
	}
	b.ReportMetric(ms(pluginTime(e.sk.Log()[logStart:]))/float64(b.N), "skeind-ms/run")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

var tookRE = regexp.MustCompile(`msg="docker request" method=\S+ took=(\S+)`)

// pluginTime sums the durations skeind logged for Docker plugin calls.
func pluginTime(log string) time.Duration {
	var sum time.Duration
	for _, line := range strings.Split(log, "\n") {
		if m := tookRE.FindStringSubmatch(line); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				sum += d
			}
		}
	}
	return sum
}
