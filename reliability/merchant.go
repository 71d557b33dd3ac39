package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
)

// IdempotencyKeyHeader carries the operation key to the Merchant.
const IdempotencyKeyHeader = "Idempotency-Key"

// Order is one order the Merchant holds: its effect in the world.
type Order struct {
	ID        string `json:"id"`
	Key       string `json:"idempotency_key"`
	Reference string `json:"reference"`
}

// Merchant is an effect-counting shop that deduplicates orders on the
// Idempotency-Key header, as a well-behaved provider does, and keeps every
// key forever, so that "no order under this key" is a confirmed absence.
//
//	POST /orders        Idempotency-Key required; body {"reference": R}.
//	                    201 + Order when created, 200 + the same Order for a
//	                    known key, 422 for a known key with another reference.
//	GET  /orders?key=K  200 + the Order of key K, or 404.
//
// The reference is the intent key: Duplicates counts orders placed twice
// for one intent under any keys, which is what a second execution would do.
type Merchant struct {
	mu       sync.Mutex
	byKey    map[string]*Order
	orders   []*Order
	requests int
}

// NewMerchant returns a merchant with no orders.
func NewMerchant() *Merchant { return &Merchant{byKey: map[string]*Order{}} }

// ServeHTTP implements the API above.
func (m *Merchant) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/orders":
		key := r.Header.Get(IdempotencyKeyHeader)
		var body struct {
			Reference string `json:"reference"`
		}
		if key == "" || json.NewDecoder(r.Body).Decode(&body) != nil || body.Reference == "" {
			http.Error(w, "an Idempotency-Key and a reference are required", http.StatusBadRequest)
			return
		}
		o, status := m.create(key, body.Reference)
		writeOrder(w, status, o)
	case r.Method == http.MethodGet && r.URL.Path == "/orders":
		m.mu.Lock()
		o, ok := m.byKey[r.URL.Query().Get("key")]
		var cp Order
		if ok {
			cp = *o
		}
		m.mu.Unlock()
		if !ok {
			http.Error(w, "no order under this key", http.StatusNotFound)
			return
		}
		writeOrder(w, http.StatusOK, &cp)
	default:
		http.NotFound(w, r)
	}
}

func writeOrder(w http.ResponseWriter, status int, o *Order) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if o != nil {
		_ = json.NewEncoder(w).Encode(o)
	}
}

// create places the order for key, or finds the one placed before.
func (m *Merchant) create(key, reference string) (*Order, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests++
	if o, ok := m.byKey[key]; ok {
		if o.Reference != reference {
			return nil, http.StatusUnprocessableEntity
		}
		cp := *o
		return &cp, http.StatusOK
	}
	o := &Order{ID: fmt.Sprintf("SO-%06d", len(m.orders)+1), Key: key, Reference: reference}
	m.byKey[key] = o
	m.orders = append(m.orders, o)
	cp := *o
	return &cp, http.StatusCreated
}

// Count is the number of orders created: the merchant's effects.
func (m *Merchant) Count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.orders)
}

// Requests is the number of POST /orders, replays included.
func (m *Merchant) Requests() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.requests
}

// ByReference returns every order of each reference, oldest first.
func (m *Merchant) ByReference() map[string][]Order {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]Order{}
	for _, o := range m.orders {
		out[o.Reference] = append(out[o.Reference], *o)
	}
	return out
}

// Duplicates counts orders beyond the first for each reference.
func (m *Merchant) Duplicates() int {
	n := 0
	for _, os := range m.ByReference() {
		n += len(os) - 1
	}
	return n
}

// ErrNoOrder is a confirmed absence: the merchant has no order under the key.
var ErrNoOrder = errors.New("reliability: merchant has no order under this key")

// Shop is a worker's side of the Merchant.
type Shop struct {
	HTTP *http.Client
	URL  string
}

// Place places the order for reference under the idempotency key key.
func (s *Shop) Place(ctx context.Context, key, reference string) (Order, error) {
	body, _ := json.Marshal(map[string]string{"reference": reference})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/orders", bytes.NewReader(body))
	if err != nil {
		return Order{}, err
	}
	req.Header.Set(IdempotencyKeyHeader, key)
	req.Header.Set("Content-Type", "application/json")
	return s.do(req)
}

// Find asks for the order under key; ErrNoOrder when there is none.
func (s *Shop) Find(ctx context.Context, key string) (Order, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/orders?key="+url.QueryEscape(key), nil)
	if err != nil {
		return Order{}, err
	}
	return s.do(req)
}

func (s *Shop) do(req *http.Request) (Order, error) {
	resp, err := s.HTTP.Do(req)
	if err != nil {
		return Order{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return Order{}, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && req.Method == http.MethodGet:
		return Order{}, ErrNoOrder
	case resp.StatusCode/100 != 2:
		return Order{}, fmt.Errorf("reliability: merchant: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var o Order
	if err := json.Unmarshal(b, &o); err != nil {
		return Order{}, fmt.Errorf("reliability: merchant: %w", err)
	}
	return o, nil
}
