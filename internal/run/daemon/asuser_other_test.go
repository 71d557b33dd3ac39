//go:build !linux

package daemon_test

import "errors"

// asUser needs Linux's per-thread file-system user id.
func asUser(int, func() error) error {
	return errors.New("asUser: only on Linux")
}
