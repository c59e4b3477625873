package grafana

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/skeinnet/skein/test/kube"
)

// The dashboards and the daemon each one shows.
var dashboards = map[string]string{
	"skeind.json":           "skeind",
	"skein-controller.json": "skein-controller",
	"skein-egress.json":     "skein-egress",
}

// dsVar is the datasource every panel and target must use: the
// dashboard's own Prometheus variable, so that an import picks the data
// source instead of a UID of the author's Grafana.
const dsVar = "${datasource}"

// dashboard is the part of Grafana's dashboard JSON model the tests read.
type dashboard struct {
	Title         string `json:"title"`
	UID           string `json:"uid"`
	SchemaVersion int    `json:"schemaVersion"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
	Panels []panel `json:"panels"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasource     `json:"datasource"`
}

type panel struct {
	ID         int         `json:"id"`
	Title      string      `json:"title"`
	Type       string      `json:"type"`
	Datasource *datasource `json:"datasource"`
	Targets    []target    `json:"targets"`
	Panels     []panel     `json:"panels"` // of a collapsed row
}

type target struct {
	Expr       string      `json:"expr"`
	RefID      string      `json:"refId"`
	Datasource *datasource `json:"datasource"`
}

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

// query is one PromQL expression of a dashboard and where it is.
type query struct {
	where string // panel "title" or variable $name
	expr  string
}

// use is a metric a query names, with the labels the query relies on it
// having (its matchers, and the by/without/on/ignoring labels of the
// expressions above it).
type use struct {
	where, metric string
	labels        []string
}

func readDashboard(t *testing.T, file string) *dashboard {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: not a dashboard JSON model: %v", file, err)
	}
	return &d
}

// allPanels flattens rows, collapsed or not.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// queries returns every PromQL expression of d: panel targets, and the
// metric argument of query variables' label_values(metric, label).
func queries(t *testing.T, d *dashboard) []query {
	t.Helper()
	var qs []query
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		var s string
		if json.Unmarshal(v.Query, &s) == nil {
			q.Query = s
		} else if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable $%s: query: %v", v.Name, err)
			continue
		}
		m := labelValues.FindStringSubmatch(strings.TrimSpace(q.Query))
		if m == nil {
			t.Errorf("variable $%s: query %q is not label_values(metric, label)", v.Name, q.Query)
			continue
		}
		// The label must be one the metric has: check it as a grouping.
		qs = append(qs, query{where: "$" + v.Name, expr: fmt.Sprintf("count by (%s) (%s)", m[2], m[1])})
	}
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			qs = append(qs, query{where: fmt.Sprintf("%q", p.Title), expr: tg.Expr})
		}
	}
	return qs
}

var (
	labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)
	grafanaVar  = regexp.MustCompile(`\$\{?(\w+)(?::\w+)?\}?`)
)

// expand replaces Grafana's variables so that the PromQL parser can read
// the expression: interval variables by a duration, the others (which
// stand inside label matcher strings) by a regular expression.
func expand(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		name := grafanaVar.FindStringSubmatch(v)[1]
		if strings.HasPrefix(name, "__") {
			return "5m" // $__rate_interval, $__interval, $__range
		}
		return ".+"
	})
}

// uses parses expr and returns the metrics it names.
func uses(where, expr string) ([]use, error) {
	// The parser of a Prometheus server with no experimental feature on.
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expand(expr))
	if err != nil {
		return nil, err
	}
	var out []use
	parser.Inspect(e, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		u := use{where: where, metric: vs.Name}
		for _, m := range vs.LabelMatchers {
			switch {
			case m.Name == labels.MetricName && m.Type == labels.MatchEqual:
				u.metric = m.Value
			case m.Name != labels.MetricName:
				u.labels = append(u.labels, m.Name)
			}
		}
		// Labels an aggregation or a vector match above this selector
		// groups by must come from it (or from a sibling: checked
		// leniently in exported, against the union of the query's
		// metrics).
		for _, p := range path {
			switch p := p.(type) {
			case *parser.AggregateExpr:
				u.labels = append(u.labels, p.Grouping...)
			case *parser.BinaryExpr:
				if p.VectorMatching != nil {
					u.labels = append(u.labels, p.VectorMatching.MatchingLabels...)
				}
			}
		}
		out = append(out, u)
		return nil
	})
	return out, nil
}

// TestDashboards: every dashboard is a Grafana JSON model whose panels
// have unique ids and use the ${datasource} variable, and whose queries
// are PromQL that names only skein's, Go's and the process's metrics.
// TestDashboardMetricsExported checks those names against the running
// daemons.
func TestDashboards(t *testing.T) {
	files, err := filepath.Glob("*.json")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for f := range dashboards {
		names = append(names, f)
	}
	slices.Sort(files)
	slices.Sort(names)
	if !slices.Equal(files, names) {
		t.Errorf("dashboards here: %v, want %v", files, names)
	}
	uids := map[string]string{}
	for _, file := range names {
		d := readDashboard(t, file)
		if d.Title == "" || d.UID == "" {
			t.Errorf("%s: title %q, uid %q: want both", file, d.Title, d.UID)
		}
		if prev, dup := uids[d.UID]; dup {
			t.Errorf("%s: uid %q is also %s's", file, d.UID, prev)
		}
		uids[d.UID] = file
		if d.SchemaVersion < 36 {
			t.Errorf("%s: schemaVersion %d, want 36 or later (datasource references by uid)", file, d.SchemaVersion)
		}
		checkVariables(t, file, d)
		checkPanels(t, file, d)
		n := 0
		for _, q := range queries(t, d) {
			us, err := uses(q.where, q.expr)
			if err != nil {
				t.Errorf("%s: %s: %q: %v", file, q.where, q.expr, err)
				continue
			}
			if len(us) == 0 {
				t.Errorf("%s: %s: %q names no metric", file, q.where, q.expr)
			}
			for _, u := range us {
				if u.metric == "" {
					t.Errorf("%s: %s: %q: a selector without a metric name", file, q.where, q.expr)
				}
			}
			n++
		}
		t.Logf("%s: %d queries", file, n)
	}
}

func checkVariables(t *testing.T, file string, d *dashboard) {
	t.Helper()
	ds := false
	for _, v := range d.Templating.List {
		switch {
		case v.Name == "datasource":
			var q string
			json.Unmarshal(v.Query, &q)
			if v.Type != "datasource" || q != "prometheus" {
				t.Errorf("%s: $datasource is a %s of %s, want a datasource variable of prometheus", file, v.Type, v.Query)
			}
			ds = true
		case v.Type == "query":
			if v.Datasource == nil || v.Datasource.UID != dsVar {
				t.Errorf("%s: variable $%s: datasource %+v, want uid %s", file, v.Name, v.Datasource, dsVar)
			}
		}
	}
	if !ds {
		t.Errorf("%s: no $datasource variable", file)
	}
}

func checkPanels(t *testing.T, file string, d *dashboard) {
	t.Helper()
	ids := map[int]string{}
	for _, p := range allPanels(d.Panels) {
		if p.ID == 0 {
			t.Errorf("%s: panel %q has no id", file, p.Title)
		} else if prev, dup := ids[p.ID]; dup {
			t.Errorf("%s: panels %q and %q share id %d", file, prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Title == "" {
			t.Errorf("%s: panel %d has no title", file, p.ID)
		}
		if p.Datasource == nil || p.Datasource.UID != dsVar || p.Datasource.Type != "prometheus" {
			t.Errorf("%s: panel %q: datasource %+v, want prometheus %s", file, p.Title, p.Datasource, dsVar)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", file, p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Datasource == nil || tg.Datasource.UID != dsVar {
				t.Errorf("%s: panel %q, query %s: datasource %+v, want %s", file, p.Title, tg.RefID, tg.Datasource, dsVar)
			}
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: panel %q, query %s is empty", file, p.Title, tg.RefID)
			}
		}
	}
}

// TestKustomization: kubectl kustomize makes one ConfigMap per dashboard,
// labelled for Grafana's sidecar, holding the file unchanged. It skips
// when test/kube's kubectl is not built.
func TestKustomization(t *testing.T) {
	kubectl := filepath.Join(kube.AssetsDir(), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Skipf("no kubectl in %s: run scripts/install-deps.sh (make deps)", kube.AssetsDir())
	}
	out, err := exec.Command(kubectl, "kustomize", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	found := map[string]bool{}
	for _, doc := range strings.Split(string(out), "\n---\n") {
		var cm corev1.ConfigMap
		if err := yaml.Unmarshal([]byte(doc), &cm); err != nil {
			t.Fatal(err)
		}
		if cm.Kind != "ConfigMap" || cm.Labels["grafana_dashboard"] != "1" {
			t.Errorf("%s %s: labels %v, want a ConfigMap labelled grafana_dashboard: \"1\"", cm.Kind, cm.Name, cm.Labels)
		}
		for file, data := range cm.Data {
			want, err := os.ReadFile(file)
			if err != nil {
				t.Errorf("ConfigMap %s: key %s: %v", cm.Name, file, err)
			} else if data != string(want) {
				t.Errorf("ConfigMap %s: key %s differs from the file", cm.Name, file)
			}
			found[file] = true
		}
	}
	for file := range dashboards {
		if !found[file] {
			t.Errorf("no ConfigMap holds %s", file)
		}
	}
}
