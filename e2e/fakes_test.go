package e2e

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/intentd/intentd/e2e/fakes"
	"github.com/intentd/intentd/e2e/harness"
	"github.com/intentd/intentd/fencing"
)

// The providers are the scenarios' measuring instruments: these tests pin
// down that they behave as documented before anything is measured with
// them.

// TestPaymentsIdempotency walks the payment provider through Stripe's
// idempotency rules, one step after another.
func TestPaymentsIdempotency(t *testing.T) {
	clock := &fakes.Clock{}
	p := fakes.NewPayments(24*time.Hour, clock)
	url := serve(t, p).URL
	ctx := testCtx(t, 30*time.Second)
	acctA := &shop{harness.Shop{Payments: url, Account: "acct_A"}}
	acctB := &shop{harness.Shop{Payments: url, Account: "acct_B"}}

	first, err := acctA.Authorize(ctx, "k1", 500, "EUR", "r1")
	if err != nil || first.ID == "" || p.Count() != 1 {
		t.Fatalf("first request: %+v, %v, count %d", first, err, p.Count())
	}

	steps := []struct {
		name       string
		s          *shop
		key        string
		amount     int
		wantStatus int    // 0: success
		wantID     string // for a success, "" for a new id
		wantCount  int
	}{
		{"same key, same params: replayed", acctA, "k1", 500, 0, first.ID, 1},
		{"same key, other params: 400", acctA, "k1", 600, http.StatusBadRequest, "", 1},
		{"same key, other account: a new request", acctB, "k1", 500, 0, "", 2},
	}
	for _, st := range steps {
		got, err := st.s.Authorize(ctx, st.key, st.amount, "EUR", "r1")
		switch {
		case harness.HTTPStatus(err) != st.wantStatus || (st.wantStatus == 0 && err != nil):
			t.Errorf("%s: got %+v, %v; want HTTP %d", st.name, got, err, st.wantStatus)
		case st.wantStatus == 0 && st.wantID != "" && got.ID != st.wantID:
			t.Errorf("%s: got id %s, want %s", st.name, got.ID, st.wantID)
		case st.wantStatus == 0 && st.wantID == "" && got.ID == first.ID:
			t.Errorf("%s: got the first request's id %s, want a new one", st.name, got.ID)
		}
		if n := p.Count(); n != st.wantCount {
			t.Errorf("%s: %d authorizations, want %d", st.name, n, st.wantCount)
		}
	}

	// The first answer is stored even when it is a 500, and replayed.
	p.FailNext(1)
	for i := range 2 {
		if _, err := acctA.Authorize(ctx, "k2", 500, "EUR", "r2"); harness.HTTPStatus(err) != http.StatusInternalServerError {
			t.Errorf("k2 attempt %d: got %v, want the stored 500", i+1, err)
		}
	}
	if rec, found, err := acctA.LookupPayment(ctx, "k2"); err != nil || !found || rec.Status != http.StatusInternalServerError {
		t.Errorf("lookup k2: %+v found=%t %v; want the stored 500", rec, found, err)
	}
	if n := p.Count(); n != 2 {
		t.Errorf("after the 500s: %d authorizations, want 2", n)
	}

	// A concurrent duplicate gets 409 "in use", and nothing is stored for it.
	started, release := p.HoldNext()
	defer release()
	type answer struct {
		a   fakes.Authorization
		err error
	}
	held := make(chan answer, 1)
	go func() {
		a, err := acctA.Authorize(ctx, "k3", 700, "EUR", "r3")
		held <- answer{a, err}
	}()
	<-started
	if _, err := acctA.Authorize(ctx, "k3", 700, "EUR", "r3"); harness.HTTPStatus(err) != http.StatusConflict {
		t.Errorf("duplicate in flight: got %v, want 409", err)
	}
	if rec, found, err := acctA.LookupPayment(ctx, "k3"); err != nil || !found || !rec.InFlight {
		t.Errorf("lookup k3 in flight: %+v found=%t %v", rec, found, err)
	}
	release()
	h := <-held
	if h.err != nil {
		t.Fatalf("held request: %v", h.err)
	}
	if again, err := acctA.Authorize(ctx, "k3", 700, "EUR", "r3"); err != nil || again.ID != h.a.ID {
		t.Errorf("k3 after it finished: %+v %v, want %s replayed", again, err, h.a.ID)
	}

	// Keys are forgotten after the retention: the same key is a new request.
	clock.Advance(25 * time.Hour)
	if _, found, err := acctA.LookupPayment(ctx, "k1"); err != nil || found {
		t.Errorf("lookup k1 after the retention: found=%t %v, want 404", found, err)
	}
	if again, err := acctA.Authorize(ctx, "k1", 500, "EUR", "r1"); err != nil || again.ID == first.ID {
		t.Errorf("k1 after the retention: %+v %v, want a new authorization", again, err)
	}
	if n := p.Count(); n != 4 {
		t.Errorf("%d authorizations at the end, want 4", n)
	}
}

// TestMerchantIdempotency checks one order per key, its lookup, and the
// duplicate count by reference.
func TestMerchantIdempotency(t *testing.T) {
	m := fakes.NewMerchant()
	s := &shop{harness.Shop{Merchant: serve(t, m).URL}}
	ctx := testCtx(t, 30*time.Second)
	req := fakes.OrderRequest{Reference: "p1", Item: "lamp", Quantity: 1}

	a, err := s.CreateOrder(ctx, "k1", req)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := s.CreateOrder(ctx, "k1", req); err != nil || b.ID != a.ID {
		t.Errorf("same key: %+v %v, want order %s again", b, err, a.ID)
	}
	if _, err := s.CreateOrder(ctx, "k1", fakes.OrderRequest{Reference: "p1", Item: "lamp", Quantity: 2}); harness.HTTPStatus(err) != http.StatusUnprocessableEntity {
		t.Errorf("same key, other order: %v, want 422", err)
	}
	if o, found, err := s.FindOrder(ctx, "k1"); err != nil || !found || o.ID != a.ID {
		t.Errorf("find k1: %+v found=%t %v", o, found, err)
	}
	if _, found, err := s.FindOrder(ctx, "k2"); err != nil || found {
		t.Errorf("find k2: found=%t %v, want not found", found, err)
	}
	if m.Count() != 1 || m.Duplicates() != 0 {
		t.Errorf("count %d duplicates %d, want 1 and 0", m.Count(), m.Duplicates())
	}
	if _, err := s.CreateOrder(ctx, "k2", req); err != nil { // the same purchase under another key
		t.Fatal(err)
	}
	if m.Count() != 2 || m.Duplicates() != 1 {
		t.Errorf("count %d duplicates %d, want 2 and 1", m.Count(), m.Duplicates())
	}
}

// TestGatewayFencing checks that the gateway forwards a call only under a
// token no older than one it admitted for the same intent.
func TestGatewayFencing(t *testing.T) {
	courier := &fakes.Courier{}
	g := fakes.NewGateway(serve(t, courier).URL)
	s := &shop{harness.Shop{Gateway: serve(t, g).URL}}
	ctx := testCtx(t, 30*time.Second)
	p := fakes.Pickup{Parcel: "P-1", Address: "Dock 4"}

	steps := []struct {
		key        string
		token      fencing.Token
		wantStatus int // 0: forwarded
	}{
		{"i1", 5, 0},
		{"i1", 7, 0},
		{"i1", 5, http.StatusConflict},
		{"i1", 7, 0}, // the same lease again
		{"i2", 3, 0}, // another intent: tokens never meet
		{"i1", 0, http.StatusBadRequest},
	}
	for _, st := range steps {
		_, err := s.BookPickup(ctx, st.key, st.token, p)
		if harness.HTTPStatus(err) != st.wantStatus || (st.wantStatus == 0 && err != nil) {
			t.Errorf("%s under token %d: %v, want HTTP %d", st.key, st.token, err, st.wantStatus)
		}
	}
	// A lookup under a newer token fences out everything older.
	calls, err := s.Forwarded(ctx, "i2", 9)
	if err != nil || len(calls) != 1 || calls[0].Token != 3 {
		t.Errorf("lookup i2: %+v %v", calls, err)
	}
	if _, err := s.BookPickup(ctx, "i2", 3, p); harness.HTTPStatus(err) != http.StatusConflict {
		t.Errorf("i2 under token 3 after a lookup under 9: %v, want 409", err)
	}
	if n, r := courier.Count(), g.Refused(); n != 4 || r != 2 {
		t.Errorf("courier booked %d, gateway refused %d; want 4 and 2", n, r)
	}
}

// TestCutReply checks that a cut request reaches the provider and its
// caller gets fakes.ErrReplyCut, once per key.
func TestCutReply(t *testing.T) {
	m := fakes.NewMerchant()
	cut := &fakes.CutReply{Cut: fakes.CutFirst(http.MethodPost, "/orders", "k1")}
	s := &shop{harness.Shop{HTTP: &http.Client{Transport: cut}, Merchant: serve(t, m).URL}}
	ctx := context.Background()
	req := fakes.OrderRequest{Reference: "p1", Item: "lamp", Quantity: 1}

	if _, err := s.CreateOrder(ctx, "k1", req); !errors.Is(err, fakes.ErrReplyCut) {
		t.Fatalf("first k1: %v, want fakes.ErrReplyCut", err)
	}
	if m.Count() != 1 {
		t.Fatalf("the cut request did not reach the merchant: %d orders", m.Count())
	}
	if _, err := s.CreateOrder(ctx, "k1", req); err != nil {
		t.Errorf("second k1: %v, want its answer", err)
	}
	if _, err := s.CreateOrder(ctx, "k2", req); err != nil {
		t.Errorf("k2: %v, want its answer", err)
	}
	if got := cut.Cuts(); len(got) != 1 {
		t.Errorf("cuts: %v, want one", got)
	}
}
