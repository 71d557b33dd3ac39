package deploy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
)

// prometheusSeries are series Prometheus makes itself for every target.
var prometheusSeries = map[string]bool{"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true}

// facts is what the tests learn from a running intentd.
type facts struct {
	metrics map[string]bool // series names it exports
	paths   map[string]bool // HTTP paths of its metrics listener that answered 200
	flags   map[string]bool // its flags, from --help
	// console is what its own console listener (--console-listen)
	// answered, and besideMetrics what the metrics listener beside it
	// answered, by path: the status, redirects not followed.
	console, besideMetrics map[string]int
}

var running struct {
	once sync.Once
	facts
	err error
}

// probePaths are the metrics listener's paths a probe or a scrape may use.
var probePaths = []string{"/healthz", "/readyz", "/metrics"}

// exportedMetrics is every series name intentd exports: what a freshly
// started intentd (built from this checkout, embedded etcd) serves on
// /metrics, with the _bucket, _sum and _count series of its histograms,
// and the metrics docs/OPERATIONS.md's table lists (counters with labels appear on
// /metrics only once they moved).
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	startIntentd(t)
	return running.metrics
}

// servedPaths are the paths of probePaths a running intentd's metrics
// listener answers with 200.
func servedPaths(t *testing.T) map[string]bool {
	t.Helper()
	startIntentd(t)
	return running.paths
}

func startIntentd(t *testing.T) {
	t.Helper()
	running.once.Do(func() { running.facts, running.err = learn() })
	if running.err != nil {
		t.Fatalf("a running intentd: %v", running.err)
	}
}

// consoleAnswers are what a running intentd answered on its console
// listener (--console-listen) and, for the console's path, on the metrics
// listener beside it: path → status, redirects not followed.
func consoleAnswers(t *testing.T) (console, besideMetrics map[string]int) {
	t.Helper()
	startIntentd(t)
	return running.console, running.besideMetrics
}

// intentdFlags are the flags intentd --help lists.
func intentdFlags(t *testing.T) map[string]bool {
	t.Helper()
	startIntentd(t)
	return running.flags
}

// helpFlag is a flag's line in intentd --help: "  --name type  usage".
var helpFlag = regexp.MustCompile(`(?m)^\s+(?:-[a-z], )?--([a-z0-9-]+)`)

// learn builds intentd from this checkout, reads its --help, starts it
// (embedded etcd, loopback, the console on a listener of its own) and asks
// its metrics and console listeners.
func learn() (facts, error) {
	var f facts
	dir, err := os.MkdirTemp("", "intentd-deploy-test-")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "intentd")
	build := exec.Command("go", "build", "-o", bin, "./cmd/intentd")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		return f, fmt.Errorf("go build ./cmd/intentd: %v\n%s", err, out)
	}
	help, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		return f, fmt.Errorf("intentd --help: %v\n%s", err, help)
	}
	f.flags = map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(string(help), -1) {
		f.flags[m[1]] = true
	}
	ports, err := freePorts(4)
	if err != nil {
		return f, err
	}
	metricsAddr, consoleAddr := ports[1], ports[3]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--data-dir", filepath.Join(dir, "data"),
		"--listen", ports[0], "--metrics-listen", metricsAddr, "--embed-client-url", "http://"+ports[2], "--console-listen", consoleAddr,
		"--log-format", "json")
	cmd.Env = []string{"HOME=" + dir}
	var logs strings.Builder
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		return f, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	// Ready first: the store's gauges are set once etcd answered.
	for get("http://"+metricsAddr+"/readyz") != nil {
		if ctx.Err() != nil {
			return f, fmt.Errorf("intentd never became ready on %s:\n%s", metricsAddr, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	f.paths = map[string]bool{}
	for _, p := range probePaths {
		f.paths[p] = get("http://"+metricsAddr+p) == nil
	}
	f.console, f.besideMetrics = map[string]int{}, map[string]int{}
	for _, p := range append([]string{"/", "/console/", "/console/signin"}, probePaths...) {
		if f.console[p], err = status("http://" + consoleAddr + p); err != nil {
			return f, err
		}
	}
	if f.besideMetrics["/console/"], err = status("http://" + metricsAddr + "/console/"); err != nil {
		return f, err
	}
	body, err := getBody("http://" + metricsAddr + "/metrics")
	if err != nil {
		return f, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return f, fmt.Errorf("parse /metrics: %v", err)
	}
	f.metrics = map[string]bool{}
	for name, fam := range families {
		addSeries(f.metrics, name, fam.GetType())
	}
	table, err := readmeMetrics()
	if err != nil {
		return f, err
	}
	for name, typ := range table {
		addSeries(f.metrics, name, typ)
	}
	return f, nil
}

// addSeries adds the series names a metric family of type typ exposes.
func addSeries(names map[string]bool, family string, typ dto.MetricType) {
	names[family] = true
	switch typ {
	case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
		names[family+"_bucket"], names[family+"_sum"], names[family+"_count"] = true, true, true
	case dto.MetricType_SUMMARY:
		names[family+"_sum"], names[family+"_count"] = true, true
	}
}

// readmeMetric is a row of the metric table of docs/OPERATIONS.md (once
// the README's): | `name` | type | …
var readmeMetric = regexp.MustCompile("^\\| *`([a-z_:][a-z0-9_:]*)` *\\| *([a-z]+)")

// readmeMetrics reads the metric table of docs/OPERATIONS.md (held to
// /metrics by internal/run/daemon's tests): name → type.
func readmeMetrics() (map[string]dto.MetricType, error) {
	f, err := os.Open("../docs/OPERATIONS.md")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]dto.MetricType{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		if m := readmeMetric.FindStringSubmatch(s.Text()); m != nil && strings.HasPrefix(m[1], "intentd_") {
			names[m[1]] = dto.MetricType(dto.MetricType_value[strings.ToUpper(m[2])])
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return nil, errors.New("deploy: docs/OPERATIONS.md has no metric table (| `intentd_…` | type |)")
	}
	return names, nil
}

// status is the status GET url answers, without following a redirect.
func status(url string) (int, error) {
	c := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func get(url string) error {
	_, err := getBody(url)
	return err
}

func getBody(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s %s", url, resp.Status, b.String())
	}
	return b.String(), nil
}

// freePorts returns n loopback addresses nothing listens on right now,
// for the intentd these tests start. The ports are drawn below Linux's
// ephemeral range (32768 and up), where no listener on ":0" of a test
// running alongside can be given one between this check and intentd's
// bind, and below 20000, where the product module's tests draw theirs
// (internal/core/freeport, which this module cannot import).
func freePorts(n int) ([]string, error) {
	var addrs []string
	var lis []net.Listener
	defer func() {
		for _, l := range lis {
			l.Close()
		}
	}()
	for tries := 0; len(addrs) < n; tries++ {
		if tries == 200 {
			return nil, fmt.Errorf("no %d free ports in 127.0.0.1:12000-19999 after %d tries", n, tries)
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", 12000+rand.IntN(8000)))
		if err != nil {
			continue // taken
		}
		lis = append(lis, l)
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// grafanaVariables are the dashboard's template variables and Grafana's
// own interval variables, replaced before an expression is parsed.
var grafanaVariables = regexp.MustCompile(`\$\{?__(rate_)?interval\}?|\$\{?[A-Za-z_]+(:[a-z]+)?\}?`)

// metricNames returns the series names expr selects.
func metricNames(expr string) ([]string, error) {
	expr = grafanaVariables.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.Contains(v, "interval") {
			return "5m"
		}
		return "x"
	})
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, sel := range parser.ExtractSelectors(e) {
		for _, m := range sel {
			if m.Name == model.MetricNameLabel {
				names = append(names, m.Value)
			}
		}
	}
	return names, nil
}
