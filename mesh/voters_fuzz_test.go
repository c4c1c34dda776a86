package mesh

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// FuzzTakeVoters: whatever a hello's voter set field holds, taking it in
// never panics, and adopts nothing but a set the mesh's admin signed.
func FuzzTakeVoters(f *testing.F) {
	admin, err := member.NewKey(rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	voter, _ := member.NewKey(rand.Reader)
	genuine, err := member.NewVoterSet(admin, 3, []member.Voter{{Peer: "12D3KooWvoter", Key: voter.Public().(ed25519.PublicKey)}}, time.Unix(1e9, 0))
	if err != nil {
		f.Fatal(err)
	}
	forged, _ := member.NewVoterSet(voter, 4, nil, time.Unix(1e9, 0))
	f.Add(hex.EncodeToString(genuine.Marshal()))
	f.Add(hex.EncodeToString(forged.Marshal()))
	f.Add("0153")
	f.Add("zz")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, s string) {
		m := &Mesh{cfg: Config{DataDir: dir}, admin: admin.Public().(ed25519.PublicKey), log: slog.New(slog.DiscardHandler)}
		m.takeVoters("12D3KooWpeer", s)
		if vs := m.Voters(); vs != nil && vs.Hash() != genuine.Hash() {
			t.Fatalf("adopted a set the admin did not sign: %x", vs.Marshal())
		}
	})
}
