package archive

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrUnavailable marks an error of a call that PostgreSQL did not answer:
// it could not be reached, it refused the connection, it went away during
// the call, it is starting or shutting down, or the call's context ran out
// first. Match it with errors.Is; whether the call took effect is unknown
// (an idempotent Put or PutTombstones may be repeated). Every other error
// is PostgreSQL's answer, or a refusal of the arguments.
var ErrUnavailable = errors.New("archive: PostgreSQL unavailable")

// wrap names the operation that failed, and marks err as ErrUnavailable
// when it is one.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if unavailable(err) {
		return fmt.Errorf("archive: %s: %w: %w", op, ErrUnavailable, err)
	}
	return fmt.Errorf("archive: %s: %w", op, err)
}

// unavailableCodes are the SQLSTATEs PostgreSQL answers when it cannot
// serve the call, rather than refusing it: connection exceptions (class
// 08), shutting down or starting (57P01-57P03), too many connections.
var unavailableCodes = map[string]bool{
	"57P01": true, // admin_shutdown
	"57P02": true, // crash_shutdown
	"57P03": true, // cannot_connect_now
	"53300": true, // too_many_connections
	"53000": true, // insufficient_resources
}

// unavailable reports whether err says PostgreSQL did not answer.
func unavailable(err error) bool {
	if errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return false // the caller gave up: not the server's doing
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return unavailableCodes[pgErr.Code] || len(pgErr.Code) == 5 && pgErr.Code[:2] == "08"
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err),
		errors.As(err, &connectErr), errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	// pgx's errors of a connection that closed or broke before the call
	// was sent ("conn closed", a failed write).
	return pgconn.SafeToRetry(err)
}
