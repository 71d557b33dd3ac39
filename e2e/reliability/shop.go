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

	"github.com/intentd/intentd/e2e/fakes"
)

// ErrNoOrder is a confirmed absence: the merchant has no order under the key.
var ErrNoOrder = errors.New("reliability: merchant has no order under this key")

// Shop is a worker's side of the merchant.
type Shop struct {
	HTTP *http.Client
	URL  string
}

// Place places the order for reference under the idempotency key key.
func (s *Shop) Place(ctx context.Context, key, reference string) (fakes.Order, error) {
	body, _ := json.Marshal(map[string]string{"reference": reference})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/orders", bytes.NewReader(body))
	if err != nil {
		return fakes.Order{}, err
	}
	req.Header.Set(fakes.IdempotencyKeyHeader, key)
	req.Header.Set("Content-Type", "application/json")
	return s.do(req)
}

// Find asks for the order under key; ErrNoOrder when there is none.
func (s *Shop) Find(ctx context.Context, key string) (fakes.Order, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/orders?key="+url.QueryEscape(key), nil)
	if err != nil {
		return fakes.Order{}, err
	}
	return s.do(req)
}

func (s *Shop) do(req *http.Request) (fakes.Order, error) {
	resp, err := s.HTTP.Do(req)
	if err != nil {
		return fakes.Order{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fakes.Order{}, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound && req.Method == http.MethodGet:
		return fakes.Order{}, ErrNoOrder
	case resp.StatusCode/100 != 2:
		return fakes.Order{}, fmt.Errorf("reliability: merchant: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	var o fakes.Order
	if err := json.Unmarshal(b, &o); err != nil {
		return fakes.Order{}, fmt.Errorf("reliability: merchant: %w", err)
	}
	return o, nil
}
