package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/intentd/intentd/client"
	intentv1 "github.com/intentd/intentd/gen/intent/v1"
)

// merchant is a downstream provider that deduplicates orders on the
// idempotency key, as a well-behaved provider does.
type merchant struct {
	mu     sync.Mutex
	orders map[string]string // idempotency key → order id
}

func (m *merchant) order(key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, ok := m.orders[key]; ok {
		return id
	}
	id := fmt.Sprintf("SO-%d", 1000+len(m.orders))
	m.orders[key] = id
	return id
}

func (m *merchant) lookup(key string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.orders[key]
	return id, ok
}

func lampParams() *structpb.Struct {
	p, _ := structpb.NewStruct(map[string]any{"item": "desk lamp", "quantity": 1, "merchant": "M", "max_amount": "89.00"})
	return p
}

// The safe loop: the first Run executes once and records the order; a
// retry of the same intent gets the stored result back without executing.
func ExampleSession_Run() {
	ctx := context.Background()
	conn := dial()
	defer conn.Close()
	c := client.New(conn)
	sess, err := c.OpenSession(ctx, "worker-a", 10*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sess.Close(ctx)

	shop := &merchant{orders: map[string]string{}}
	task := client.Task{
		Key:      "example-purchase-1",
		Register: &intentv1.RegisterRequest{Params: lampParams()},
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			id := shop.order(att.OperationKey("create-order"))
			return &intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": id}}, nil
		},
	}
	for range 2 {
		out, err := sess.Run(ctx, task)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(out.Outcome, out.Executed, out.Result().GetExternalRefs()["supplier_order_id"])
	}
	fmt.Println("orders at the merchant:", len(shop.orders))
	// Output:
	// OUTCOME_COMPLETED true SO-1000
	// OUTCOME_COMPLETED false SO-1000
	// orders at the merchant: 1
}

// A timeout is not a failure: the first attempt's answer is lost, so Run
// marks the intent UNKNOWN. The next Run reconciles — it asks the merchant
// by operation key, finds the order, and records it — instead of ordering
// again.
func ExampleSession_Run_reconcile() {
	ctx := context.Background()
	conn := dial()
	defer conn.Close()
	c := client.New(conn)
	sess, err := c.OpenSession(ctx, "worker-b", 10*time.Second)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sess.Close(ctx)

	shop := &merchant{orders: map[string]string{}}
	task := client.Task{
		Key:      "example-purchase-2",
		Register: &intentv1.RegisterRequest{Params: lampParams()},
		Execute: func(ctx context.Context, att *client.Attempt) (*intentv1.Result, error) {
			shop.order(att.OperationKey("create-order"))
			return nil, errors.New("merchant: read timeout") // the order exists, the answer is lost
		},
		Reconcile: func(ctx context.Context, att *client.Attempt) (client.Evidence, error) {
			if id, ok := shop.lookup(att.OperationKey("create-order")); ok {
				return client.Found(&intentv1.Result{ExternalRefs: map[string]string{"supplier_order_id": id}}), nil
			}
			return client.Absent("no order under " + att.OperationKey("create-order")), nil
		},
	}
	out, err := sess.Run(ctx, task)
	fmt.Println(out.Intent.GetState(), err)

	out, err = sess.Run(ctx, task)
	fmt.Println(out.Outcome, out.Executed, out.Result().GetExternalRefs()["supplier_order_id"], err)
	fmt.Println("orders at the merchant:", len(shop.orders))
	// Output:
	// STATE_UNKNOWN merchant: read timeout
	// OUTCOME_COMPLETED false SO-1000 <nil>
	// orders at the merchant: 1
}

// Errors work with errors.Is; a refused report says which token is
// current and what became of the intent.
func ExampleError() {
	ctx := context.Background()
	conn := dial()
	defer conn.Close()
	c := client.New(conn)

	if _, err := c.Register(ctx, &intentv1.RegisterRequest{Key: "example-purchase-3", Params: lampParams()}); err != nil {
		fmt.Println(err)
		return
	}
	changed, _ := structpb.NewStruct(map[string]any{"item": "desk lamp", "quantity": 2, "merchant": "M", "max_amount": "89.00"})
	_, err := c.Register(ctx, &intentv1.RegisterRequest{Key: "example-purchase-3", Params: changed})
	fmt.Println(errors.Is(err, client.ErrFingerprintMismatch))

	_, err = c.Complete(ctx, &intentv1.CompleteRequest{Key: "example-purchase-3", Token: 1, Result: &intentv1.Result{}})
	var e *client.Error
	if errors.As(err, &e) {
		fmt.Println(e.Code, e.Reason, e.Field)
	}
	// Output:
	// true
	// InvalidArgument INVALID_FIELD token
}

// A worker asserts that the terms it is about to act on are the approved
// ones: it asks intentd for their fingerprint (the same in every language:
// SHA-256 of their RFC 8785 form) and passes it as Acquire's
// expected_fingerprint, which fails with FINGERPRINT_MISMATCH otherwise.
func ExampleClient_Fingerprint() {
	ctx := context.Background()
	conn := dial()
	defer conn.Close()
	c := client.New(conn)
	terms, _ := structpb.NewStruct(map[string]any{
		"item": "desk lamp", "quantity": 2, "merchant": "möbel-haus", "max_amount": "89.00", "currency": "EUR",
	})
	fp, err := c.Fingerprint(ctx, terms)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(fp)
	// Then: c.Acquire(ctx, &intentv1.AcquireRequest{..., ExpectedFingerprint: fp})

	// Output:
	// 78bd230c4df9a993812929c4b6487678e7ef00ce36d7f96e74407e5456afd8ed
}
