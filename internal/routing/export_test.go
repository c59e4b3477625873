package routing

import "context"

// SyncChanges runs one sync as Run does after a change: incremental when
// the Syncer is an Updater and the last sync went well.
func (l *Loop) SyncChanges(ctx context.Context) error { return l.syncOnce(ctx, false) }
