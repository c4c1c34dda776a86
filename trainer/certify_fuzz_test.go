package trainer

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/trainer/adapter"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// FuzzSignedDeltas decodes what a publisher answers a voter's
// opSubmissions with, as checkVersion does before it trusts anything in
// it: the list, each delta's claim, and the delta itself. No input may
// panic, and a delta that decodes re-encodes to what was signed over.
func FuzzSignedDeltas(f *testing.F) {
	d := &adapter.Delta{Parent: strings.Repeat("ab", 32), Tensors: []adapter.Tensor{{Name: "a.lora_A.weight", Shape: []int{2, 2}, Data: []float32{1, 2, 3, 4}}}}
	payload, err := d.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	seed, _ := json.Marshal([]signedDelta{{Trainer: "t1", Cert: []byte{1, 2}, Round: 3, Base: 2, Samples: 8,
		Batches: []core.BatchID{"b1"}, Refused: []group.Refusal{{ID: "b2", Reason: "unreadable"}}, Sig: make([]byte, 64), Delta: payload}})
	f.Add(seed)
	f.Add([]byte(`[{"trainer":"t","delta":"AAAA"}]`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var ds []signedDelta
		if json.Unmarshal(b, &ds) != nil {
			return
		}
		for _, sd := range ds {
			_ = deltaClaim("mesh", sd.Round, sd.Base, sd.Samples, sd.Batches, sd.Refused, sd.Delta)
			dl, err := adapter.UnmarshalDelta(sd.Delta, adapter.Limits{})
			if err != nil {
				continue
			}
			if _, err := dl.MarshalBinary(); err != nil {
				t.Fatalf("a delta that decodes does not encode: %v", err)
			}
		}
	})
}
