package logflags

import (
	"bytes"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	var b bytes.Buffer
	log, err := New("warn", "json", &b)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "k", 1)
	if out := b.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) || !strings.Contains(out, `"k":1`) {
		t.Errorf("json at warn wrote %q", out)
	}
	b.Reset()
	log, err = New("debug", "text", &b)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("d")
	if !strings.Contains(b.String(), "level=DEBUG msg=d") {
		t.Errorf("text at debug wrote %q", b.String())
	}
	for _, tc := range [][3]string{{"loud", "text", "--log-level"}, {"info", "xml", `--log-format "xml"`}} {
		if _, err := New(tc[0], tc[1], &b); err == nil || !strings.Contains(err.Error(), tc[2]) {
			t.Errorf("New(%q, %q): %v, want an error naming %s", tc[0], tc[1], err, tc[2])
		}
	}
}
