package cni

import (
	"encoding/json"
	"fmt"
)

// MarshalJSON writes the whole configuration: the spec's fields, skein's
// own, and prevResult. Without it the embedded types.PluginConf's
// MarshalJSON (a pointer method) is promoted to *NetConf and writes the
// spec's fields only, losing pool, mtu, socket, runtimeConfig and args;
// and prevResult is lost either way once Parse has decoded it, since
// decoding moves it from RawPrevResult to PrevResult, which JSON skips.
func (c NetConf) MarshalJSON() ([]byte, error) {
	// The same fields without methods, encoded as a value: the promoted
	// pointer method is out of reach and every field is written.
	type fields NetConf
	if c.PrevResult != nil {
		b, err := json.Marshal(c.PrevResult)
		if err != nil {
			return nil, fmt.Errorf("encode prevResult: %w", err)
		}
		var raw map[string]any
		if err := json.Unmarshal(b, &raw); err != nil {
			return nil, fmt.Errorf("encode prevResult: %w", err)
		}
		c.RawPrevResult = raw // c is a copy: the caller's is untouched
	}
	return json.Marshal(fields(c))
}
