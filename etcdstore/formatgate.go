package etcdstore

// formatGate decides which storage formats this store may write: the
// newest the whole cluster reads (issue 31): work in progress.
type formatGate struct{}
