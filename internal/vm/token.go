package vm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/skeinnet/skein/internal/vm/handover"
)

// tokens issues and checks the per-container tokens of the tap handover
// (see package handover): HMAC-SHA256(secret, container ID). Nothing per
// container is stored; the secret is kept in the store, so tokens survive
// a restart of skeind.
type tokens struct {
	secret []byte
	dir    string
}

func (t *tokens) token(containerID string) string {
	m := hmac.New(sha256.New, t.secret)
	m.Write([]byte("skein-vm tap handover\x00" + containerID))
	return hex.EncodeToString(m.Sum(nil))
}

func (t *tokens) valid(containerID, token string) bool {
	want := t.token(containerID)
	return hmac.Equal([]byte(want), []byte(token))
}

// write puts the token where a launcher running as root finds it: the
// directory is 0700, the file 0600, replaced atomically.
func (t *tokens) write(containerID string) error {
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return fmt.Errorf("token directory: %w", err)
	}
	if err := os.Chmod(t.dir, 0o700); err != nil {
		return fmt.Errorf("token directory: %w", err)
	}
	tmp, err := os.CreateTemp(t.dir, ".tmp-")
	if err != nil {
		return fmt.Errorf("write token: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(t.token(containerID) + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("write token: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write token: %w", err)
	}
	if err := os.Rename(tmp.Name(), handover.TokenPath(t.dir, containerID)); err != nil {
		return fmt.Errorf("write token: %w", err)
	}
	return nil
}

func (t *tokens) remove(containerID string) error {
	err := os.Remove(filepath.Join(t.dir, containerID))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove token: %w", err)
	}
	return nil
}
