package pool

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/clawmesh/clawmesh/internal/core"
)

// IngestResult is what BenchIngest measured.
type IngestResult struct {
	Writers     int           `json:"writers"`
	Steps       int           `json:"steps"`
	Elapsed     time.Duration `json:"elapsed_ns"`
	StepsPerSec float64       `json:"steps_per_sec"`
	P50         time.Duration `json:"p50_ns"` // Put latency
	P99         time.Duration `json:"p99_ns"`
	// WALBytes is what the run wrote to Pebble's write-ahead log, per
	// step: the size of one step's synced write.
	WALBytes int   `json:"wal_bytes_per_step"`
	Stats    Stats `json:"stats"` // the pool afterwards (BenchIngest)
}

// BenchIngest opens (creating) a pool in dir and measures synced Puts of
// realistic steps: conversations that resend a 40,000-character system
// prompt, a dozen tools and their growing history at every call. Each of
// the writers goroutines is an agent: it takes the next conversation and
// puts its steps (twelve calls) in order, each once the one before is
// stored, as the calls of a conversation follow one another. It uses the
// wall clock; dir should be a fresh directory on the disk to be measured.
func BenchIngest(ctx context.Context, dir string, writers, steps int) (IngestResult, error) {
	if writers <= 0 || steps <= 0 {
		return IngestResult{}, fmt.Errorf("pool: bench: writers and steps must be positive, got %d and %d", writers, steps)
	}
	p, err := Open(dir, Options{})
	if err != nil {
		return IngestResult{}, err
	}
	defer p.Close()

	const perSession = 12
	gen := NewStepGen("bench", perSession)
	lat := make([]time.Duration, steps)
	var next atomic.Int64 // the next conversation
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				sess := int(next.Add(1) - 1)
				first := sess * perSession
				if first >= steps {
					return
				}
				for t, s := range gen.Session(sess, steps-first) {
					i := first + t
					t0 := time.Now()
					if err := p.Put(ctx, s); err != nil {
						errs <- err
						return
					}
					lat[i] = time.Since(t0)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return IngestResult{}, fmt.Errorf("pool: bench: %w", err)
	}
	res := ingestResult(writers, elapsed, lat)
	in, leave, err := p.enter(ctx)
	if err != nil {
		return res, err
	}
	res.WALBytes = int(in.db.Metrics().WAL.BytesIn / uint64(steps))
	leave()
	if res.Stats, err = p.Stats(ctx); err != nil {
		return res, err
	}
	return res, nil
}

// StepValues returns the JSON of the first n steps of a StepGen like
// BenchIngest's: the steps as an agent's calls carry them, whole, for
// BenchPebble to store as they are.
func StepValues(n int) ([][]byte, error) {
	gen := NewStepGen("bench", 12)
	out := make([][]byte, n)
	for i := range out {
		b, err := json.Marshal(gen.Step(i))
		if err != nil {
			return nil, err
		}
		out[i] = b
	}
	return out, nil
}

func ingestResult(writers int, elapsed time.Duration, lat []time.Duration) IngestResult {
	slices.Sort(lat)
	return IngestResult{
		Writers:     writers,
		Steps:       len(lat),
		Elapsed:     elapsed,
		StepsPerSec: float64(len(lat)) / elapsed.Seconds(),
		P50:         lat[len(lat)/2],
		P99:         lat[min(len(lat)-1, len(lat)*99/100)],
	}
}

// BenchPebble is BenchIngest's baseline: bare Pebble (its default options)
// in dir, where writers goroutines commit synced batches of one new key
// each, as many concurrent writers of the same disk commit them. The value
// written for write i is values[i%len(values)], or, with values nil, size
// bytes. Nothing is read, encoded or indexed in the timed loop.
func BenchPebble(ctx context.Context, dir string, writers, writes int, values [][]byte, size int) (IngestResult, error) {
	if writers <= 0 || writes <= 0 || size < 0 {
		return IngestResult{}, fmt.Errorf("pool: bench: writers and writes must be positive and size not negative, got %d, %d and %d", writers, writes, size)
	}
	db, err := pebble.Open(dir, &pebble.Options{Logger: quietLogger{}})
	if err != nil {
		return IngestResult{}, fmt.Errorf("pool: bench: %w", err)
	}
	defer db.Close()
	if values == nil {
		value := make([]byte, size)
		for i := range value {
			value[i] = byte('a' + i%26)
		}
		values = [][]byte{value}
	}
	lat := make([]time.Duration, writes)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	start := time.Now()
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := make([]byte, 0, 16)
			for {
				i := int(next.Add(1)) - 1
				if i >= writes || ctx.Err() != nil {
					return
				}
				key = binary.BigEndian.AppendUint64(append(key[:0], 'k'), uint64(i))
				t0 := time.Now()
				if err := db.Set(key, values[i%len(values)], pebble.Sync); err != nil {
					errs <- err
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return IngestResult{}, fmt.Errorf("pool: bench: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return IngestResult{}, err
	}
	res := ingestResult(writers, elapsed, lat)
	res.WALBytes = int(db.Metrics().WAL.BytesIn / uint64(writes))
	return res, nil
}

// StepGen makes realistic synthetic steps, deterministically from an index:
// step i belongs to session i/PerSession and carries that conversation's
// shared system prompt (about 40,000 characters), twelve tools and a history
// that grows by a user message and an assistant reply per step. Steps of
// different sessions share the system prompt and tools too, as the calls of
// one agent do. It is used by BenchIngest, the benchmarks and tests.
type StepGen struct {
	Prefix     string // id and session prefix
	PerSession int    // steps per session
	Base       time.Time
	system     string
	tools      []core.Tool
}

// NewStepGen returns a generator whose ids start with prefix.
func NewStepGen(prefix string, perSession int) *StepGen {
	var sb strings.Builder
	for i := 0; sb.Len() < 40000; i++ {
		fmt.Fprintf(&sb, "Rule %d: when the user asks about topic %d, consult the notes in section %d, "+
			"cite them, and keep the answer short unless asked otherwise.\n", i, i*7%97, i%13)
	}
	tools := make([]core.Tool, 12)
	for i := range tools {
		params, _ := json.Marshal(map[string]any{
			"type": "object",
			"properties": map[string]any{
				"path":  map[string]string{"type": "string", "description": "file path"},
				"query": map[string]string{"type": "string", "description": "what to look for"},
			},
			"required": []string{"path"},
		})
		tools[i] = core.Tool{
			Name:        fmt.Sprintf("tool_%02d", i),
			Description: fmt.Sprintf("Tool number %d: reads, searches or edits the workspace.", i),
			Parameters:  params,
		}
	}
	return &StepGen{
		Prefix:     prefix,
		PerSession: max(perSession, 1),
		Base:       time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		system:     sb.String(),
		tools:      tools,
	}
}

// Messages returns the request messages of turn turn of session sess: the
// system prompt, the earlier turns (user message and reply) and the turn's
// user message.
func (g *StepGen) Messages(sess, turn int) []core.Message {
	return g.messages(sess, turn, nil)
}

// sessionTurns holds the user messages and replies of one session made so
// far, for a caller making its steps in order (StepGen.Session).
type sessionTurns struct {
	users   []string
	replies []core.Message
}

func (g *StepGen) messages(sess, turn int, c *sessionTurns) []core.Message {
	msgs := make([]core.Message, 0, 2*turn+2)
	msgs = append(msgs, core.Message{Role: core.RoleSystem, Content: g.system})
	for t := 0; t <= turn; t++ {
		msgs = append(msgs, core.Message{Role: core.RoleUser, Content: c.user(g, sess, t)})
		if t < turn {
			msgs = append(msgs, c.reply(g, sess, t))
		}
	}
	return msgs
}

func (c *sessionTurns) user(g *StepGen, sess, turn int) string {
	if c == nil {
		return g.user(sess, turn)
	}
	for len(c.users) <= turn {
		c.users = append(c.users, g.user(sess, len(c.users)))
	}
	return c.users[turn]
}

func (c *sessionTurns) reply(g *StepGen, sess, turn int) core.Message {
	if c == nil {
		return g.reply(sess, turn)
	}
	for len(c.replies) <= turn {
		c.replies = append(c.replies, g.reply(sess, len(c.replies)))
	}
	return c.replies[turn]
}

// Session returns the steps of session sess, first to n-1 (at most
// PerSession), equal to what Step returns for them; the steps share their
// messages' strings, made once.
func (g *StepGen) Session(sess, n int) []*core.Step {
	c := new(sessionTurns)
	steps := make([]*core.Step, min(n, g.PerSession))
	for t := range steps {
		steps[t] = g.step(sess*g.PerSession+t, c)
	}
	return steps
}

// Tools returns the tools every request offers (shared, not to be
// modified).
func (g *StepGen) Tools() []core.Tool { return g.tools }

// Reply returns the assistant's reply at turn turn of session sess.
func (g *StepGen) Reply(sess, turn int) core.Message { return g.reply(sess, turn) }

// Step returns step i.
func (g *StepGen) Step(i int) *core.Step { return g.step(i, nil) }

func (g *StepGen) step(i int, c *sessionTurns) *core.Step {
	sess, turn := i/g.PerSession, i%g.PerSession
	msgs := g.messages(sess, turn, c)
	var next *core.NextState
	if turn+1 < g.PerSession {
		next = &core.NextState{Messages: []core.Message{{Role: core.RoleUser, Content: c.user(g, sess, turn+1)}}}
	}
	state := core.StateOpen
	if next != nil {
		state = core.StateClosed
	}
	return &core.Step{
		ID:        core.StepID(fmt.Sprintf("%s-%06d-%03d", g.Prefix, sess, turn)),
		SessionID: core.SessionID(fmt.Sprintf("%s-s%06d", g.Prefix, sess)),
		Turn:      core.TurnMain,
		API:       core.APIChat,
		State:     state,
		Request:   core.Request{Model: "qwen3-8b", Messages: msgs, Tools: g.tools, Params: json.RawMessage(`{"temperature":0.7}`)},
		Response: core.Response{
			ID:      fmt.Sprintf("chatcmpl-%d", i),
			Model:   "qwen3-8b",
			Choices: []core.Choice{{Index: 0, Message: c.reply(g, sess, turn), FinishReason: "stop"}},
			Usage:   &core.Usage{PromptTokens: 10000 + 200*turn, CompletionTokens: 120, TotalTokens: 10120 + 200*turn},
			Status:  200,
		},
		Model:     "qwen3-8b",
		Timings:   core.Timings{Start: g.Base.Add(time.Duration(i) * time.Second), TTFT: 150 * time.Millisecond, Total: 2 * time.Second},
		NextState: next,
		Source:    "gateway",
	}
}

func (g *StepGen) user(sess, turn int) string {
	return fmt.Sprintf("Session %d, turn %d: please look at file src/module_%d.go and explain what function f%d does.", sess, turn, turn%17, sess*31+turn)
}

var replyTail = strings.Repeat("then transforms the records and returns them. ", 8)

func (g *StepGen) reply(sess, turn int) core.Message {
	return core.Message{
		Role:    core.RoleAssistant,
		Content: fmt.Sprintf("In session %d at turn %d: f%d validates its input, %s", sess, turn, sess*31+turn, replyTail),
	}
}
