package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
	"github.com/intentd/intentd/intent"
)

// paymentRetention is how long the fake payment provider keeps keys, as
// Stripe does.
const paymentRetention = 24 * time.Hour

// world is one scenario's intentd and providers.
type world struct {
	intentd *harness.Intentd
	// c is the approver's and reader's client.
	c *client.Client

	merchant *fakes.Merchant
	payments *fakes.Payments
	clock    *fakes.Clock // the payment provider's
	courier  *fakes.Courier
	gateway  *fakes.Gateway

	merchantURL, paymentsURL, gatewayURL string
}

// newWorld starts intentd and the providers on loopback.
func newWorld(t *testing.T) *world {
	t.Helper()
	d := startIntentd(t)
	w := &world{intentd: d, c: clientOf(t, d), merchant: fakes.NewMerchant(), clock: &fakes.Clock{}, courier: &fakes.Courier{}}
	w.payments = fakes.NewPayments(paymentRetention, w.clock)
	w.merchantURL = serve(t, w.merchant).URL
	w.paymentsURL = serve(t, w.payments).URL
	w.gateway = fakes.NewGateway(serve(t, w.courier).URL)
	w.gatewayURL = serve(t, w.gateway).URL
	return w
}

// shop returns a worker's side of the providers, its HTTP calls going
// through rt (nil: the default transport).
func (w *world) shop(rt http.RoundTripper) *shop {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &shop{harness.Shop{HTTP: &http.Client{Transport: rt}, Merchant: w.merchantURL, Payments: w.paymentsURL, Gateway: w.gatewayURL, Account: "acct_e2e"}}
}

// register approves an intent, as an approver does before any worker sees
// it.
func (w *world) register(t *testing.T, key string, params *structpb.Struct) *intentv1.Intent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := w.c.Register(ctx, &intentv1.RegisterRequest{Key: key, Params: params})
	if err != nil {
		t.Fatalf("Register(%s): %v", key, err)
	}
	return resp.GetIntent()
}

// childSpec is what a worker child process in mode working on key needs.
func (w *world) childSpec(mode, key string) childSpec {
	return childSpec{Mode: mode, Intentd: w.intentd.Addr, Merchant: w.merchantURL, Gateway: w.gatewayURL, Key: key, TTL: sessionTTL}
}

// fingerprint is the fingerprint intentd stores for params.
func fingerprint(t *testing.T, params *structpb.Struct) string {
	t.Helper()
	b, err := intent.Canonical(params.AsMap())
	if err != nil {
		t.Fatal(err)
	}
	return intent.Fingerprint(b)
}

// outcomeOf renders what Run returned, for messages.
func outcomeOf(out *client.Outcome, err error) string {
	if out == nil {
		return fmt.Sprintf("no outcome, err=%v", err)
	}
	return fmt.Sprintf("outcome=%s state=%s executed=%t refs=%v err=%v",
		out.Outcome, out.Intent.GetState(), out.Executed, out.Intent.GetResult().GetExternalRefs(), err)
}

// mustComplete fails the test unless Run completed the intent, and returns
// the result's external refs.
func mustComplete(t *testing.T, what string, out *client.Outcome, err error) map[string]string {
	t.Helper()
	if err != nil || out == nil || out.Outcome != intentv1.Outcome_OUTCOME_COMPLETED {
		t.Fatalf("%s: want COMPLETED, got %s", what, outcomeOf(out, err))
	}
	return out.Intent.GetResult().GetExternalRefs()
}
