package share

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/node/scrub"
	"github.com/clawmesh/clawmesh/node/scrub/corpus"
	"github.com/clawmesh/clawmesh/pool"
)

// BenchResult is what `clawmesh bench scrub` measures.
type BenchResult struct {
	Corpus *corpus.Result
	// HeldOut is the measure on the held-out part of the corpus, which the
	// detectors were not tuned on.
	HeldOut *corpus.Result
	// CorpusMBps is the scrubber's rate on the corpus text; CleanMBps on
	// an agent's system prompt with nothing to find.
	CorpusMBps, CleanMBps float64
	// StepBytes is the JSON size of the agent-sized step.
	StepBytes int
	// Encode is the baseline: encoding the step as JSON, as the batch
	// writer does anyway. Cold is scrubbing it alone (a new Pass);
	// InBatch is the cost per step of scrubbing a batch of BatchSteps
	// steps of BatchSessions sessions with one Pass.
	Encode, Cold, InBatch      time.Duration
	BatchSteps, BatchSessions  int
	Prepare                    time.Duration // Outbox.Prepare of that batch from a Pebble pool
	PayloadBytes, PreparedJSON int
}

// BenchScrub measures the scrubber: recall and precision on the labelled
// corpus, its rate on text, and what scrubbing an agent-sized step costs
// alone and in a batch, against encoding the step as JSON, measured in the
// same run; and the outbox preparing a batch from a pool on disk.
func BenchScrub(ctx context.Context, minTime time.Duration) (*BenchResult, error) {
	if minTime <= 0 {
		minTime = time.Second
	}
	r := &BenchResult{BatchSteps: 64, BatchSessions: 4}
	docs, err := corpus.Load()
	if err != nil {
		return nil, err
	}
	if r.Corpus, err = corpus.Evaluate(docs); err != nil {
		return nil, err
	}
	held, err := corpus.LoadHeldOut()
	if err != nil {
		return nil, err
	}
	if r.HeldOut, err = corpus.Evaluate(held); err != nil {
		return nil, err
	}
	plain, err := scrub.New(scrub.Options{})
	if err != nil {
		return nil, err
	}
	r.CorpusMBps = rate(minTime, func() int {
		n := 0
		for _, d := range docs {
			plain.Find(d.Text)
			n += len(d.Text)
		}
		return n
	})
	gen := pool.NewStepGen("bench", 16)
	system := gen.Messages(0, 0)[0].Content
	r.CleanMBps = rate(minTime, func() int { plain.Find(system); return len(system) })

	steps := benchSteps(gen, r.BatchSessions*16)
	one := steps[7] // 16 messages: the system prompt and 7 turns and a question
	raw, _ := json.Marshal(one)
	r.StepBytes = len(raw)
	key := make([]byte, 32)
	opts := &scrub.StepOptions{Key: key, Tools: []string{"*"}}
	r.Encode = per(minTime, func() { json.Marshal(one) })
	r.Cold = per(minTime, func() { plain.NewPass().Step(&scrub.Table{}, one, opts) })
	batch := steps[:r.BatchSteps]
	r.InBatch = per(minTime, func() {
		p := plain.NewPass()
		tables := map[core.SessionID]*scrub.Table{}
		for _, s := range batch {
			t := tables[s.SessionID]
			if t == nil {
				t = &scrub.Table{}
				tables[s.SessionID] = t
			}
			p.Step(t, s, opts)
		}
	}) / time.Duration(len(batch))

	dir, err := os.MkdirTemp("", "clawmesh-bench-scrub-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	pl, err := pool.Open(dir, pool.Options{})
	if err != nil {
		return nil, err
	}
	defer pl.Close()
	for _, s := range batch {
		s.State = core.StateScored
		v := 1.0
		s.Reward = &core.Reward{Value: &v, Scores: []core.Score{{Plugin: "p", Hash: "h", Value: &v, Weight: 1}}}
		if err := pl.Put(ctx, s); err != nil {
			return nil, err
		}
	}
	ob, err := New(Options{Pool: pl, Key: key, Policy: Policy{Mode: ModeScored, Tools: []string{"*"}}, MaxSteps: r.BatchSteps})
	if err != nil {
		return nil, err
	}
	var pr *Prepared
	r.Prepare = per(minTime, func() { pr, err = ob.Prepare(ctx) })
	if err != nil {
		return nil, err
	}
	if pr == nil || len(pr.Steps) != r.BatchSteps {
		return nil, fmt.Errorf("share: bench: the outbox prepared %v", pr)
	}
	r.PayloadBytes = len(pr.Payload)
	for _, s := range pr.Scrubbed {
		b, _ := json.Marshal(s)
		r.PreparedJSON += len(b) + 1
	}
	return r, nil
}

// benchSteps returns n agent-sized steps, 16 per session, with personal
// data in the user's messages and the tool results, as agents send them.
func benchSteps(gen *pool.StepGen, n int) []*core.Step {
	out := make([]*core.Step, n)
	for i := range out {
		s := gen.Step(i)
		sess, turn := i/16, i%16
		for j := range s.Request.Messages {
			m := &s.Request.Messages[j]
			if m.Role == core.RoleUser {
				m.Content += fmt.Sprintf(" Reply to dev%d@example.org or +44 20 7946 %04d; the file is /home/dev%d/src/main.go.", sess, 1000+sess, sess)
			}
		}
		s.Request.Messages = append(s.Request.Messages, core.Message{Role: core.RoleAssistant, ToolCalls: []core.ToolCall{{ID: "c", Name: "tool_00", Arguments: fmt.Sprintf(`{"path":"/home/dev%d/.env"}`, sess)}}},
			core.Message{Role: core.RoleTool, ToolCallID: "c", Content: fmt.Sprintf("DB_PASSWORD=Secret-%d-Turn-%d\nAPI_URL=https://api.example.com\nDEBUG=false", sess, turn)})
		out[i] = s
	}
	return out
}

// per runs fn until minTime has passed and returns its mean duration.
func per(minTime time.Duration, fn func()) time.Duration {
	fn() // warm up
	start := time.Now()
	n := 0
	for time.Since(start) < minTime || n < 3 {
		fn()
		n++
	}
	return time.Since(start) / time.Duration(n)
}

// rate runs fn (which returns the bytes it handled) until minTime has passed
// and returns MB/s.
func rate(minTime time.Duration, fn func() int) float64 {
	fn()
	start := time.Now()
	bytes := 0
	for time.Since(start) < minTime {
		bytes += fn()
	}
	return float64(bytes) / time.Since(start).Seconds() / 1e6
}

// Print writes r for people.
func (r *BenchResult) Print(w io.Writer) {
	goals := func(bad []string) {
		for _, b := range bad {
			fmt.Fprintf(w, "  BELOW GOAL: %s\n", b)
		}
		if len(bad) == 0 {
			fmt.Fprintln(w, "every goal met")
		}
	}
	fmt.Fprintln(w, "scrubber on the labelled corpus, tuned part (node/scrub/corpus/files):")
	r.Corpus.Print(w)
	goals(r.Corpus.Check())
	if r.HeldOut != nil {
		fmt.Fprintln(w, "\nscrubber on the labelled corpus, held-out part, not tuned on (node/scrub/corpus/heldout):")
		r.HeldOut.PrintHeldOut(w)
		goals(r.HeldOut.CheckHeldOut())
	}
	fmt.Fprintf(w, "\nrate: %.0f MB/s on the corpus text, %.0f MB/s on an agent's system prompt with nothing to find\n", r.CorpusMBps, r.CleanMBps)
	fmt.Fprintf(w, "\nan agent-sized step (40,000-character system prompt, 12 tools, 16 messages and a tool result; %d KB of JSON):\n", r.StepBytes/1000)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }
	fmt.Fprintf(w, "  encoding it as JSON (baseline)     %s\n", ms(r.Encode))
	fmt.Fprintf(w, "  scrubbing it alone                 %s  (%.1fx the encoding)\n", ms(r.Cold), float64(r.Cold)/float64(r.Encode))
	fmt.Fprintf(w, "  scrubbing it in a batch            %s  (%.2fx the encoding; %d steps of %d sessions, one pass; goal < 1 ms)\n",
		ms(r.InBatch), float64(r.InBatch)/float64(r.Encode), r.BatchSteps, r.BatchSessions)
	fmt.Fprintf(w, "  the outbox preparing that batch    %s  (%s a step: read from Pebble, scrub, encode; %d KB of steps in %d KB, zstd)\n",
		ms(r.Prepare), ms(r.Prepare/time.Duration(r.BatchSteps)), r.PreparedJSON/1000, r.PayloadBytes/1000)
}
