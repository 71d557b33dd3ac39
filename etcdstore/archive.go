package etcdstore

// archiveTier is what the store keeps of its archive, the cold tier of
// final intents (issue 26): work in progress.
type archiveTier struct{}
