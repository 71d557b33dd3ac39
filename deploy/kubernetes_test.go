package deploy

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// manifests is a rendered kustomization, every object strictly decoded
// into its Kubernetes API type.
type manifests struct {
	namespaces      []corev1.Namespace
	serviceAccounts []corev1.ServiceAccount
	deployments     []appsv1.Deployment
	statefulSets    []appsv1.StatefulSet
	services        []corev1.Service
	pdbs            []policyv1.PodDisruptionBudget
	networkPolicies []networkingv1.NetworkPolicy
	ingresses       []networkingv1.Ingress
	serviceMonitors []monitoringv1.ServiceMonitor
}

// render builds dir with kustomize's Go API, as `kubectl kustomize` does,
// and decodes every object strictly: an unknown field or a wrong type fails.
func render(t *testing.T, dir string) *manifests {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	m := &manifests{}
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		gvk := r.GetGvk()
		kind := gvk.ApiVersion() + "/" + gvk.Kind
		var target any
		switch kind {
		case "v1/Namespace":
			target = appendTo(&m.namespaces)
		case "v1/ServiceAccount":
			target = appendTo(&m.serviceAccounts)
		case "apps/v1/Deployment":
			target = appendTo(&m.deployments)
		case "apps/v1/StatefulSet":
			target = appendTo(&m.statefulSets)
		case "v1/Service":
			target = appendTo(&m.services)
		case "policy/v1/PodDisruptionBudget":
			target = appendTo(&m.pdbs)
		case "networking.k8s.io/v1/NetworkPolicy":
			target = appendTo(&m.networkPolicies)
		case "networking.k8s.io/v1/Ingress":
			target = appendTo(&m.ingresses)
		case "monitoring.coreos.com/v1/ServiceMonitor":
			target = appendTo(&m.serviceMonitors)
		default:
			t.Errorf("%s %s: a kind this test does not decode", kind, r.GetName())
			continue
		}
		if err := yaml.UnmarshalStrict(b, target); err != nil {
			t.Errorf("%s %s does not decode strictly: %v", kind, r.GetName(), err)
		}
	}
	return m
}

// appendTo appends a zero T to *list and returns a pointer to it.
func appendTo[T any](list *[]T) *T {
	*list = append(*list, *new(T))
	return &(*list)[len(*list)-1]
}

func byName[T any](t *testing.T, list []T, name string, meta func(*T) metav1.ObjectMeta) *T {
	t.Helper()
	for i := range list {
		if meta(&list[i]).Name == name {
			return &list[i]
		}
	}
	t.Fatalf("no %T named %q", *new(T), name)
	return nil
}

const overlay = "kubernetes/overlays/production"

// Both the base and the overlay render, and every object decodes strictly.
func TestKubernetesManifestsDecodeStrictly(t *testing.T) {
	for _, dir := range []string{"kubernetes/base", overlay} {
		t.Run(dir, func(t *testing.T) {
			m := render(t, dir)
			if len(m.deployments) != 1 || len(m.statefulSets) != 1 || len(m.serviceMonitors) != 1 {
				t.Errorf("%d Deployments, %d StatefulSets, %d ServiceMonitors; want one of each", len(m.deployments), len(m.statefulSets), len(m.serviceMonitors))
			}
		})
	}
}

// A strict decode is what catches a misspelled field: the test's decoder
// must refuse one (and a wrong type), or the test above proves nothing.
func TestStrictDecodingRefusesUnknownFieldsAndWrongTypes(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown field": "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n",
		"wrong type":    "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: two\n",
	} {
		var d appsv1.Deployment
		if err := yaml.UnmarshalStrict([]byte(doc), &d); err == nil {
			t.Errorf("%s: decoded without error", name)
		}
	}
}

// intentdContainer is the production Deployment's intentd container.
func intentdContainer(t *testing.T, m *manifests) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	d := byName(t, m.deployments, "intentd", func(d *appsv1.Deployment) metav1.ObjectMeta { return d.ObjectMeta })
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == "intentd" {
			return d, c
		}
	}
	t.Fatal("Deployment intentd has no container intentd")
	return nil, nil
}

// containerPort resolves a probe's or a Service's port (a number or a
// name) to one of c's ports; 0 when c has none such.
func containerPort(c *corev1.Container, p intstr.IntOrString) int32 {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort
		}
	}
	return 0
}

// argPort is the port of the address flag --name in args.
func argPort(t *testing.T, args []string, name string) int32 {
	t.Helper()
	addr, ok := flagValue(args, name)
	if !ok {
		t.Fatalf("intentd's args %q set no --%s", args, name)
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("--%s %q: %v", name, addr, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("--%s %q: %v", name, addr, err)
	}
	return int32(n)
}

// The probes hit paths intentd serves (checked against a running intentd)
// on the port its args give the metrics listener, which the container
// declares; liveness never depends on etcd.
func TestKubernetesProbesPointAtIntentdsHTTPEndpoints(t *testing.T) {
	_, c := intentdContainer(t, render(t, overlay))
	metrics := argPort(t, c.Args, "metrics-listen")
	grpc := argPort(t, c.Args, "listen")
	served := servedPaths(t)
	for _, tc := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{
		{"startup", c.StartupProbe, "/healthz"},
		{"liveness", c.LivenessProbe, "/healthz"},
		{"readiness", c.ReadinessProbe, "/readyz"},
	} {
		if tc.probe == nil || tc.probe.HTTPGet == nil {
			t.Errorf("%s probe %+v, want an httpGet", tc.name, tc.probe)
			continue
		}
		g := tc.probe.HTTPGet
		if g.Path != tc.path {
			t.Errorf("%s probe GETs %s, want %s", tc.name, g.Path, tc.path)
		}
		if !served[g.Path] {
			t.Errorf("%s probe GETs %s, which a running intentd does not answer with 200 (served: %v)", tc.name, g.Path, served)
		}
		if got := containerPort(c, g.Port); got != metrics {
			t.Errorf("%s probe port %s is container port %d, want %d (--metrics-listen)", tc.name, g.Port.String(), got, metrics)
		}
	}
	if got := containerPort(c, intstr.FromString("grpc")); got != grpc {
		t.Errorf("container port grpc is %d, want %d (--listen)", got, grpc)
	}
}

// Replicas are spread, resourced, non-root, and a budget keeps one serving.
func TestKubernetesIntentdIsSpreadResourcedAndBudgeted(t *testing.T) {
	m := render(t, overlay)
	d, c := intentdContainer(t, m)
	pod := labels.Set(d.Spec.Template.Labels)
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want at least 2", d.Spec.Replicas)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v, want cpu and memory requests and a memory limit", c.Resources)
	}
	aff := d.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution) == 0 {
		t.Fatalf("affinity %+v, want a required pod anti-affinity in production", aff)
	}
	for _, term := range aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		if !selects(t, term.LabelSelector, pod) || term.TopologyKey != "kubernetes.io/hostname" {
			t.Errorf("anti-affinity term %+v does not keep replicas off each other's node", term)
		}
	}
	sc := d.Spec.Template.Spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v, want runAsNonRoot and a non-zero runAsUser", sc)
	}
	pdb := byName(t, m.pdbs, "intentd", func(p *policyv1.PodDisruptionBudget) metav1.ObjectMeta { return p.ObjectMeta })
	if !selects(t, pdb.Spec.Selector, pod) || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() < 1 {
		t.Errorf("PodDisruptionBudget %+v, want minAvailable ≥ 1 over intentd's pods", pdb.Spec)
	}
}

// TLS and the tokens file are mounted Secrets (whole directories: the
// kubelet updates them, and intentd reloads them), and intentd reaches
// every etcd member by its stable name.
func TestKubernetesIntentdCredentialsAndEtcd(t *testing.T) {
	m := render(t, overlay)
	d, c := intentdContainer(t, m)
	volumes := map[string]corev1.Volume{}
	for _, v := range d.Spec.Template.Spec.Volumes {
		volumes[v.Name] = v
	}
	for _, flag := range []string{"tls-cert", "tls-key", "tls-client-ca", "tokens-file"} {
		path, ok := flagValue(c.Args, flag)
		if !ok {
			t.Errorf("no --%s", flag)
			continue
		}
		var found bool
		for _, vm := range c.VolumeMounts {
			if !strings.HasPrefix(path, strings.TrimSuffix(vm.MountPath, "/")+"/") {
				continue
			}
			found = true
			if volumes[vm.Name].Secret == nil {
				t.Errorf("--%s=%s is on volume %s, which is no Secret", flag, path, vm.Name)
			}
			if vm.SubPath != "" {
				t.Errorf("--%s: volume %s mounted with subPath, whose files never update", flag, vm.Name)
			}
		}
		if !found {
			t.Errorf("--%s=%s is on no mounted volume", flag, path)
		}
	}

	etcd := byName(t, m.statefulSets, "etcd", func(s *appsv1.StatefulSet) metav1.ObjectMeta { return s.ObjectMeta })
	svc := byName(t, m.services, etcd.Spec.ServiceName, func(s *corev1.Service) metav1.ObjectMeta { return s.ObjectMeta })
	if svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("etcd's Service %s is not headless (clusterIP %q)", svc.Name, svc.Spec.ClusterIP)
	}
	var want []string
	for i := range *etcd.Spec.Replicas {
		want = append(want, fmt.Sprintf("http://%s-%d.%s:2379", etcd.Name, i, svc.Name))
	}
	got, _ := flagValue(c.Args, "etcd-endpoints")
	if !slices.Equal(strings.Split(got, ","), want) || len(want) != 3 {
		t.Errorf("--etcd-endpoints %q, want the %d members %q", got, len(want), want)
	}
}

// Only labelled client namespaces reach intentd's gRPC port; only intentd's
// pods reach etcd's client port.
func TestKubernetesNetworkPolicies(t *testing.T) {
	m := render(t, overlay)
	d, _ := intentdContainer(t, m)
	intentdPods := labels.Set(d.Spec.Template.Labels)
	etcd := byName(t, m.statefulSets, "etcd", func(s *appsv1.StatefulSet) metav1.ObjectMeta { return s.ObjectMeta })
	etcdPods := labels.Set(etcd.Spec.Template.Labels)

	np := byName(t, m.networkPolicies, "intentd", func(n *networkingv1.NetworkPolicy) metav1.ObjectMeta { return n.ObjectMeta })
	if !selects(t, &np.Spec.PodSelector, intentdPods) {
		t.Fatalf("NetworkPolicy intentd does not select intentd's pods")
	}
	for _, rule := range np.Spec.Ingress {
		if !hasPort(rule.Ports, "grpc") {
			continue
		}
		for _, peer := range rule.From {
			if peer.NamespaceSelector == nil || len(peer.NamespaceSelector.MatchLabels)+len(peer.NamespaceSelector.MatchExpressions) == 0 || peer.IPBlock != nil {
				t.Errorf("gRPC is open to %+v, want only namespaces chosen by label", peer)
			}
		}
		if len(rule.From) == 0 {
			t.Errorf("gRPC ingress rule has no from: open to everyone")
		}
	}

	enp := byName(t, m.networkPolicies, "etcd", func(n *networkingv1.NetworkPolicy) metav1.ObjectMeta { return n.ObjectMeta })
	if !selects(t, &enp.Spec.PodSelector, etcdPods) {
		t.Fatalf("NetworkPolicy etcd does not select etcd's pods")
	}
	var clientRules int
	for _, rule := range enp.Spec.Ingress {
		if len(rule.Ports) == 0 || len(rule.From) == 0 {
			t.Errorf("etcd ingress rule %+v admits every port or every peer", rule)
			continue
		}
		for _, peer := range rule.From {
			switch {
			case peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil:
				t.Errorf("etcd admits %+v, want pods of its own namespace only", peer)
			case hasPort(rule.Ports, "client") && !selects(t, peer.PodSelector, intentdPods):
				t.Errorf("etcd's client port admits pods %v, want intentd's only", peer.PodSelector.MatchLabels)
			case hasPort(rule.Ports, "peer") && !selects(t, peer.PodSelector, etcdPods):
				t.Errorf("etcd's peer port admits pods %v, want etcd's only", peer.PodSelector.MatchLabels)
			}
		}
		if hasPort(rule.Ports, "client") {
			clientRules++
		}
	}
	if clientRules == 0 {
		t.Errorf("etcd's NetworkPolicy admits nobody to its client port: intentd cannot reach it")
	}
}

// The ServiceMonitor scrapes /metrics on the Service port that leads to the
// metrics listener, with the job label the alert rules select.
func TestKubernetesServiceMonitorScrapesTheMetricsPort(t *testing.T) {
	m := render(t, overlay)
	d, c := intentdContainer(t, m)
	sm := m.serviceMonitors[0]
	svc := byName(t, m.services, "intentd", func(s *corev1.Service) metav1.ObjectMeta { return s.ObjectMeta })
	if !selects(t, &sm.Spec.Selector, labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor selector %v does not select Service intentd %v", sm.Spec.Selector.MatchLabels, svc.Labels)
	}
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Service intentd selector %v does not select intentd's pods", svc.Spec.Selector)
	}
	if job := svc.Labels[sm.Spec.JobLabel]; job != "intentd" {
		t.Errorf("ServiceMonitor jobLabel %q gives job %q, want intentd (the alert rules select job=\"intentd\")", sm.Spec.JobLabel, job)
	}
	metrics := argPort(t, c.Args, "metrics-listen")
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints %+v, want one", sm.Spec.Endpoints)
	}
	ep := sm.Spec.Endpoints[0]
	var port *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if ep.Port != "" && svc.Spec.Ports[i].Name == ep.Port {
			port = &svc.Spec.Ports[i]
		}
	}
	if port == nil || containerPort(c, port.TargetPort) != metrics {
		t.Errorf("ServiceMonitor port %v does not lead to container port %d (--metrics-listen)", ep.Port, metrics)
	}
	if ep.Path != "/metrics" || !servedPaths(t)[ep.Path] {
		t.Errorf("ServiceMonitor path %q, want /metrics", ep.Path)
	}
}

func selects(t *testing.T, sel *metav1.LabelSelector, set labels.Set) bool {
	t.Helper()
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("selector %v: %v", sel, err)
		return false
	}
	return !s.Empty() && s.Matches(set)
}

func hasPort(ports []networkingv1.NetworkPolicyPort, name string) bool {
	for _, p := range ports {
		if p.Port != nil && p.Port.Type == intstr.String && p.Port.StrVal == name {
			return true
		}
	}
	return false
}

// Every flag the deployment files give intentd is one it has: a misspelled
// flag would stop every replica at start (exit 2).
func TestDeployedIntentdFlagsExist(t *testing.T) {
	known := intentdFlags(t)
	if len(known) < 20 {
		t.Fatalf("intentd --help listed %d flags: %v", len(known), known)
	}
	_, c := intentdContainer(t, render(t, overlay))
	args := map[string][]string{"kubernetes " + overlay: c.Args}
	p := project(t)
	for _, name := range []string{"intentd-0", "intentd-1"} {
		s, _ := p.GetService(name)
		args["compose "+name] = s.Command
	}
	for where, list := range args {
		for _, a := range list {
			name, ok := strings.CutPrefix(a, "--")
			if !ok {
				continue
			}
			name, _, _ = strings.Cut(name, "=")
			if !known[name] {
				t.Errorf("%s: --%s is no flag of intentd", where, name)
			}
		}
	}
}
