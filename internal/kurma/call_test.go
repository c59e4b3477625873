package kurma

import (
	"encoding/json"
	"testing"
)

// TestRefetchKeepsInsecure: a del that must fetch a pruned image again
// may use plain http when the add could: from the record's flag, or from
// the recorded config (records written before the flag existed).
func TestRefetchKeepsInsecure(t *testing.T) {
	n, err := ParseNetworks(json.RawMessage(`[{"name":"n","image":"docker://10.9.8.7:5000/net@sha256:` +
		`0000000000000000000000000000000000000000000000000000000000000000","insecure":true,"type":"t"}]`))
	if err != nil {
		t.Fatal(err)
	}
	a := AttachmentRecord{Network: "n", Config: n[0].Raw, Image: n[0].Image, Digest: "sha256:00", Insecure: n[0].Ref.Insecure}
	if !a.Insecure {
		t.Fatal("network parsed without insecure")
	}
	// Through the store and back.
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back AttachmentRecord
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if src := refetchSource(back); !src.Insecure || src.Image != a.Image || src.Digest != a.Digest {
		t.Errorf("refetch source %+v, want insecure with the recorded image and digest", src)
	}
	old := back
	old.Insecure = false
	if !refetchSource(old).Insecure {
		t.Error("a record without the flag: insecure not taken from its config")
	}
	old.Config = json.RawMessage(`{"name":"n","type":"t"}`)
	if refetchSource(old).Insecure {
		t.Error("insecure without the flag or the config saying so")
	}
}
