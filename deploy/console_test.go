package deploy

import (
	"net"
	"net/http"
	"slices"
	"strconv"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// A running intentd given --console-listen, as the deployment files give
// it, serves the console there and nothing else: no /metrics, no health
// endpoints; and no console on the metrics listener beside it.
func TestConsoleListenerServesTheConsoleAlone(t *testing.T) {
	console, beside := consoleAnswers(t)
	for _, tc := range []struct {
		path   string
		served bool
	}{
		{"/", true}, {"/console/", true}, {"/console/signin", true},
		{"/metrics", false}, {"/healthz", false}, {"/readyz", false},
	} {
		code := console[tc.path]
		if got := code > 0 && code < 400; got != tc.served {
			t.Errorf("the console listener answers GET %s with %d; want served %v", tc.path, code, tc.served)
		}
	}
	if code := beside["/console/"]; code != http.StatusNotFound {
		t.Errorf("the metrics listener beside --console-listen answers GET /console/ with %d, want 404", code)
	}
}

// The console reaches the outside only through its own Service and a TLS
// Ingress, and the NetworkPolicy admits the ingress controller's namespace
// to the console's port and to no other; the console's Service is not
// scraped.
func TestKubernetesConsoleBehindTLSIngress(t *testing.T) {
	m := render(t, overlay)
	d, c := intentdContainer(t, m)
	pods := labels.Set(d.Spec.Template.Labels)
	consolePort := argPort(t, c.Args, "console-listen")
	if got := containerPort(c, intstr.FromString("console")); got != consolePort {
		t.Errorf("container port console is %d, want %d (--console-listen)", got, consolePort)
	}
	if consolePort == argPort(t, c.Args, "metrics-listen") || consolePort == argPort(t, c.Args, "listen") {
		t.Errorf("--console-listen shares its port %d with another listener", consolePort)
	}

	svc := byName(t, m.services, "intentd-console", func(s *corev1.Service) metav1.ObjectMeta { return s.ObjectMeta })
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, pods) {
		t.Errorf("Service intentd-console selector %v does not select intentd's pods", svc.Spec.Selector)
	}
	if len(svc.Spec.Ports) == 0 {
		t.Fatalf("Service intentd-console has no port")
	}
	for _, p := range svc.Spec.Ports {
		if containerPort(c, p.TargetPort) != consolePort {
			t.Errorf("Service intentd-console port %s leads to container port %d, want the console's %d only", p.Name, containerPort(c, p.TargetPort), consolePort)
		}
	}
	for _, sm := range m.serviceMonitors {
		if selects(t, &sm.Spec.Selector, labels.Set(svc.Labels)) {
			t.Errorf("ServiceMonitor %s selects Service intentd-console, which has no metrics port", sm.Name)
		}
	}

	if len(m.ingresses) != 1 {
		t.Fatalf("%d Ingresses, want the console's", len(m.ingresses))
	}
	ing := m.ingresses[0]
	tlsHosts := map[string]bool{}
	for _, tls := range ing.Spec.TLS {
		if tls.SecretName == "" {
			t.Errorf("Ingress %s: TLS entry for %v names no Secret", ing.Name, tls.Hosts)
		}
		for _, h := range tls.Hosts {
			tlsHosts[h] = true
		}
	}
	if len(ing.Spec.Rules) == 0 || ing.Spec.DefaultBackend != nil {
		t.Errorf("Ingress %s: rules %d, default backend %v; want host rules only", ing.Name, len(ing.Spec.Rules), ing.Spec.DefaultBackend)
	}
	for _, rule := range ing.Spec.Rules {
		if rule.Host == "" || !tlsHosts[rule.Host] {
			t.Errorf("Ingress %s: host %q is not served with TLS (TLS hosts %v)", ing.Name, rule.Host, tlsHosts)
		}
		if rule.HTTP == nil || len(rule.HTTP.Paths) == 0 {
			t.Errorf("Ingress %s: host %q has no paths", ing.Name, rule.Host)
			continue
		}
		for _, p := range rule.HTTP.Paths {
			b := p.Backend.Service
			if b == nil || b.Name != svc.Name {
				t.Errorf("Ingress %s: path %s goes to %+v, want Service %s", ing.Name, p.Path, p.Backend, svc.Name)
				continue
			}
			var found bool
			for _, sp := range svc.Spec.Ports {
				if (b.Port.Name != "" && sp.Name == b.Port.Name) || (b.Port.Number != 0 && sp.Port == b.Port.Number) {
					found = true
				}
			}
			if !found {
				t.Errorf("Ingress %s: path %s goes to port %+v, which Service %s does not have", ing.Name, p.Path, b.Port, svc.Name)
			}
		}
	}

	np := byName(t, m.networkPolicies, "intentd", func(n *networkingv1.NetworkPolicy) metav1.ObjectMeta { return n.ObjectMeta })
	var consoleRules int
	consolePeers := map[string]bool{}
	for _, rule := range np.Spec.Ingress {
		if !hasPort(rule.Ports, "console") {
			continue
		}
		consoleRules++
		if len(rule.Ports) != 1 {
			t.Errorf("the console's ingress rule admits ports %v too, want the console's only", rule.Ports)
		}
		if len(rule.From) == 0 {
			t.Errorf("the console's ingress rule has no from: open to everyone")
		}
		for _, peer := range rule.From {
			if peer.NamespaceSelector == nil || len(peer.NamespaceSelector.MatchLabels) == 0 || peer.IPBlock != nil {
				t.Errorf("the console is open to %+v, want only namespaces chosen by label (the ingress controller's)", peer)
				continue
			}
			consolePeers[labels.Set(peer.NamespaceSelector.MatchLabels).String()] = true
		}
	}
	if consoleRules == 0 {
		t.Errorf("NetworkPolicy intentd admits nobody to the console's port: the Ingress cannot reach it")
	}
	for _, rule := range np.Spec.Ingress {
		if hasPort(rule.Ports, "console") {
			continue
		}
		for _, peer := range rule.From {
			if peer.NamespaceSelector != nil && consolePeers[labels.Set(peer.NamespaceSelector.MatchLabels).String()] {
				t.Errorf("the ingress controller's namespace %v is admitted to %v too", peer.NamespaceSelector.MatchLabels, rule.Ports)
			}
		}
	}
}

// Compose publishes each replica's console on loopback only (its listener
// is plaintext), on a host port of its own, and never the metrics port.
func TestComposePublishesTheConsoleOnLoopback(t *testing.T) {
	p := project(t)
	var published []string
	for _, name := range []string{"intentd-0", "intentd-1"} {
		s, err := p.GetService(name)
		if err != nil {
			t.Fatal(err)
		}
		addr, ok := flagValue(s.Command, "console-listen")
		if !ok {
			t.Errorf("%s: no --console-listen", name)
			continue
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatalf("%s: --console-listen %q: %v", name, addr, err)
		}
		if host != "0.0.0.0" {
			t.Errorf("%s: --console-listen %q: the published port cannot reach it inside the container", name, addr)
		}
		var console *types.ServicePortConfig
		for i, sp := range s.Ports {
			switch strconv.Itoa(int(sp.Target)) {
			case port:
				console = &s.Ports[i]
			case metricsPort(t, s.Command):
				t.Errorf("%s publishes the metrics port %d", name, sp.Target)
			}
		}
		if console == nil {
			t.Errorf("%s: the console's port %s is not published (ports %+v)", name, port, s.Ports)
			continue
		}
		if console.HostIP != "127.0.0.1" || console.Published == "" {
			t.Errorf("%s: the console is published on %q:%q, want loopback (127.0.0.1) and a port", name, console.HostIP, console.Published)
		}
		if slices.Contains(published, console.Published) {
			t.Errorf("%s: host port %s is another replica's", name, console.Published)
		}
		published = append(published, console.Published)
	}
}
