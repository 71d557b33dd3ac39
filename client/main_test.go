package client_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/internal/daemon"
)

// addr is the address of the intentd every test and example of this
// package talks to: a real one, with an embedded etcd, started by TestMain.
var addr string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "intentd-client-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	cfg := daemon.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.EmbedClientURL = "http://127.0.0.1:0"
	cfg.EmbedPeerURL = "http://127.0.0.1:0"
	cfg.JanitorInterval = 200 * time.Millisecond
	ctx, stop := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	exited := make(chan error, 1)
	go func() {
		exited <- daemon.Run(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), func(a string) { ready <- a })
	}()
	select {
	case addr = <-ready:
	case err := <-exited:
		fmt.Fprintln(os.Stderr, "intentd:", err)
		os.Exit(1)
	}
	code := m.Run()
	stop()
	<-exited
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// dial connects to the test intentd.
func dial() *grpc.ClientConn {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	return conn
}
