package daemon_test

import (
	"runtime"
	"syscall"
)

// asUser runs fn on an OS thread whose file-system user is uid, so that
// the file and socket system calls fn makes on its own goroutine are
// checked as that user's (root's file capabilities are dropped with it). The thread is never handed back to
// the Go scheduler: it exits when fn's goroutine does.
func asUser(uid int, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // no Unlock: the thread dies with the goroutine
		if err := syscall.Setfsuid(uid); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}
