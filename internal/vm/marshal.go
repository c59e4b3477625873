package vm

import (
	"encoding/json"
	"fmt"
)

// MarshalJSON writes the whole configuration, as cni.NetConf's does: the
// embedded types.PluginConf's MarshalJSON would otherwise be promoted to
// *NetConf and write the spec's fields only (losing socket and
// leaseSeconds), and prevResult, which ParseConf moves to PrevResult, would
// be lost either way.
func (c NetConf) MarshalJSON() ([]byte, error) {
	type fields NetConf // no methods, encoded as a value
	if c.PrevResult != nil {
		b, err := json.Marshal(c.PrevResult)
		if err != nil {
			return nil, fmt.Errorf("encode prevResult: %w", err)
		}
		var raw map[string]any
		if err := json.Unmarshal(b, &raw); err != nil {
			return nil, fmt.Errorf("encode prevResult: %w", err)
		}
		c.RawPrevResult = raw // c is a copy
	}
	return json.Marshal(fields(c))
}
