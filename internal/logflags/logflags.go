// Package logflags turns the --log-level and --log-format flags that
// skein's daemons share into a logger.
package logflags

import (
	"fmt"
	"io"
	"log/slog"
)

// Handler is the slog handler for a level (debug, info, warn, error) and a
// format (text or json), writing to w.
func Handler(level, format string, w io.Writer) (slog.Handler, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	o := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.NewTextHandler(w, o), nil
	case "json":
		return slog.NewJSONHandler(w, o), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// New is a logger on Handler's handler.
func New(level, format string, w io.Writer) (*slog.Logger, error) {
	h, err := Handler(level, format, w)
	if err != nil {
		return nil, err
	}
	return slog.New(h), nil
}
