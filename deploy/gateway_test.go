package deploy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/prometheus/common/model"
	promconfig "github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/discovery"
)

// The fencing gateway's deployment files (docs/GATEWAY.md): the compose
// service and the Kubernetes kustomization, held to what `intentd gateway`
// built from this checkout accepts and serves.

// gatewayFacts is what a running `intentd gateway` told.
type gatewayFacts struct {
	flags  map[string]bool // its flags, from `intentd gateway --help`
	status map[string]int  // what its listener answered, by path
}

var gatewayRun struct {
	once sync.Once
	gatewayFacts
	err error
}

// runGateway builds intentd, reads `intentd gateway --help`, and runs the
// gateway with compose's config file (no intentd behind it) to ask its
// listener.
func runGateway(t *testing.T) gatewayFacts {
	t.Helper()
	gatewayRun.once.Do(func() { gatewayRun.gatewayFacts, gatewayRun.err = learnGateway() })
	if gatewayRun.err != nil {
		t.Fatalf("a running intentd gateway: %v", gatewayRun.err)
	}
	return gatewayRun.gatewayFacts
}

func learnGateway() (gatewayFacts, error) {
	var f gatewayFacts
	dir, err := os.MkdirTemp("", "intentd-gateway-deploy-test-")
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
	help, err := exec.Command(bin, "gateway", "--help").CombinedOutput()
	if err != nil {
		return f, fmt.Errorf("intentd gateway --help: %v\n%s", err, help)
	}
	f.flags = map[string]bool{}
	for _, m := range helpFlag.FindAllStringSubmatch(string(help), -1) {
		f.flags[m[1]] = true
	}
	ports, err := freePorts(1)
	if err != nil {
		return f, err
	}
	addr := ports[0]
	cmd := exec.Command(bin, "gateway", "--config", "compose/gateway.yaml", "--listen", addr, "--intentd", "127.0.0.1:1")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return f, err
	}
	if err := cmd.Start(); err != nil {
		return f, err
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stderr)
	serving := false
	var log []string
	for !serving && lines.Scan() {
		log = append(log, lines.Text())
		serving = strings.Contains(lines.Text(), "intentd gateway serving")
	}
	if !serving {
		return f, fmt.Errorf("intentd gateway with compose/gateway.yaml never served:\n%s", strings.Join(log, "\n"))
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	f.status = map[string]int{}
	c := &http.Client{Timeout: 5 * time.Second}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := c.Get("http://" + addr + p)
		if err != nil {
			return f, err
		}
		resp.Body.Close()
		f.status[p] = resp.StatusCode
	}
	return f, nil
}

// checkGatewayArgs checks args against the gateway's flags and returns the
// value of each --flag=value.
func checkGatewayArgs(t *testing.T, where string, args []string) map[string]string {
	t.Helper()
	if len(args) == 0 || args[0] != "gateway" {
		t.Fatalf("%s: args %q, want the subcommand gateway first", where, args)
	}
	known := runGateway(t).flags
	if len(known) < 10 {
		t.Fatalf("intentd gateway --help listed %d flags", len(known))
	}
	values := map[string]string{}
	for _, a := range args[1:] {
		name, ok := strings.CutPrefix(a, "--")
		if !ok {
			t.Errorf("%s: argument %q is no flag", where, a)
			continue
		}
		name, value, _ := strings.Cut(name, "=")
		if !known[name] {
			t.Errorf("%s: --%s is no flag of intentd gateway", where, name)
		}
		values[name] = value
	}
	return values
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	n, _ := strconv.Atoi(p)
	return n
}

// The compose service: the gateway subcommand with flags it has, its config
// file mounted (and good enough to serve with), on the front network only
// (never etcd's), published on loopback only (plaintext), probed on
// /readyz, scraped by Prometheus, given more time to stop than its
// shutdown timeout.
func TestComposeGateway(t *testing.T) {
	p := project(t)
	s, err := p.GetService("intentd-gateway")
	if err != nil {
		t.Fatal(err)
	}
	flags := checkGatewayArgs(t, "compose intentd-gateway", s.Command)
	var mounted bool
	for _, v := range s.Volumes {
		src, _ := filepath.Abs("compose/gateway.yaml")
		if v.Type == types.VolumeTypeBind && v.Target == flags["config"] && v.Source == src && v.ReadOnly {
			mounted = true
		}
	}
	if !mounted {
		t.Errorf("--config=%s is not compose/gateway.yaml mounted read-only: %v", flags["config"], s.Volumes)
	}
	if st := runGateway(t).status; st["/healthz"] != 200 || st["/readyz"] != 503 || st["/metrics"] != 200 {
		t.Errorf("the gateway with compose/gateway.yaml answered %v: want /healthz and /metrics 200, /readyz 503 without intentd", st)
	}
	if len(s.Networks) != 1 {
		t.Errorf("networks %v, want front only", s.Networks)
	}
	if _, ok := s.Networks["front"]; !ok {
		t.Errorf("networks %v, want front", s.Networks)
	}
	port := portOf(t, flags["listen"])
	for _, pp := range s.Ports {
		if pp.HostIP != "127.0.0.1" {
			t.Errorf("port %+v is published beyond loopback: the listener is plaintext", pp)
		}
	}
	if hc := s.HealthCheck; hc == nil || !slices.Contains(hc.Test, fmt.Sprintf("http://127.0.0.1:%d/readyz", port)) {
		t.Errorf("healthcheck %v does not probe /readyz on port %d", s.HealthCheck, port)
	}
	if s.StopGracePeriod == nil {
		t.Error("no stop_grace_period")
	} else if shutdown, err := time.ParseDuration(flags["shutdown-timeout"]); err != nil || time.Duration(*s.StopGracePeriod) <= shutdown {
		t.Errorf("stop_grace_period %v, want above --shutdown-timeout %q", time.Duration(*s.StopGracePeriod), flags["shutdown-timeout"])
	}
	cfg, err := promconfig.LoadFile("compose/prometheus.yml", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := net.JoinHostPort("intentd-gateway", strconv.Itoa(port))
	var scraped bool
	for _, sc := range cfg.ScrapeConfigs {
		for _, sd := range sc.ServiceDiscoveryConfigs {
			if static, ok := sd.(discovery.StaticConfig); ok {
				for _, g := range static {
					for _, target := range g.Targets {
						scraped = scraped || (string(target[model.AddressLabel]) == want && sc.MetricsPath == "/metrics")
					}
				}
			}
		}
	}
	if !scraped {
		t.Errorf("prometheus does not scrape %s/metrics", want)
	}
}

var gatewayDir = regexp.MustCompile(`^/`) // paths in the container are absolute

// The Kubernetes kustomization of the gateway: strict, probes on its
// listener (/healthz for startup and liveness, /readyz for readiness), its
// config Secret and intentd's CA mounted where its flags read them, a
// Service, a budget and a NetworkPolicy selecting its pods, non-root with
// a read-only root, time to record in-flight answers at SIGTERM.
func TestKubernetesGateway(t *testing.T) {
	m := render(t, "kubernetes/gateway")
	if len(m.deployments) != 1 || len(m.statefulSets) != 0 {
		t.Fatalf("%d Deployments, %d StatefulSets; want the gateway's alone", len(m.deployments), len(m.statefulSets))
	}
	d := byName(t, m.deployments, "intentd-gateway", func(d *appsv1.Deployment) metav1.ObjectMeta { return d.ObjectMeta })
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := &pod.Containers[0]
	flags := checkGatewayArgs(t, "kubernetes intentd-gateway", c.Args)
	port := int32(portOf(t, flags["listen"]))
	for name, probe := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		want := "/healthz"
		if name == "readiness" {
			want = "/readyz"
		}
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != want || containerPort(c, probe.HTTPGet.Port) != port {
			t.Errorf("%s probe %+v, want GET %s on port %d", name, probe, want, port)
		}
	}
	mountedAt := func(dir string) string {
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == dir && vm.ReadOnly {
				for _, v := range pod.Volumes {
					if v.Name == vm.Name && v.Secret != nil {
						return v.Secret.SecretName
					}
				}
			}
		}
		return ""
	}
	for flag, secret := range map[string]string{"config": "intentd-gateway-config", "intentd-ca": "intentd-tls"} {
		path := flags[flag]
		if !gatewayDir.MatchString(path) || mountedAt(filepath.Dir(path)) != secret {
			t.Errorf("--%s=%s: not in Secret %s mounted read-only at its directory", flag, path, secret)
		}
	}
	sc := c.SecurityContext
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("the gateway must run as non-root with a read-only root file system")
	}
	shutdown, err := time.ParseDuration(flags["shutdown-timeout"])
	if err != nil || pod.TerminationGracePeriodSeconds == nil || time.Duration(*pod.TerminationGracePeriodSeconds)*time.Second <= shutdown {
		t.Errorf("terminationGracePeriodSeconds %v, want above --shutdown-timeout %q", pod.TerminationGracePeriodSeconds, flags["shutdown-timeout"])
	}
	podLabels := labels.Set(d.Spec.Template.Labels)
	svc := byName(t, m.services, "intentd-gateway", func(s *corev1.Service) metav1.ObjectMeta { return s.ObjectMeta })
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Ports) != 1 || containerPort(c, svc.Spec.Ports[0].TargetPort) != port {
		t.Errorf("Service %+v does not reach the gateway's port %d", svc.Spec, port)
	}
	pdb := byName(t, m.pdbs, "intentd-gateway", func(p *policyv1.PodDisruptionBudget) metav1.ObjectMeta { return p.ObjectMeta })
	if sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget does not select the gateway's pods")
	}
	np := byName(t, m.networkPolicies, "intentd-gateway", func(n *networkingv1.NetworkPolicy) metav1.ObjectMeta { return n.ObjectMeta })
	if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil || !sel.Matches(podLabels) {
		t.Errorf("NetworkPolicy does not select the gateway's pods")
	}
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if containerPort(c, *p.Port) != port {
				t.Errorf("NetworkPolicy admits port %v, not the gateway's %d", p.Port, port)
			}
		}
	}
}
