package modelserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clawmesh/clawmesh/model/serve/servetest"
	"github.com/clawmesh/clawmesh/node/modelserver"
)

// BenchmarkMLXVersionToReply is the time from a version arriving (the
// driver's Load) to the first reply served with it, for mlx_lm.server
// (a stand-in that answers at once: what is measured is the node's part,
// the mlx-lm copy of the tiny model's adapter, the warm-up and one call
// through the supervisor's proxy, not mlx-lm's own adapter load). Reports
// the median (p50-ms) over b.N versions.
func BenchmarkMLXVersionToReply(b *testing.B) {
	b.Setenv(childEnv, "1")
	dir := b.TempDir()
	model := filepath.Join(dir, "model")
	if err := os.WriteFile(model, nil, 0o600); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	s, err := modelserver.Start(ctx, modelserver.Config{Kind: modelserver.KindMLX, Model: model, Bin: os.Args[0], Dir: dir})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	drv, err := s.Driver()
	if err != nil {
		b.Fatal(err)
	}
	tiny := servetest.Start(b, "", 1)
	src := tiny.Adapter(b, 2, 0.1)
	// A directory per version, as the node installs them.
	dirs := make([]string, b.N)
	for i := range dirs {
		dirs[i] = filepath.Join(b.TempDir(), fmt.Sprintf("v%d", i+1))
		if err := os.CopyFS(dirs[i], os.DirFS(src)); err != nil {
			b.Fatal(err)
		}
	}
	var took []time.Duration
	b.ResetTimer()
	for i := range b.N {
		v := fmt.Sprintf("v%d", i+1)
		start := time.Now()
		tg, err := drv.Load(ctx, v, dirs[i])
		if err == nil {
			err = drv.Warm(ctx, tg)
		}
		if err != nil {
			b.Fatal(err)
		}
		// The call as the gateway sends it: the Target's fields set.
		body := map[string]any{"model": tg.Model, "max_tokens": 2, "messages": []map[string]string{{"role": "user", "content": "hi"}}}
		if err := json.Unmarshal([]byte(tg.Fields), &body); err != nil {
			b.Fatal(err)
		}
		bb, _ := json.Marshal(body)
		resp, err := http.Post(s.Upstream()+"/chat/completions", "application/json", bytes.NewReader(bb))
		if err != nil {
			b.Fatal(err)
		}
		var r struct {
			Choices []struct{ Message struct{ Content string } }
		}
		json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if len(r.Choices) == 0 || !strings.Contains(r.Choices[0].Message.Content, dirs[i]) {
			b.Fatalf("first reply after %s: %+v", v, r)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
}
