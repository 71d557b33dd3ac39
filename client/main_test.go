package client_test

import (
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/internal/run/daemon"
	"github.com/intentd/intentd/internal/testing/intentdtest"
)

// addr is the address of the intentd every test and example of this
// package talks to: a real one, with an embedded etcd, started by TestMain.
var addr string

func TestMain(m *testing.M) {
	intentdtest.Main(m, &addr, func(cfg *daemon.Config) { cfg.JanitorInterval = 200 * time.Millisecond })
}

// dial connects to the test intentd.
func dial() *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	return conn
}
