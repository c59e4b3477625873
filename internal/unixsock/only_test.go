package unixsock

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestOnlyPlaceThatListens: every UNIX socket skein's programs make goes
// through Listen. A listen elsewhere in internal/ or cmd/ would be bound
// with the umask's mode and need a chmod afterwards, the window this
// package exists to close.
func TestOnlyPlaceThatListens(t *testing.T) {
	direct := regexp.MustCompile(`net\.Listen\("unix|net\.ListenUnix(gram)?\(|net\.ListenPacket\("unix`)
	for _, root := range []string{"../../internal", "../../cmd"} {
		err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") ||
				filepath.Base(filepath.Dir(path)) == "unixsock" {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for i, line := range strings.Split(string(b), "\n") {
				if direct.MatchString(line) {
					t.Errorf("%s:%d listens on a UNIX socket directly; use unixsock.Listen: %s", path, i+1, strings.TrimSpace(line))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
