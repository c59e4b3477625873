package dataplane

// HoldDeletes makes Teardown's deletes keep their end to themselves until
// release is called, so that only the kernel's announcement can end a
// Teardown. Call it before any Teardown, and release before Close.
func HoldDeletes(d *Dataplane) (release func()) {
	d.unlisted.hold = make(chan struct{})
	return func() { close(d.unlisted.hold) }
}
