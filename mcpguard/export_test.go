package mcpguard

import "time"

// SetIntentdWait sets how long a call waits for intentd before anything is
// sent, until the test ends.
func SetIntentdWait(t interface{ Cleanup(func()) }, d time.Duration) {
	old := intentdWait
	intentdWait = d
	t.Cleanup(func() { intentdWait = old })
}
