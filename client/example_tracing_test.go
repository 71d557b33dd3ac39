package client_test

import (
	"log"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/intentd/intentd/client"
)

// A worker whose calls join its traces: the conn's calls get client spans
// and send their trace context to intentd, and each Session.Run is one
// trace. tp is the program's own provider (with its exporter); nothing is
// installed globally.
func ExampleTracing() {
	tp := sdktrace.NewTracerProvider() // with sdktrace.WithBatcher(exporter) in a real program
	conn, err := grpc.NewClient("127.0.0.1:7650",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		client.Tracing(tp))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	c := client.New(conn, client.WithTracerProvider(tp))
	_ = c // c.OpenSession(...), then session.Run(ctx, task): one trace per Run
}
