package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/group"
)

// loopReport is the time from a version's commit on the leader to the
// first reply a node served with it.
type loopReport struct {
	Versions int       `json:"versions"`
	Seconds  []float64 `json:"commit_to_first_reply_s"`
	P50      float64   `json:"p50_s"`
	Max      float64   `json:"max_s"`
}

var loopbackListen = []string{"/ip4/127.0.0.1/udp/0/quic-v1", "/ip4/127.0.0.1/tcp/0"}

// benchLoop runs the whole loop on loopback: `clawmesh serve --tiny`, a
// node in front of it in a mesh, three trainers; for each version, calls
// through the node until the trainers commit it, then the time until the
// node's first reply served by it.
func benchLoop(ctx context.Context, versions int, progress io.Writer) (loopReport, error) {
	r := loopReport{Versions: versions}
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
	quiet := func(args ...string) (string, error) {
		var out, errs bytes.Buffer
		if code := run(ctx, args, &out, &errs); code != 0 {
			return "", fmt.Errorf("clawmesh %s: %s", strings.Join(args, " "), errs.String())
		}
		return strings.TrimSpace(out.String()), nil
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	modelAddr := ln.Addr().String()
	ln.Close()
	serveDone := make(chan int, 1)
	go func() {
		serveDone <- run(ctx, []string{"serve", "--tiny", "--listen", modelAddr, "--log", "error"}, io.Discard, io.Discard)
	}()
	stops = append(stops, func() { <-serveDone })
	for i := 0; ; i++ {
		if resp, err := http.Get("http://" + modelAddr + "/v1/models"); err == nil {
			resp.Body.Close()
			break
		}
		if i > 600 {
			return r, fmt.Errorf("the model server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}

	a := filepath.Join(root, "node")
	if _, err := quiet("mesh", "init", "--data", a); err != nil {
		return r, err
	}
	n, err := node.New(ctx, node.Config{DataDir: a, Upstream: "http://" + modelAddr + "/v1", UpstreamKind: "clawmesh", Share: share.Policy{Mode: share.ModeAll},
		ShareInterval: 50 * time.Millisecond, ScoreInterval: 50 * time.Millisecond,
		Mesh: &node.MeshConfig{Listen: loopbackListen, Ship: mesh.ShipOptions{Retry: 500 * time.Millisecond, MaxRetry: 2 * time.Second, Poll: 100 * time.Millisecond},
			Weights: "127.0.0.1:0", WeightsAnnounce: 300 * time.Millisecond, WeightsRetry: 300 * time.Millisecond}})
	if err != nil {
		return r, err
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	nodeDone := make(chan struct{})
	go func() { n.Serve(ctx, gln); close(nodeDone) }()
	stops = append(stops, func() { <-nodeDone; n.Close(context.Background()) })
	gw := "http://" + gln.Addr().String() + "/v1"

	timing := trainer.Timing{Heartbeat: 500 * time.Millisecond, Election: 500 * time.Millisecond, JoinWait: 2 * time.Second, Tick: 50 * time.Millisecond, VerifyRetry: 2 * time.Second}
	var trs []*trainer.Trainer
	for i := range 3 {
		d := filepath.Join(root, fmt.Sprint("trainer", i))
		tok, err := quiet("invite", "--role", "trainer", "--data", a)
		if err != nil {
			return r, err
		}
		if _, err := quiet("join", tok, "--data", d, "--p2p-listen", loopbackListen[1]); err != nil {
			return r, err
		}
		tr, err := trainer.New(ctx, trainer.Config{DataDir: d, Listen: loopbackListen, Bootstrap: n.Peer().Host.Addrs(), Timing: timing,
			Group: group.Config{Deadline: 5 * time.Second, LocalSteps: 1}, Weights: "127.0.0.1:0", WeightsAnnounce: 300 * time.Millisecond})
		if err != nil {
			return r, err
		}
		done := make(chan struct{})
		go func() { tr.Run(ctx); close(done) }()
		stops = append(stops, func() { <-done; tr.Close() })
		trs = append(trs, tr)
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
		return resp.Header.Get("X-Clawmesh-Adapter"), nil
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
