package harness

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// Dial connects to intentd at addrs, spreading calls over them round robin
// (a replica that is down is skipped). A lost connection is tried again
// within a second, as a worker fleet would configure it, rather than after
// gRPC's default backoff of up to two minutes.
func Dial(addrs ...string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
	}
	if len(addrs) == 1 {
		return grpc.NewClient(addrs[0], opts...)
	}
	r := manual.NewBuilderWithScheme("intentd-replicas")
	var state resolver.State
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(state)
	return grpc.NewClient(r.Scheme()+":///intentd", append(opts,
		grpc.WithResolvers(r),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))...)
}
