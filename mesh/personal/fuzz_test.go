package personal

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
)

// fuzzLimits keep the fuzzers' work small.
var fuzzLimits = Limits{MaxSteps: 8, MaxStepBytes: 64 << 10, MaxConfig: 4 << 10, MaxWeights: 64 << 10}

// requestBytes is a request as a device sends it: the header, then the
// four parts.
func requestBytes(t testing.TB, j core.PersonalJob) []byte {
	t.Helper()
	p, err := Client{}.prepare(j, fuzzLimits.withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	head, err := encodeMsg(request{Device: "12D3KooWdevice", Nonce: strings.Repeat("0f", nonceSize), SharedVersion: j.SharedVersion, Seed: j.Seed,
		Steps: int64(len(p.steps)), HeldBack: int64(len(p.heldBack)), Config: int64(len(p.config)), Weights: p.weightsSize})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	buf.Write(head)
	if err := sendJob(&buf, p); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzRequest reads a request as a trainer does: it must refuse what is
// not one, and a job it reads must be within the limits.
func FuzzRequest(f *testing.F) {
	prev := f.TempDir()
	if err := writeAdapter(prev, "prev"); err != nil {
		f.Fatal(err)
	}
	dir := filepath.Join(f.TempDir(), "out")
	f.Add(requestBytes(f, core.PersonalJob{Steps: steps(2, "a"), Out: dir}))
	f.Add(requestBytes(f, core.PersonalJob{Steps: steps(3, "a"), HeldBack: steps(2, "h"), SharedVersion: "v3", Seed: 7, Prev: prev, Out: dir}))
	f.Add([]byte{0x80, 0x80, 0x80, 0x01})
	f.Add([]byte("\x02{}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		var req request
		if _, err := readMsg(br, &req); err != nil {
			return
		}
		if err := req.check(fuzzLimits); err != nil {
			return
		}
		j, err := readJob(br, &req, fuzzLimits, t.TempDir())
		if err != nil {
			if !errors.Is(err, ErrMessage) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("an error that says nothing of the request: %v", err)
			}
			return
		}
		if len(j.Steps) == 0 || len(j.Steps) > fuzzLimits.MaxSteps || len(j.HeldBack) > fuzzLimits.MaxSteps {
			t.Fatalf("a job of %d steps and %d held back", len(j.Steps), len(j.HeldBack))
		}
		for _, s := range append(j.Steps, j.HeldBack...) {
			if err := s.Validate(); err != nil {
				t.Fatalf("a step that does not validate: %v", err)
			}
		}
		if (j.Prev != "") != (req.Config > 0) {
			t.Fatalf("previous adapter %q for %d config bytes", j.Prev, req.Config)
		}
		if j.Prev != "" {
			fi, err := os.Stat(filepath.Join(j.Prev, WeightsFile))
			if err != nil || fi.Size() != req.Weights {
				t.Fatalf("the previous adapter's weights: %v", err)
			}
		}
	})
}

// fixedMesh is a membership of one peer, for the decoders alone.
type fixedMesh mesh.PeerID

func (m fixedMesh) ID() mesh.PeerID                   { return mesh.PeerID(m) }
func (fixedMesh) Peer(mesh.PeerID) (*mesh.Peer, bool) { return nil, false }

// FuzzReply reads a trainer's reply to a job as a device does: it must
// refuse what is not one, and write an adapter only when the reply is
// signed for this job.
func FuzzReply(f *testing.F) {
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, ed25519.SeedSize))
	const trainer, device = mesh.PeerID("12D3KooWtrainer"), mesh.PeerID("12D3KooWdevice")
	req := request{Device: string(device), Nonce: strings.Repeat("0f", nonceSize), Steps: 100}
	reqSum := sha256.Sum256([]byte("the request"))
	signed := func(res core.PersonalResult, cfg, weights []byte) []byte {
		sig := ed25519.Sign(key, signedReply(trainer, device, req.Nonce, reqSum, sha256.Sum256(cfg), sha256.Sum256(weights), res))
		head, err := encodeMsg(reply{Status: statusOK, Result: &res, Config: int64(len(cfg)), Weights: int64(len(weights)), Sig: hexSig(sig)})
		if err != nil {
			f.Fatal(err)
		}
		return append(append(head, cfg...), weights...)
	}
	f.Add(signed(core.PersonalResult{Trained: 3, HeldBack: 1, ScoreBefore: 0, ScoreAfter: 1, Seconds: 2}, []byte(`{"r":4}`), safetensors("x", 16)))
	f.Add(signed(core.PersonalResult{Trained: 1, ScoreBefore: -1, ScoreAfter: -1}, []byte(`{}`), safetensors("", 0)))
	bad, _ := encodeMsg(reply{Status: statusBusy, Error: "later"})
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bufio.NewReader(bytes.NewReader(b))
		var rep reply
		if _, err := readMsg(br, &rep); err != nil {
			return
		}
		if rep.Status != statusOK {
			if err := statusErr(rep.Status, rep.Error); err == nil {
				t.Fatal("a refusal that is no error")
			}
			return
		}
		if err := rep.checkOK(fuzzLimits); err != nil {
			return
		}
		out := filepath.Join(t.TempDir(), "out")
		err := Client{Mesh: fixedMesh(device)}.receive(br, trainer, key.Public().(ed25519.PublicKey), &req, reqSum, &rep, out)
		_, statErr := os.Stat(out)
		if err != nil {
			if statErr == nil {
				t.Fatalf("a refused reply left an adapter: %v", err)
			}
			return
		}
		cfg, err := os.ReadFile(filepath.Join(out, ConfigFile))
		if err != nil || int64(len(cfg)) != rep.Config {
			t.Fatalf("the adapter written: %v", err)
		}
		w, err := os.ReadFile(filepath.Join(out, WeightsFile))
		sig, _ := hex.DecodeString(rep.Sig)
		if err != nil || !ed25519.Verify(key.Public().(ed25519.PublicKey), signedReply(trainer, device, req.Nonce, reqSum, sha256.Sum256(cfg), sha256.Sum256(w), *rep.Result), sig) {
			t.Fatal("an adapter written that the signature does not cover")
		}
	})
}
