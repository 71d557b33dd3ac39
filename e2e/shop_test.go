package e2e

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

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/fencing"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// shop is a worker's side of the providers: HTTP calls that carry the
// operation key as the idempotency key (or the fencing token, through the
// gateway). Every scenario's worker, in the test process or in a child,
// talks to the providers through one.
type shop struct {
	http     *http.Client
	merchant string // base URLs
	payments string
	gateway  string
	account  string // the Stripe-Account the payments are made under
}

// providerError is a provider's refusal (a non-2xx answer).
type providerError struct {
	Op      string
	Status  int
	Type    string
	Code    string
	Message string
}

func (e *providerError) Error() string {
	return fmt.Sprintf("%s: HTTP %d %s %s: %s", e.Op, e.Status, e.Type, e.Code, e.Message)
}

// httpStatus returns the HTTP status of a provider refusal, 0 for any other
// error.
func httpStatus(err error) int {
	var pe *providerError
	if errors.As(err, &pe) {
		return pe.Status
	}
	return 0
}

// do sends one request and decodes a 2xx answer into out.
func (s *shop) do(ctx context.Context, op, method, u string, hdr http.Header, body io.Reader, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	for k, vs := range hdr {
		req.Header[k] = vs
	}
	hc := s.http
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
		return &providerError{Op: op, Status: resp.StatusCode, Type: e.Error.Type, Code: e.Error.Code, Message: e.Error.Message}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s: decoding %q: %w", op, b, err)
		}
	}
	return nil
}

// createOrder places an order under the idempotency key opKey.
func (s *shop) createOrder(ctx context.Context, opKey string, o fakes.OrderRequest) (fakes.Order, error) {
	body, _ := json.Marshal(o)
	var out fakes.Order
	err := s.do(ctx, "merchant create order", http.MethodPost, s.merchant+"/orders",
		http.Header{fakes.IdempotencyKeyHeader: {opKey}, "Content-Type": {"application/json"}}, bytes.NewReader(body), &out)
	return out, err
}

// findOrder asks the merchant for the order under opKey.
func (s *shop) findOrder(ctx context.Context, opKey string) (fakes.Order, bool, error) {
	var out fakes.Order
	err := s.do(ctx, "merchant find order", http.MethodGet, s.merchant+"/orders?key="+url.QueryEscape(opKey), nil, nil, &out)
	if httpStatus(err) == http.StatusNotFound {
		return fakes.Order{}, false, nil
	}
	return out, err == nil, err
}

// authorize authorizes a payment under the idempotency key opKey.
func (s *shop) authorize(ctx context.Context, opKey string, amount int, currency, reference string) (fakes.Authorization, error) {
	form := url.Values{"amount": {strconv.Itoa(amount)}, "currency": {currency}, "reference": {reference}}
	hdr := http.Header{fakes.IdempotencyKeyHeader: {opKey}, "Content-Type": {"application/x-www-form-urlencoded"}}
	if s.account != "" {
		hdr.Set(fakes.AccountHeader, s.account)
	}
	var out fakes.Authorization
	err := s.do(ctx, "payments authorize", http.MethodPost, s.payments+"/v1/payment_intents", hdr, bytes.NewReader([]byte(form.Encode())), &out)
	return out, err
}

// lookupPayment asks the payment provider what it holds under opKey.
func (s *shop) lookupPayment(ctx context.Context, opKey string) (fakes.IdempotencyRecord, bool, error) {
	hdr := http.Header{}
	if s.account != "" {
		hdr.Set(fakes.AccountHeader, s.account)
	}
	var out fakes.IdempotencyRecord
	err := s.do(ctx, "payments lookup", http.MethodGet, s.payments+"/v1/idempotency_keys?key="+url.QueryEscape(opKey), hdr, nil, &out)
	if httpStatus(err) == http.StatusNotFound {
		return fakes.IdempotencyRecord{}, false, nil
	}
	return out, err == nil, err
}

// bookPickup books a courier pickup for intent key through the gateway,
// under token.
func (s *shop) bookPickup(ctx context.Context, key string, token fencing.Token, p fakes.Pickup) (fakes.Pickup, error) {
	body, _ := json.Marshal(p)
	hdr := http.Header{fakes.IntentKeyHeader: {key}, "Content-Type": {"application/json"}}
	fencing.SetHeader(hdr, token)
	var out fakes.Pickup
	err := s.do(ctx, "gateway book pickup", http.MethodPost, s.gateway+"/pickups", hdr, bytes.NewReader(body), &out)
	return out, err
}

// forwarded asks the gateway, under token, which calls it passed on for
// intent key.
func (s *shop) forwarded(ctx context.Context, key string, token fencing.Token) ([]fakes.Forwarded, error) {
	hdr := http.Header{}
	fencing.SetHeader(hdr, token)
	var out []fakes.Forwarded
	err := s.do(ctx, "gateway lookup", http.MethodGet, s.gateway+"/pickups?intent="+url.QueryEscape(key), hdr, nil, &out)
	if httpStatus(err) == http.StatusNotFound {
		return nil, nil
	}
	return out, err
}

// purchase is the approved terms of a purchase intent: amounts in minor
// units, identifiers as strings (see intent.Canonical).
func purchase(item string, quantity, amountCents int) *structpb.Struct {
	p, err := structpb.NewStruct(map[string]any{
		"item": item, "quantity": quantity, "merchant": "M", "amount_cents": amountCents, "currency": "EUR",
	})
	if err != nil {
		panic(err)
	}
	return p
}

// orderOf is the merchant order an attempt's approved terms ask for. Its
// reference is the purchase the intent belongs to: the "purchase" param of
// a sub-operation, else the intent itself.
func orderOf(att *client.Attempt) fakes.OrderRequest {
	f := att.Intent.GetParams().GetFields()
	ref := f["purchase"].GetStringValue()
	if ref == "" {
		ref = att.Key
	}
	return fakes.OrderRequest{Reference: ref, Item: f["item"].GetStringValue(), Quantity: int(f["quantity"].GetNumberValue())}
}

// amountOf is the approved amount and currency of an attempt.
func amountOf(att *client.Attempt) (int, string) {
	f := att.Intent.GetParams().GetFields()
	return int(f["amount_cents"].GetNumberValue()), f["currency"].GetStringValue()
}

const (
	refOrder   = "supplier_order_id"
	refPayment = "payment_intent_id"
	refPickup  = "pickup_id"
)

func refs(kv ...string) *intentv1.Result {
	r := &intentv1.Result{ExternalRefs: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		r.ExternalRefs[kv[i]] = kv[i+1]
	}
	return r
}

// executeOrder is an Execute that places the attempt's order under its
// "create-order" operation key.
func (s *shop) executeOrder(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
	o, err := s.createOrder(ctx, att.OperationKey("create-order"), orderOf(att))
	if err != nil {
		return nil, err
	}
	return refs(refOrder, o.ID), nil
}

// reconcileOrder is a Reconcile that asks the merchant for the order under
// the "create-order" operation key: the merchant keeps every key, so "no
// order" is a confirmed absence.
func (s *shop) reconcileOrder(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
	o, found, err := s.findOrder(ctx, att.OperationKey("create-order"))
	switch {
	case err != nil:
		return client.Evidence{}, err
	case found:
		return client.Found(refs(refOrder, o.ID)), nil
	default:
		return client.Absent("merchant has no order under " + att.OperationKey("create-order")), nil
	}
}

// orderTask carries one order intent: Execute places it, Reconcile looks
// it up by operation key.
func (s *shop) orderTask(key string) client.Task {
	return client.Task{Key: key, Execute: s.executeOrder, Reconcile: s.reconcileOrder, WaitInProgress: 20 * time.Second}
}

// executePayment is an Execute that authorizes the attempt's amount under
// its "authorize-payment" operation key.
func (s *shop) executePayment(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
	amount, currency := amountOf(att)
	a, err := s.authorize(ctx, att.OperationKey("authorize-payment"), amount, currency, orderOf(att).Reference)
	if err != nil {
		return nil, err
	}
	return refs(refPayment, a.ID), nil
}

// paymentEvidence reads a stored payment response as evidence: a stored
// authorization is Found; a stored refusal or failure means the provider
// executed the request and will replay that answer, not authorize: Absent
// would only re-send the same key and get the same answer, so a human
// decides.
func paymentEvidence(rec fakes.IdempotencyRecord) (client.Evidence, error) {
	if rec.Status/100 != 2 {
		return client.Undecided(fmt.Sprintf("the provider stored HTTP %d under %s: %s", rec.Status, rec.Key, rec.Body)), nil
	}
	var a fakes.Authorization
	if err := json.Unmarshal(rec.Body, &a); err != nil {
		return client.Evidence{}, err
	}
	return client.Found(refs(refPayment, a.ID)), nil
}
