package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// shop is the worker's side of the providers with the tasks the scenarios
// run on it.
type shop struct{ harness.Shop }

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
	o, err := s.CreateOrder(ctx, att.OperationKey("create-order"), orderOf(att))
	if err != nil {
		return nil, err
	}
	return refs(refOrder, o.ID), nil
}

// reconcileOrder is a Reconcile that asks the merchant for the order under
// the "create-order" operation key: the merchant keeps every key, so "no
// order" is a confirmed absence.
func (s *shop) reconcileOrder(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
	o, found, err := s.FindOrder(ctx, att.OperationKey("create-order"))
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
	a, err := s.Authorize(ctx, att.OperationKey("authorize-payment"), amount, currency, orderOf(att).Reference)
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
