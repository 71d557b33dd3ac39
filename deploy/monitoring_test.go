package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func alertRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.ParseFile("monitoring/alerts.yaml", false, model.UTF8Validation, parser.NewParser(parser.Options{}), nil)
	for _, err := range errs {
		t.Errorf("monitoring/alerts.yaml: %v", err)
	}
	if groups == nil || len(groups.Groups) == 0 {
		t.Fatal("monitoring/alerts.yaml has no rule groups")
	}
	return groups
}

// runbookAnchors are the anchors GitHub makes of RUNBOOK.md's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("RUNBOOK.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	drop := regexp.MustCompile(`[^a-z0-9 _-]`)
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "#"); ok {
			h = strings.TrimSpace(strings.TrimLeft(h, "#"))
			anchors[strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(h), ""), " ", "-")] = true
		}
	}
	return anchors
}

// Every alert parses as Prometheus loads it, has a severity, a summary and a
// runbook_url whose section exists in RUNBOOK.md.
func TestAlertRulesParseAndPointAtTheRunbook(t *testing.T) {
	anchors := runbookAnchors(t)
	severities := map[string]bool{"critical": true, "warning": true, "info": true}
	for _, g := range alertRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if !severities[r.Labels["severity"]] {
				t.Errorf("%s: severity %q, want critical, warning or info", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
			url := r.Annotations["runbook_url"]
			_, anchor, _ := strings.Cut(url, "deploy/RUNBOOK.md#")
			if anchor == "" || !anchors[anchor] {
				t.Errorf("%s: runbook_url %q names no section of deploy/RUNBOOK.md", r.Alert, url)
			}
		}
	}
}

// An alert on a metric intentd does not export never fires: every series an
// expression selects is one intentd serves (or one Prometheus makes).
func TestAlertRulesNameOnlyExportedMetrics(t *testing.T) {
	groups := alertRules(t)
	names := exportedMetrics(t)
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			used, err := metricNames(r.Expr)
			if err != nil {
				t.Errorf("%s%s: %v", r.Alert, r.Record, err)
				continue
			}
			if len(used) == 0 {
				t.Errorf("%s%s: expression selects no metric", r.Alert, r.Record)
			}
			for _, n := range used {
				if !names[n] && !prometheusSeries[n] {
					t.Errorf("%s%s: %s is no metric intentd exports", r.Alert, r.Record, n)
				}
			}
		}
	}
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query string `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// The dashboard's panels query only metrics intentd exports, through the
// data source variable (so it imports into any Grafana), and its replica
// variable reads a label that exists.
func TestDashboardNamesOnlyExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("monitoring/dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard: title %q, uid %q, %d panels; want all three", d.Title, d.UID, len(d.Panels))
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" {
			used, err := metricNames(strings.TrimSuffix(strings.TrimPrefix(v.Query, "label_values("), ", instance)"))
			if err != nil || !slices.Contains(used, "up") {
				t.Errorf("variable %s: query %q, want label_values over up{job=\"intentd\"} (%v)", v.Name, v.Query, err)
			}
		}
	}
	if vars["datasource"] != "datasource" {
		t.Errorf("dashboard variables %v, want a datasource variable named datasource", vars)
	}
	names := exportedMetrics(t)
	for _, p := range d.Panels {
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: data source %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			used, err := metricNames(q.Expr)
			if err != nil {
				t.Errorf("panel %q: %q: %v", p.Title, q.Expr, err)
				continue
			}
			for _, n := range used {
				if !names[n] && !prometheusSeries[n] {
					t.Errorf("panel %q: %s is no metric intentd exports", p.Title, n)
				}
			}
		}
	}
}
