package batch

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
)

// fuzzLimits keeps a declared body small enough that the fuzzer runs fast.
var fuzzLimits = Limits{MaxBody: 1 << 20}

// FuzzDecode feeds Decode arbitrary bytes, starting from valid batches and
// every refusal.
func FuzzDecode(f *testing.F) {
	f.Add(mustEncode(f, testMeta, richSteps()))
	f.Add(mustEncode(f, Meta{}, []*core.Step{step("a", "s")}))
	for _, r := range refusals(f) {
		f.Add(r.b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		checkDecode(t, b, fuzzLimits)
	})
}

// FuzzBody feeds Decode arbitrary bodies in an honest frame under a header
// that is right about their size and hash (and about their summary where
// the lines parse), so the fuzzer gets past the hash to the step lines.
func FuzzBody(f *testing.F) {
	f.Add(bodyOf(f, richSteps()[:2]), int64(0), "p")
	f.Add(bodyOf(f, []*core.Step{step("a", "s")}), testHour.Unix(), "")
	f.Add([]byte(`{"schema":"clawmesh.step/v1","id":"x","session_id":"s","turn":"main","api":"messages","state":"open","request":{"messages":[{"role":"user","content":"hi"}]},"response":{"choices":null},"timings":{"start":"0001-01-01T00:00:00Z"}}`+"\n"), int64(3600), "q")
	f.Fuzz(func(t *testing.T, body []byte, created int64, policy string) {
		var steps []*core.Step
		lines := 0
		for line := range bytes.Lines(body) {
			lines++
			var es core.ExportedStep
			if json.Unmarshal(line, &es) == nil {
				steps = append(steps, &es.Step)
			}
		}
		h := honestHeader(steps, body)
		h.Steps = lines
		h.Created = time.Unix(created, 0).UTC()
		h.Policy = policy
		hj, err := marshalHeader(h)
		if err != nil {
			return // a time JSON cannot hold
		}
		checkDecode(t, assemble(hj, zframe(t, body)), fuzzLimits)
	})
}

// checkDecode: Decode never panics; a refusal wraps exactly one sentinel
// and DecodeHeader refuses no differently; an accepted batch re-encodes
// (Encode(meta from its header, its steps)) to bytes Decode accepts with an
// equal header and equal steps.
func checkDecode(t *testing.T, b []byte, lim Limits) {
	h, herr := DecodeHeader(b, lim)
	bt, err := Decode(b, lim)
	if err != nil {
		if s := sentinelsOf(err); len(s) != 1 {
			t.Fatalf("error wraps %d sentinels: %v", len(s), err)
		}
		if bt != nil {
			t.Fatalf("Decode returned a batch and %v", err)
		}
		if herr != nil && herr.Error() != err.Error() {
			t.Fatalf("DecodeHeader: %v\nDecode: %v", herr, err)
		}
		return
	}
	if herr != nil {
		t.Fatalf("DecodeHeader refuses what Decode accepts: %v", herr)
	}
	if !reflect.DeepEqual(h, bt.Header) {
		t.Fatalf("DecodeHeader = %+v, Decode = %+v", h, bt.Header)
	}
	b2, err := Encode(Meta{Created: bt.Header.Created, Policy: bt.Header.Policy}, bt.Steps)
	if err != nil {
		t.Fatalf("re-encoding an accepted batch: %v", err)
	}
	bt2, err := Decode(b2, Limits{})
	if err != nil {
		t.Fatalf("decoding the re-encoded batch: %v", err)
	}
	if !reflect.DeepEqual(bt.Header, bt2.Header) {
		t.Fatalf("header changed in re-encoding:\n got %+v\nwant %+v", bt2.Header, bt.Header)
	}
	if g, w := stepsJSON(t, bt2.Steps), stepsJSON(t, bt.Steps); g != w {
		t.Fatalf("steps changed in re-encoding:\n got %s\nwant %s", g, w)
	}
}
