package fencing_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/intentd/intentd/fencing"
)

// A worker that pauses past its lease and resumes with its old token is
// refused by a resource that has already admitted the newer holder's token.
func ExampleMemoryChecker() {
	ctx := context.Background()
	orders := fencing.NewMemoryChecker() // embedded in the resource
	const order = "order/42"

	// Worker A holds the lease with token 7 and writes.
	fmt.Println("A(7):", orders.Admit(ctx, order, 7))

	// A pauses; its lease lapses; worker B acquires with token 9 and writes.
	fmt.Println("B(9):", orders.Admit(ctx, order, 9))

	// A resumes with its old token and is refused.
	err := orders.Admit(ctx, order, 7)
	fmt.Println("A(7):", err)

	var stale *fencing.StaleError
	if errors.As(err, &stale) {
		fmt.Println("stale:", errors.Is(err, fencing.ErrStale), "superseded by", stale.Highest)
	}

	// B retrying under the same token is still admitted.
	fmt.Println("B(9):", orders.Admit(ctx, order, 9))
	// Output:
	// A(7): <nil>
	// B(9): <nil>
	// A(7): fencing: stale token 7 for resource "order/42": highest admitted is 9
	// stale: true superseded by 9
	// B(9): <nil>
}

// The worker sets its token on an outgoing request; the resource reads it
// back before it admits the write.
func ExampleFromHeader() {
	req, _ := http.NewRequest(http.MethodPost, "http://resource.example/orders/42", nil)
	fencing.SetHeader(req.Header, 9)
	fmt.Println(fencing.Header+":", req.Header.Get(fencing.Header))

	t, err := fencing.FromHeader(req.Header)
	fmt.Println(t, err)

	_, err = fencing.FromHeader(http.Header{})
	fmt.Println(errors.Is(err, fencing.ErrMissing))

	req.Header.Set(fencing.Header, "009")
	_, err = fencing.FromHeader(req.Header)
	fmt.Println(err)
	// Output:
	// Intentd-Fencing-Token: 9
	// 9 <nil>
	// true
	// fencing: malformed token: "009"
}
