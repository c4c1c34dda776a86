package mesh

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/mesh/member"
)

// FuzzAdmitMessages: whatever a peer sends in the admit or redeem
// protocol, the decoders it reaches (the framing, the proof, the
// certificate, the revocations, a refusal's revocation) neither panic nor
// take a stranger's proof, and the answer to a refused peer names no
// member.
func FuzzAdmitMessages(f *testing.F) {
	data := f.TempDir()
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	id := PeerID("12D3KooWFuzzSelf")
	if _, err := Init(data, "fuzz", key, id, time.Now(), rand.Reader); err != nil {
		f.Fatal(err)
	}
	m, err := New(Config{DataDir: data, Key: key, KeyOf: func(PeerID) (ed25519.PublicKey, error) {
		return nil, errors.New("fuzz: no key")
	}})
	if err != nil {
		f.Fatal(err)
	}
	const stranger = PeerID("12D3KooWFuzzStranger")
	r, err := member.NewRevocation(key, nil, string(stranger), "fuzz", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	l := member.NewRevocationList(pub)
	l.Add(r)
	var buf bytes.Buffer
	for _, h := range []any{
		hello{},
		hello{Proof: hex.EncodeToString(m.proof(stranger, id))},
		hello{Cert: m.certHello().Cert, Revocations: hex.EncodeToString(l.Marshal()), Addrs: []string{"/ip4/127.0.0.1/tcp/1/p2p/x"}, Peers: [][]string{{"a"}}},
		redeemReply{Error: "no", Revocation: hex.EncodeToString(r.Marshal())},
	} {
		buf.Reset()
		writeMsg(&buf, h)
		f.Add(buf.Bytes())
	}
	f.Add([]byte{2, '{', '}'})
	f.Add(append([]byte{20}, `{"proof":"zz","x":1}`...))
	f.Fuzz(func(t *testing.T, b []byte) {
		var h hello
		if readMsg(bufio.NewReader(bytes.NewReader(b)), &h, maxMsg) == nil {
			if m.proofHolds(h.Proof, stranger, id) && !strings.EqualFold(h.Proof, hex.EncodeToString(m.proof(stranger, id))) {
				t.Fatalf("proof %q taken", h.Proof)
			}
			m.takeRevocations(h)
			m.verifyPeerCert(stranger, h.Cert)
			var shown *member.Certificate
			if c, err := hex.DecodeString(h.Cert); err == nil {
				shown, _ = member.ParseCertificate(c)
			}
			if told := m.tellHello(stranger, shown); told.Cert != "" || len(told.Addrs) > 0 || len(told.Peers) > 0 || told.Proof != "" {
				t.Fatalf("a refused peer told %+v", told)
			}
		}
		var rep redeemReply
		if readMsg(bufio.NewReader(bytes.NewReader(b)), &rep, maxMsg) == nil {
			if r, err := removal(rep.Revocation, pub, stranger); err == nil && r.Subject() != string(stranger) {
				t.Fatalf("a revocation of %s taken for %s", r.Subject(), stranger)
			}
		}
	})
}
