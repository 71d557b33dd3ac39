package reliability

import "maps"

// Adopt hands keys registered elsewhere (before a restore) to the workers
// as if this load had registered them.
func (l *Load) Adopt(keys []string) {
	l.mu.Lock()
	l.keys = append(l.keys, keys...)
	l.mu.Unlock()
	for _, k := range keys {
		l.queue <- k
	}
}

// Settled returns each intent seen COMPLETED with its order.
func (l *Load) Settled() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.settled)
}
