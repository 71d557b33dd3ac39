package gateway_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/intentd/intentd/gateway"
)

func parse(t *testing.T, y string) (map[string]*gateway.Upstream, error) {
	t.Helper()
	j, err := yaml.YAMLToJSON([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return gateway.ParseUpstreams(json.RawMessage(j))
}

// A bad upstreams key stops the gateway at start, naming the key.
func TestBadUpstreamsNameTheKey(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, key, says string
	}{
		{"not a mapping", `[a, b]`, "upstreams", "mapping"},
		{"empty", `{}`, "upstreams", "names no upstream"},
		{"a bad name", "Courier_1:\n  url: http://c", "upstreams.Courier_1", "a-z"},
		{"no url", "courier:\n  timeout: 1s", "upstreams.courier.url", "required"},
		{"an unknown key", "courier:\n  url: http://c\n  timout: 1s", "upstreams.courier.timout", "unknown key"},
		{"a url with a query", "courier:\n  url: http://c/?a=1", "upstreams.courier.url", "no user info, query"},
		{"a url with credentials", "courier:\n  url: http://u:p@c", "upstreams.courier.url", "no user info"},
		{"not http", "courier:\n  url: ftp://c", "upstreams.courier.url", "http://"},
		{"a bad timeout", "courier:\n  url: http://c\n  timeout: soon", "upstreams.courier.timeout", "no duration"},
		{"a timeout too long", "courier:\n  url: http://c\n  timeout: 11m", "upstreams.courier.timeout", "outside"},
		{"a number as text", "courier:\n  url: http://c\n  max-request-bytes: lots", "upstreams.courier.max-request-bytes", "whole number"},
		{"too much kept", "courier:\n  url: http://c\n  keep-response-bytes: 70000", "upstreams.courier.keep-response-bytes", "outside"},
		{"a 2xx refusal", "courier:\n  url: http://c\n  refusal-statuses: [200]", "upstreams.courier.refusal-statuses[0]", "no refusal"},
		{"a hop-by-hop idempotency header", "courier:\n  url: http://c\n  idempotency-header: Connection", "upstreams.courier.idempotency-header", "gateway's to set"},
		{"setting an Intentd header", "courier:\n  url: http://c\n  set-headers: {Intentd-Key: x}", "upstreams.courier.set-headers.Intentd-Key", "gateway's to set"},
		{"a lookup without a path", "courier:\n  url: http://c\n  lookup: {method: GET}", "upstreams.courier.lookup.path", "required"},
		{"a lookup's unknown placeholder", "courier:\n  url: http://c\n  lookup: {path: '/o?r={order}'}", "upstreams.courier.lookup.path", "{order} is no placeholder"},
		{"a lookup's method", "courier:\n  url: http://c\n  lookup: {path: /o, method: DELETE}", "upstreams.courier.lookup.method", "GET, HEAD or POST"},
		{"found and absent the same", "courier:\n  url: http://c\n  lookup: {path: /o, found: [200], absent: [200]}", "upstreams.courier.lookup.absent[0]", "not also in found"},
		{"a bad kept header", "courier:\n  url: http://c\n  keep-headers: ['Bad Header']", "upstreams.courier.keep-headers[0]", "no header name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.yaml)
			var ce *gateway.ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v, want a *gateway.ConfigError", err)
			}
			if ce.Key != tc.key || !strings.Contains(ce.Reason, tc.says) {
				t.Errorf("error %q, want key %q saying %q", err, tc.key, tc.says)
			}
		})
	}
}

// A good config, with its defaults filled in.
func TestUpstreamsDefaults(t *testing.T) {
	ups, err := parse(t, `
courier:
  url: https://api.courier.example/v2/
  idempotency-header: idempotency-key
  lookup:
    path: /pickups?reference={operation_key}
merchant:
  url: http://127.0.0.1:9001
  timeout: 3s
  keep-response-bytes: 0
  keep-headers: []
  refusal-statuses: [400, 422]
  set-headers: {x-api-key: k1}
`)
	if err != nil {
		t.Fatal(err)
	}
	c, m := ups["courier"], ups["merchant"]
	if c.Timeout != gateway.DefaultTimeout || c.KeepResponseBytes != 64<<10 || c.MaxRequestBytes != gateway.DefaultMaxRequestBytes ||
		c.IdempotencyHeader != "Idempotency-Key" || c.URL.Path != "/v2" || c.Lookup.Method != "GET" || c.Lookup.Found[0] != 200 || c.Lookup.Absent[0] != 404 {
		t.Errorf("courier %+v lookup %+v", c, c.Lookup)
	}
	if len(c.KeepHeaders) == 0 || c.KeepHeaders[0] != "Content-Type" {
		t.Errorf("courier keeps %v, want the default headers", c.KeepHeaders)
	}
	if m.Timeout != 3*time.Second || m.KeepResponseBytes != 0 || len(m.KeepHeaders) != 0 || m.SetHeaders["X-Api-Key"] != "k1" || m.Lookup != nil {
		t.Errorf("merchant %+v", m)
	}
}
