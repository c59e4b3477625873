package image

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// syncTree flushes the file system holding dir: one syncfs for a whole
// unpacked tree instead of an fsync per file.
func syncTree(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// syncDir makes a rename inside dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
