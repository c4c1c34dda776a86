package live

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/sim/live/scenario"
	"github.com/clawmesh/clawmesh/trainer"
)

// LoopReport is the time from a version's commit on the leader to the
// first reply a node served with it.
type LoopReport struct {
	// Serve is the model server the node ran ("" for the tiny model
	// served in process, as `clawmesh serve --tiny`).
	Serve    string    `json:"serve,omitempty"`
	Versions int       `json:"versions"`
	Seconds  []float64 `json:"commit_to_first_reply_s"`
	P50      float64   `json:"p50_s"`
	Max      float64   `json:"max_s"`
}

// Loop runs the whole loop on loopback: a model server with the tiny
// model (as `clawmesh serve --tiny`), a node in front of it in a mesh,
// three trainers; for each of versions versions, it calls through the node
// until the trainers commit it, then times until the node's first reply
// served by it. progress, when not nil, gets a line per version.
func Loop(ctx context.Context, versions int, progress io.Writer) (LoopReport, error) {
	return LoopServing(ctx, LoopServe{}, versions, progress)
}

// LoopServe is the model server the node of LoopServing runs itself (as
// `clawmesh node --serve KIND`), on the tiny model.
type LoopServe struct {
	// Kind is "clawmesh" (clawmesh serve on the tiny model's directory)
	// or "llama-server" (llama-server on the tiny model as GGUF, each
	// version swapped in blue/green); "" serves the tiny model in process.
	Kind string
	// Bin is the server's program: for clawmesh, this program (required);
	// for llama-server, a llama-server (default: on PATH).
	Bin string
	// Args are more arguments for it.
	Args []string
}

// LoopServing is Loop with the node running its model server as s says.
func LoopServing(ctx context.Context, s LoopServe, versions int, progress io.Writer) (LoopReport, error) {
	r := LoopReport{Serve: s.Kind, Versions: versions}
	root, err := os.MkdirTemp("", "clawmesh-bench-loop-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(root)
	o := recipeOptions{Recipe: "combined", Users: scenario.Users()[:1]}
	if s.Kind != "" {
		if o.Serve, err = tinyServer(root, s); err != nil {
			return r, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var stops []func()
	defer func() {
		cancel()
		for _, s := range slices.Backward(stops) {
			s()
		}
	}()
	// The demo's mesh, with one user: one model server and one node in
	// front of it, three trainers.
	m, err := startMesh(ctx, root, o, &stops, func(string, ...any) {})
	if err != nil {
		return r, err
	}
	n, gw := m.nodes[0], m.gateways[0]+"/v1"
	var trs []*trainer.Trainer
	for _, t := range m.trainers {
		trs = append(trs, t.tr)
	}

	call := func(content string, done bool) (string, error) {
		body, _ := json.Marshal(map[string]any{"model": "tiny", "max_tokens": 8, "messages": []map[string]string{{"role": "user", "content": content}}})
		req, _ := http.NewRequestWithContext(ctx, "POST", gw+"/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if done {
			req.Header.Set("X-Session-Done", "true")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		if v := resp.Header.Get(serveapi.AdapterHeader); v != "" || s.Kind != modelserver.KindLlamaServer {
			io.Copy(io.Discard, resp.Body)
			return v, nil
		}
		// llama-server names no adapter; the node's log and route do. A
		// reply served by the version's process is what counts.
		var reply struct {
			Fingerprint string `json:"system_fingerprint"`
		}
		json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&reply)
		return reply.Fingerprint, nil
	}
	committed := func(v uint64) (time.Time, bool) {
		for _, tr := range trs {
			for _, ver := range tr.Lineage() {
				if ver.Version == v {
					return ver.At, true
				}
			}
		}
		return time.Time{}, false
	}
	for v := uint64(1); v <= uint64(versions); v++ {
		var at time.Time
		deadline := time.Now().Add(5 * time.Minute)
		for k := 0; ; k++ {
			if t, ok := committed(v); ok {
				at = t
				break
			}
			if time.Now().After(deadline) {
				return r, fmt.Errorf("v%d was not committed within 5 minutes", v)
			}
			if k%20 == 0 {
				if _, err := call(fmt.Sprintf("round %d, question %d: list the files", v, k), true); err != nil {
					return r, err
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		name := fmt.Sprint("v", v)
		deadline = time.Now().Add(2 * time.Minute)
		for {
			if time.Now().After(deadline) {
				st := n.Follower().Status()
				return r, fmt.Errorf("%s was not served within 2 minutes of its commit (serving %s, latest %q: %s)", name, st.Serving, st.Latest, st.Error)
			}
			if n.Follower().Route().Version == name {
				got, err := call("which version?", false)
				if err != nil {
					return r, err
				}
				if got == name || (s.Kind == modelserver.KindLlamaServer && strings.Contains(got, name+".gguf")) {
					break
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		d := time.Since(at)
		r.Seconds = append(r.Seconds, d.Seconds())
		if progress != nil {
			fmt.Fprintf(progress, "  %s: first reply %.2f s after its commit\n", name, d.Seconds())
		}
	}
	secs := slices.Clone(r.Seconds)
	slices.Sort(secs)
	r.P50, r.Max = secs[len(secs)/2], secs[len(secs)-1]
	return r, nil
}

// tinyServer writes the tiny model (the trainers' "tiny" base) where the
// server of s can load it, and returns the node's model server config.
func tinyServer(root string, s LoopServe) (*modelserver.Config, error) {
	if !slices.Contains(modelserver.Kinds(), s.Kind) || s.Kind == modelserver.KindMLX {
		return nil, fmt.Errorf("live: the loop runs clawmesh or llama-server, not %q", s.Kind)
	}
	dir := filepath.Join(root, "tiny")
	eng, txt, err := newTiny(native.Options{Seed: 1, Name: "tiny", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	err = eng.SaveModel(dir)
	eng.Close()
	if err != nil {
		return nil, err
	}
	if err := txt.Tokenizer.Save(filepath.Join(dir, modeldir.TokenizerFile)); err != nil {
		return nil, err
	}
	c := &modelserver.Config{Kind: s.Kind, Model: dir, Bin: s.Bin, Args: s.Args}
	if s.Kind == modelserver.KindClawmesh {
		if s.Bin == "" {
			return nil, errors.New("live: the loop with clawmesh serve needs the clawmesh program")
		}
		return c, nil
	}
	c.Model = filepath.Join(root, "tiny.gguf")
	if err := gguf.ExportBase(dir, c.Model, gguf.BaseOptions{Name: "tiny"}); err != nil {
		return nil, err
	}
	return c, nil
}
