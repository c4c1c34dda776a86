package chunks

import (
	"bytes"
	"testing"

	"github.com/clawmesh/clawmesh/mesh/member"
)

func FuzzParseManifest(f *testing.F) {
	w := newWorld(f)
	f.Add(w.manifest(f, []byte("a bundle"), 2, 1, 7).Marshal())
	m := w.manifest(f, []byte("a bundle"), 3, 1, 8)
	m.Evals = []Eval{{Task: evalTask, Prompts: 4, Passed: 3, MeanReward: 0.5}, {Task: "c", Prompts: 1, MeanReward: -1}}
	if err := m.Sign(w.trainer.key, w.cert, t0); err != nil {
		f.Fatal(err)
	}
	f.Add(m.Marshal())
	ps, vs := w.voters(f, 2, 3)
	c, _ := w.certified(f, vs, ps[:2], 4, 2, 9)
	f.Add(c.Marshal())
	f.Add([]byte(manifestMagicCert))
	f.Add([]byte(manifestMagic))
	f.Add([]byte(manifestMagicEval))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		if !bytes.Equal(m.Marshal(), b) {
			t.Fatal("a manifest that decodes re-encodes differently")
		}
		if len(m.Chunks) == 0 || uint64(len(m.Chunks)) != (m.Size+ChunkSize-1)/ChunkSize {
			t.Fatalf("%d chunks for %d bytes", len(m.Chunks), m.Size)
		}
		if m.Cert != nil && (m.Cert.Voters == nil || len(m.Cert.Votes) > member.MaxVoters) {
			t.Fatalf("a certification decoded with %d votes", len(m.Cert.Votes))
		}
		if len(m.Evals) > MaxEvals {
			t.Fatalf("%d evaluations", len(m.Evals))
		}
		for _, e := range m.Evals {
			if e.check() != nil || e.PassAt1() < 0 || e.PassAt1() > 1 {
				t.Fatalf("an evaluation out of bounds decoded: %+v", e)
			}
		}
	})
}
