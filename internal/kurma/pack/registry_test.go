package pack

import (
	"testing"

	"github.com/skeinnet/skein/test/skeintest"
)

func startRegistry(t *testing.T) string { return skeintest.StartRegistry(t) }
