package deploy

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/prometheus/common/model"
	promconfig "github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery"
	"sigs.k8s.io/yaml"
)

// project loads deploy/compose/compose.yaml as `docker compose` does:
// schema validation, interpolation, anchors and merges, consistency.
func project(t *testing.T) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{"compose/compose.yaml"},
		cli.WithName("intentd"), cli.WithEnv([]string{}), cli.WithInterpolation(true), cli.WithConsistency(true))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("load compose.yaml: %v", err)
	}
	return p
}

// flagValue returns the value of --name=value in args, and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func TestComposeHasThreeEtcdMembersAndTwoReplicas(t *testing.T) {
	p := project(t)
	etcd := []string{"etcd-0", "etcd-1", "etcd-2"}
	replicas := []string{"intentd-0", "intentd-1"}
	var wantEndpoints []string
	for _, name := range etcd {
		s, err := p.GetService(name)
		if err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		if got, _ := flagValue(s.Command, "name"); got != name {
			t.Errorf("%s: etcd --name %q, want %q", name, got, name)
		}
		if want := "http://" + name + ":2379"; !slices.Contains(s.Command, "--advertise-client-urls="+want) {
			t.Errorf("%s: command %q does not advertise %s", name, s.Command, want)
		}
		if !strings.Contains(*s.Environment["ETCD_INITIAL_CLUSTER"], name+"=http://"+name+":2380") {
			t.Errorf("%s: ETCD_INITIAL_CLUSTER %q lacks the member itself", name, *s.Environment["ETCD_INITIAL_CLUSTER"])
		}
		wantEndpoints = append(wantEndpoints, "http://"+name+":2379")
		checkCommon(t, p, s, "/var/lib/etcd")
	}

	for _, name := range replicas {
		s, err := p.GetService(name)
		if err != nil {
			t.Fatalf("service %s: %v", name, err)
		}
		got, _ := flagValue(s.Command, "etcd-endpoints")
		if eps := strings.Split(got, ","); !slices.Equal(eps, wantEndpoints) {
			t.Errorf("%s: --etcd-endpoints %q, want all three members %q", name, got, wantEndpoints)
		}
		for _, dep := range etcd {
			if d, ok := s.DependsOn[dep]; !ok || d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s: depends_on %s is %+v, want condition service_healthy", name, dep, d)
			}
		}
		checkCommon(t, p, s, "/var/lib/intentd")
		checkIntentdCredentials(t, p, s)
		checkIntentdHealthcheck(t, s)
	}
}

// checkCommon: every stateful service has a named volume of its own at
// dataDir and a health check.
func checkCommon(t *testing.T, p *types.Project, s types.ServiceConfig, dataDir string) {
	t.Helper()
	var found bool
	for _, v := range s.Volumes {
		if v.Target != dataDir {
			continue
		}
		found = true
		if v.Type != types.VolumeTypeVolume {
			t.Errorf("%s: %s is a %s mount, want a named volume", s.Name, dataDir, v.Type)
		}
		if _, ok := p.Volumes[v.Source]; !ok {
			t.Errorf("%s: volume %q is not declared", s.Name, v.Source)
		}
		if want := s.Name + "-data"; v.Source != want {
			t.Errorf("%s: data volume %q, want its own, %q", s.Name, v.Source, want)
		}
	}
	if !found {
		t.Errorf("%s: no volume at %s", s.Name, dataDir)
	}
	if s.HealthCheck == nil || len(s.HealthCheck.Test) < 2 || s.HealthCheck.Test[0] != "CMD" {
		t.Errorf("%s: healthcheck %+v, want an exec-form test", s.Name, s.HealthCheck)
	}
}

// checkIntentdCredentials: TLS and the tokens file are secrets the service
// mounts, from files under deploy/compose.
func checkIntentdCredentials(t *testing.T, p *types.Project, s types.ServiceConfig) {
	t.Helper()
	mounted := map[string]string{} // path in the container → secret name
	for _, sec := range s.Secrets {
		target := sec.Target
		if target == "" {
			target = sec.Source
		}
		if !strings.HasPrefix(target, "/") {
			target = "/run/secrets/" + target
		}
		mounted[target] = sec.Source
	}
	for _, flag := range []string{"tls-cert", "tls-key", "tls-client-ca", "tokens-file"} {
		path, ok := flagValue(s.Command, flag)
		if !ok {
			t.Errorf("%s: no --%s", s.Name, flag)
			continue
		}
		name, ok := mounted[path]
		if !ok {
			t.Errorf("%s: --%s=%s is not a mounted secret (mounted: %v)", s.Name, flag, path, mounted)
			continue
		}
		file := p.Secrets[name].File
		if rel, err := filepath.Rel(p.WorkingDir, file); err != nil || strings.HasPrefix(rel, "..") {
			t.Errorf("%s: secret %s comes from %q, want a file under deploy/compose", s.Name, name, file)
		}
	}
}

// metricsPort is the port of intentd's metrics listener (/metrics, /healthz,
// /readyz) as the service's command configures it.
func metricsPort(t *testing.T, args []string) string {
	t.Helper()
	addr, ok := flagValue(args, "metrics-listen")
	if !ok {
		t.Fatalf("command %q sets no --metrics-listen", args)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--metrics-listen %q: %v", addr, err)
	}
	if host != "0.0.0.0" && host != "" {
		t.Errorf("--metrics-listen %q: Prometheus in another container cannot reach it", addr)
	}
	return port
}

func checkIntentdHealthcheck(t *testing.T, s types.ServiceConfig) {
	t.Helper()
	if s.HealthCheck == nil {
		return // reported by checkCommon
	}
	test := s.HealthCheck.Test
	if want := "http://127.0.0.1:" + metricsPort(t, s.Command) + "/readyz"; test[len(test)-1] != want || !slices.Contains(test, "probe") {
		t.Errorf("%s: healthcheck %q, want intentctl probe %s", s.Name, test, want)
	}
}

// etcd is on a network only etcd and intentd join, which has no route out.
func TestComposeOnlyIntentdReachesEtcd(t *testing.T) {
	p := project(t)
	store := ""
	for _, name := range []string{"etcd-0", "etcd-1", "etcd-2"} {
		s, _ := p.GetService(name)
		if len(s.Networks) != 1 {
			t.Errorf("%s: networks %v, want exactly one (the store network)", name, s.Networks)
		}
		for n := range s.Networks {
			store = n
		}
		if len(s.Ports) > 0 {
			t.Errorf("%s publishes ports %v: etcd must be reachable by intentd only", name, s.Ports)
		}
	}
	if !p.Networks[store].Internal {
		t.Errorf("network %q of etcd is not internal", store)
	}
	for _, s := range p.Services {
		if _, on := s.Networks[store]; on && !strings.HasPrefix(s.Name, "etcd-") && !strings.HasPrefix(s.Name, "intentd-") {
			t.Errorf("service %s joins the store network %q", s.Name, store)
		}
	}
}

// Prometheus scrapes both replicas' metrics listeners and loads the alert
// rules of deploy/monitoring.
func TestComposePrometheusScrapesBothReplicas(t *testing.T) {
	p := project(t)
	prom, err := p.GetService("prometheus")
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]string{} // container path → host path
	for _, v := range prom.Volumes {
		if v.Type == types.VolumeTypeBind {
			mounts[v.Target] = v.Source
		}
	}
	configPath, _ := flagValue(prom.Command, "config.file")
	host, ok := mounts[configPath]
	if !ok {
		t.Fatalf("prometheus --config.file=%s is not mounted (mounts %v)", configPath, mounts)
	}
	cfg, err := promconfig.LoadFile(host, false, nil)
	if err != nil {
		t.Fatalf("prometheus config %s: %v", host, err)
	}

	var targets []string
	for _, sc := range cfg.ScrapeConfigs {
		if sc.MetricsPath != "/metrics" {
			continue
		}
		for _, sd := range sc.ServiceDiscoveryConfigs {
			static, ok := sd.(discovery.StaticConfig)
			if !ok {
				continue
			}
			for _, group := range static {
				for _, target := range group.Targets {
					targets = append(targets, string(target[model.AddressLabel]))
				}
			}
		}
	}
	for _, name := range []string{"intentd-0", "intentd-1"} {
		s, _ := p.GetService(name)
		want := net.JoinHostPort(name, metricsPort(t, s.Command))
		if !slices.Contains(targets, want) {
			t.Errorf("prometheus scrapes %v, want %s among them", targets, want)
		}
		if !sharesNetwork(prom, s) {
			t.Errorf("prometheus and %s share no network", name)
		}
	}

	// Every rule file glob matches a mounted file, and the alert rules of
	// deploy/monitoring are one of them.
	alerts, _ := filepath.Abs("monitoring/alerts.yaml")
	var loaded bool
	for _, glob := range cfg.RuleFiles {
		for target, src := range mounts {
			if ok, _ := filepath.Match(glob, target); ok && src == alerts {
				loaded = true
			}
		}
	}
	if !loaded {
		t.Errorf("prometheus rule_files %v match no mount of %s (mounts %v)", cfg.RuleFiles, alerts, mounts)
	}
}

func sharesNetwork(a, b types.ServiceConfig) bool {
	for n := range a.Networks {
		if _, ok := b.Networks[n]; ok {
			return true
		}
	}
	return false
}

// Grafana provisions the dashboard of deploy/monitoring, from the path its
// dashboard provider reads, and Prometheus as its data source.
func TestComposeGrafanaProvisionsTheDashboard(t *testing.T) {
	p := project(t)
	g, err := p.GetService("grafana")
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]string{}
	for _, v := range g.Volumes {
		if v.Type == types.VolumeTypeBind {
			mounts[v.Target] = v.Source
		}
	}
	var provider struct {
		Providers []struct {
			Options struct {
				Path string `json:"path"`
			} `json:"options"`
		} `json:"providers"`
	}
	var datasources struct {
		Datasources []struct {
			Type string `json:"type"`
			URL  string `json:"url"`
		} `json:"datasources"`
	}
	for target, src := range mounts {
		switch filepath.Dir(target) {
		case "/etc/grafana/provisioning/dashboards":
			decodeYAML(t, src, &provider)
		case "/etc/grafana/provisioning/datasources":
			decodeYAML(t, src, &datasources)
		}
	}
	dashboard, _ := filepath.Abs("monitoring/dashboard.json")
	var found bool
	for _, pr := range provider.Providers {
		for target, src := range mounts {
			if src == dashboard && filepath.Dir(target) == pr.Options.Path {
				found = true
			}
		}
	}
	if !found {
		t.Errorf("grafana: no dashboard provider reads %s (providers %+v, mounts %v)", dashboard, provider.Providers, mounts)
	}
	prom, _ := p.GetService("prometheus")
	if len(datasources.Datasources) != 1 || datasources.Datasources[0].Type != "prometheus" ||
		datasources.Datasources[0].URL != "http://prometheus:9090" || !sharesNetwork(g, prom) {
		t.Errorf("grafana data sources %+v, want the compose file's Prometheus on a shared network", datasources.Datasources)
	}
}

// decodeYAML reads the fields of v from the YAML file at path (not
// strictly: v names only the fields the test checks).
func decodeYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Errorf("%s: %v", path, err)
	}
}
