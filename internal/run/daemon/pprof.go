package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// servePprof serves Go's profiles (net/http/pprof: /debug/pprof/, CPU,
// heap, allocations, goroutines, mutex and block contention, execution
// traces) at addr, which Validate holds to loopback: a profile shows the
// process's code paths and goroutine stacks, and a CPU profile or trace
// request makes the process work for as long as it asks. Empty addr: off,
// the default. A listener that fails is logged, not fatal, like the
// metrics listener: gRPC goes on serving.
func servePprof(addr string, log *slog.Logger) component {
	return func(ctx context.Context) error {
		if addr == "" {
			<-ctx.Done()
			return nil
		}
		if err := pprofServe(ctx, addr, log); err != nil {
			log.Error("pprof listener failed; serving gRPC without profiles", "addr", addr, "err", err)
			<-ctx.Done()
		}
		return nil
	}
}

// pprofServe serves the profiles on addr until ctx ends.
func pprofServe(ctx context.Context, addr string, log *slog.Logger) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// A mux of its own: importing net/http/pprof also registers the
	// handlers on http.DefaultServeMux, which intentd never serves.
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // the named profiles too (heap, allocs, goroutine, ...)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// No WriteTimeout: a CPU profile or trace answers after its seconds.
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { // exits when ctx ends
		<-ctx.Done()
		_ = hs.Close() // a profile in progress is cut, not waited for
	}()
	log.Info("pprof serving", "url", "http://"+lis.Addr().String()+"/debug/pprof/")
	if err := hs.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
