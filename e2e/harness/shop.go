package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/fencing"
)

// Shop is a worker's side of the fake providers (package fakes): HTTP
// calls that carry the operation key as the idempotency key (or the fencing
// token, through the gateway). Every scenario's worker, in the test process
// or in a child, talks to the providers through one.
type Shop struct {
	// HTTP sends the calls (nil: http.DefaultClient).
	HTTP *http.Client
	// Merchant, Payments and Gateway are the providers' base URLs.
	Merchant, Payments, Gateway string
	// Account is the Stripe-Account the payments are made under.
	Account string
}

// ProviderError is a provider's refusal (a non-2xx answer).
type ProviderError struct {
	Op      string
	Status  int
	Type    string
	Code    string
	Message string
}

func (e *ProviderError) Error() string {
	return fmt.Sprintf("%s: HTTP %d %s %s: %s", e.Op, e.Status, e.Type, e.Code, e.Message)
}

// HTTPStatus returns the HTTP status of a provider refusal, 0 for any other
// error.
func HTTPStatus(err error) int {
	var pe *ProviderError
	if errors.As(err, &pe) {
		return pe.Status
	}
	return 0
}

// do sends one request and decodes a 2xx answer into out.
func (s *Shop) do(ctx context.Context, op, method, u string, hdr http.Header, body io.Reader, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	hc := s.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s: reading the answer: %w", op, err)
	}
	if resp.StatusCode/100 != 2 {
		var e fakes.APIError
		_ = json.Unmarshal(b, &e)
		return &ProviderError{Op: op, Status: resp.StatusCode, Type: e.Error.Type, Code: e.Error.Code, Message: e.Error.Message}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s: decoding %q: %w", op, b, err)
		}
	}
	return nil
}

// CreateOrder places an order under the idempotency key opKey.
func (s *Shop) CreateOrder(ctx context.Context, opKey string, o fakes.OrderRequest) (fakes.Order, error) {
	body, _ := json.Marshal(o)
	var out fakes.Order
	err := s.do(ctx, "merchant create order", http.MethodPost, s.Merchant+"/orders",
		http.Header{fakes.IdempotencyKeyHeader: {opKey}, "Content-Type": {"application/json"}}, bytes.NewReader(body), &out)
	return out, err
}

// FindOrder asks the merchant for the order under opKey; found is false
// when it has none (a confirmed absence: the merchant keeps every key).
func (s *Shop) FindOrder(ctx context.Context, opKey string) (fakes.Order, bool, error) {
	var out fakes.Order
	err := s.do(ctx, "merchant find order", http.MethodGet, s.Merchant+"/orders?key="+url.QueryEscape(opKey), nil, nil, &out)
	if HTTPStatus(err) == http.StatusNotFound {
		return fakes.Order{}, false, nil
	}
	return out, err == nil, err
}

// Authorize authorizes a payment under the idempotency key opKey.
func (s *Shop) Authorize(ctx context.Context, opKey string, amount int, currency, reference string) (fakes.Authorization, error) {
	form := url.Values{"amount": {strconv.Itoa(amount)}, "currency": {currency}, "reference": {reference}}
	hdr := http.Header{fakes.IdempotencyKeyHeader: {opKey}, "Content-Type": {"application/x-www-form-urlencoded"}}
	if s.Account != "" {
		hdr.Set(fakes.AccountHeader, s.Account)
	}
	var out fakes.Authorization
	err := s.do(ctx, "payments authorize", http.MethodPost, s.Payments+"/v1/payment_intents", hdr, bytes.NewReader([]byte(form.Encode())), &out)
	return out, err
}

// LookupPayment asks the payment provider what it holds under opKey.
func (s *Shop) LookupPayment(ctx context.Context, opKey string) (fakes.IdempotencyRecord, bool, error) {
	hdr := http.Header{}
	if s.Account != "" {
		hdr.Set(fakes.AccountHeader, s.Account)
	}
	var out fakes.IdempotencyRecord
	err := s.do(ctx, "payments lookup", http.MethodGet, s.Payments+"/v1/idempotency_keys?key="+url.QueryEscape(opKey), hdr, nil, &out)
	if HTTPStatus(err) == http.StatusNotFound {
		return fakes.IdempotencyRecord{}, false, nil
	}
	return out, err == nil, err
}

// BookPickup books a courier pickup for intent key through the gateway,
// under token.
func (s *Shop) BookPickup(ctx context.Context, key string, token fencing.Token, p fakes.Pickup) (fakes.Pickup, error) {
	body, _ := json.Marshal(p)
	hdr := http.Header{fakes.IntentKeyHeader: {key}, "Content-Type": {"application/json"}}
	fencing.SetHeader(hdr, token)
	var out fakes.Pickup
	err := s.do(ctx, "gateway book pickup", http.MethodPost, s.Gateway+"/pickups", hdr, bytes.NewReader(body), &out)
	return out, err
}

// Forwarded asks the gateway, under token, which calls it passed on for
// intent key.
func (s *Shop) Forwarded(ctx context.Context, key string, token fencing.Token) ([]fakes.Forwarded, error) {
	hdr := http.Header{}
	fencing.SetHeader(hdr, token)
	var out []fakes.Forwarded
	err := s.do(ctx, "gateway lookup", http.MethodGet, s.Gateway+"/pickups?intent="+url.QueryEscape(key), hdr, nil, &out)
	if HTTPStatus(err) == http.StatusNotFound {
		return nil, nil
	}
	return out, err
}
