package live

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/model/serveapi"
	"github.com/clawmesh/clawmesh/sim/live/scenario"
	"github.com/clawmesh/clawmesh/trainer"
)

// LoopReport is the time from a version's commit on the leader to the
// first reply a node served with it.
type LoopReport struct {
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
	r := LoopReport{Versions: versions}
	root, err := os.MkdirTemp("", "clawmesh-bench-loop-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(root)
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
	m, err := startMesh(ctx, root, recipeOptions{Recipe: "combined", Users: scenario.Users()[:1]}, &stops, func(string, ...any) {})
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
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get(serveapi.AdapterHeader), nil
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
				if got == name {
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
	s := slices.Clone(r.Seconds)
	slices.Sort(s)
	r.P50, r.Max = s[len(s)/2], s[len(s)-1]
	return r, nil
}
