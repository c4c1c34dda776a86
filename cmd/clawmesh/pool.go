package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/internal/datadir"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/scrub"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
)

const poolHelp = `Usage: clawmesh pool <stats|ls|show|export|import|preview|repair> [flags]

Reads and feeds the DataPool, the record of every LLM call a node made.

  clawmesh pool stats                         counts by state, sessions, storage
  clawmesh pool ls [--session S] [--state closed] [--limit 50]
  clawmesh pool show STEP_ID                  one step: context, reply, next state, scores, hints
  clawmesh pool export [--session S] > steps.jsonl
  clawmesh pool import logs.jsonl             black-box offline mode: logs collected elsewhere
  clawmesh pool repair [--json]               salvage a damaged pool: moves it aside (never
                                              deleted), copies every step it can read into a
                                              fresh pool, reports what it could not read
  clawmesh pool preview [--limit 5] [--json]  the next batch exactly as it would leave this
                                              device, decoded: scrubbed, ids hashed, times
                                              rounded to the hour, under the [share] policy

Steps move open → closed → scored → batched → shipped; scored steps the
sharing policy keeps on the device move to held instead. A call the LLM
server refused or could not be reached for is failed: kept for a look
(--state failed), never scored, batched or shipped.

The JSONL schema (clawmesh.step/v1) is described in docs/step-schema.md.

While a node is running it holds the pool open; these commands then ask it
through its admin API instead: its owner-only socket DATA/admin.sock, else
its loopback listener with the owner's token (DATA/admin.token, read by
itself), so export and import work in both cases.
`

// poolAccess is what the pool commands need; *pool.Pool serves it for a
// stopped node, *node.Client for a running one.
type poolAccess interface {
	Stats(ctx context.Context) (pool.Stats, error)
	List(ctx context.Context, f pool.Filter) ([]*core.Step, error)
	Get(ctx context.Context, id core.StepID) (*core.Step, error)
	Export(ctx context.Context, w io.Writer, f pool.Filter) (int, error)
	Import(ctx context.Context, r io.Reader) (pool.ImportReport, error)
	Preview(ctx context.Context, limit int) (*share.Preview, error)
}

// localPool is a pool this process opened (no node runs): the outbox it
// previews is made from the config file's policy and the device's key.
type localPool struct {
	*pool.Pool
	s *settings
}

func (l localPool) Preview(ctx context.Context, limit int) (*share.Preview, error) {
	key, err := share.LoadKey(l.s.Data)
	if err != nil {
		return nil, err
	}
	pol := l.s.Share
	if pol.Mode == "" {
		pol.Mode = share.DefaultMode(false)
	}
	ob, err := share.New(share.Options{Pool: l.Pool, Key: key, Policy: pol})
	if err != nil {
		return nil, err
	}
	return ob.Preview(ctx, limit)
}

// openPool opens the pool under s.Data, or reaches the running node that
// holds it. create allows making a new pool (import does).
func openPool(s *settings, create bool) (poolAccess, func(), error) {
	dir := filepath.Join(s.Data, datadir.NodeMark)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if !create && datadir.Is(s.Data, datadir.TrainerMark) {
			return nil, nil, withHint(fmt.Errorf("%s is a trainer's data directory (it holds a trainer's batch store, %s/): it has no pool", s.Data, datadir.TrainerMark),
				"Give 'clawmesh pool' a node's --data")
		}
		if !create {
			return nil, nil, withHint(fmt.Errorf("no pool at %s", dir), "A node makes it: run 'clawmesh node --data %s', or give the node's --data", s.Data)
		}
		if datadir.Is(s.Data, datadir.TrainerMark) {
			return nil, nil, withHint(fmt.Errorf("%s is a trainer's data directory (it holds a trainer's batch store, %s/), and a pool belongs in a node's", s.Data, datadir.TrainerMark),
				"Give 'clawmesh pool' a node's --data")
		}
	}
	p, err := pool.Open(dir, pool.Options{})
	if err == nil {
		return localPool{p, s}, func() { p.Close() }, nil
	}
	if errors.Is(err, pool.ErrDamaged) {
		// A node serving on the damaged pool (it lets the directory go
		// between its attempts to reopen it) answers for it, recording
		// paused; with none, say what to do.
		if c, cerr := runningNode(s); cerr == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, serr := c.Stats(ctx); serr == nil {
				return c, func() {}, nil
			}
		}
		return nil, nil, withHint(err, "Run 'clawmesh pool repair --data %s' to salvage it", s.Data)
	}
	if !errors.Is(err, pool.ErrLocked) {
		return nil, nil, err
	}
	c, cerr := runningNode(s)
	if cerr != nil {
		return nil, nil, withHint(fmt.Errorf("%w, and %v", err, cerr), "Stop the process that holds it (a pool command?), or start the node on it: 'clawmesh node --data %s'", s.Data)
	}
	return c, func() {}, nil
}

func runPool(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, poolHelp)
		return usageErr("which pool command? stats, ls, show, export, import, preview or repair")
	}
	sub, args := args[0], args[1:]
	var s settings
	var f pool.Filter
	var state, since string
	var asJSON bool
	var out string
	fs := newFlags("pool "+sub, poolHelp, stderr)
	s.bindClient(fs)
	filterFlags := func() {
		fs.StringVar((*string)(&f.Session), "session", "", "only this session")
		fs.StringVar(&state, "state", "", "only this state: open, failed, closed, scored, held, batched, shipped, dropped (failed: calls the upstream refused, could not be reached for, or cut; never trained on)")
		fs.StringVar(&since, "since", "", "only steps after this: RFC 3339 time, or a duration ago like 24h")
	}
	switch sub {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, poolHelp)
		return nil
	case "stats":
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	case "ls":
		filterFlags()
		fs.IntVar(&f.Limit, "limit", 50, "at most this many steps (0: all)")
		fs.BoolVar(&asJSON, "json", false, "print JSON")
	case "show":
		fs.BoolVar(&asJSON, "json", false, "print the step as JSON")
	case "export":
		filterFlags()
		fs.StringVar(&out, "o", "", "write to this file instead of standard output")
	case "import":
	case "repair":
		fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	case "preview":
		fs.IntVar(&f.Limit, "limit", 5, "show at most this many of the batch's steps (0: all)")
		fs.BoolVar(&asJSON, "json", false, "print the preview as JSON")
	default:
		return usageErr("unknown pool command %q: want stats, ls, show, export, import, preview or repair", sub)
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	if state != "" {
		st, err := core.ParseState(state)
		if err != nil {
			return usageErr("--state: %v", err)
		}
		f.State = st
	}
	if since != "" {
		t, err := parseSince(since, time.Now())
		if err != nil {
			return usageErr("--since: %v", err)
		}
		f.Since = t
	}
	if f.Limit < 0 {
		return usageErr("--limit must not be negative")
	}
	if sub == "repair" {
		if fs.NArg() > 0 {
			return usageErr("repair takes no arguments")
		}
		release, err := lockOffline(s.Data, "pool repair", false)
		if err != nil {
			return err
		}
		defer release()
		return repairPool(ctx, s.Data, asJSON, stdout)
	}
	switch want := map[string]int{"stats": 0, "ls": 0, "show": 1, "export": 0, "import": 1, "preview": 0}[sub]; {
	case fs.NArg() == want:
	case sub == "show":
		return usageErr("show takes one step id")
	case sub == "import":
		return usageErr("import takes one file (or - for standard input)")
	default:
		return usageErr("%s takes no arguments", sub)
	}
	if sub == "import" {
		// An import writes: no node may start on the directory meanwhile.
		release, err := lockOffline(s.Data, "pool import", true)
		if err != nil {
			return err
		}
		defer release()
	}
	if sub == "preview" {
		// A preview reads, but with no node running it makes the
		// device's id key when it is missing: a write.
		release, err := lockKey(s.Data, "pool preview")
		if err != nil {
			return err
		}
		defer release()
	}
	p, closeFn, err := openPool(&s, sub == "import")
	if err != nil {
		return err
	}
	defer closeFn()

	switch sub {
	case "stats":
		st, err := p.Stats(ctx)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, st)
		}
		printStats(stdout, st)
		if c, ok := p.(*node.Client); ok {
			// A running node: its scorer too (an older node has none).
			if sc, err := c.Scorer(ctx); err == nil {
				fmt.Fprintf(stdout, "scorer    %d scored since start, %d waiting, %d shed (skipped under load over --max-score-backlog %d, scored once it caught up)\n",
					sc.Scored, sc.Backlog, sc.Shed, sc.MaxBacklog)
			}
		}
		return nil
	case "ls":
		steps, err := p.List(ctx, f)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, steps)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "STEP\tSESSION\tTIME\tSTATE\tTURN\tREWARD\tACTION")
		for _, st := range steps {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", st.ID, st.SessionID, st.Timings.Start.Local().Format("01-02 15:04:05"),
				st.State, st.Turn, rewardText(st.Reward), oneLine(lsAction(st), 60))
		}
		return tw.Flush()
	case "show":
		st, err := p.Get(ctx, core.StepID(fs.Arg(0)))
		if errors.Is(err, pool.ErrNotFound) {
			return withHint(err, "'clawmesh pool ls --data %s' lists the steps, with their ids", s.Data)
		}
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, st)
		}
		showStep(stdout, st)
		return nil
	case "export":
		w := stdout
		if out != "" {
			fh, err := os.Create(out)
			if err != nil {
				return err
			}
			defer fh.Close()
			w = fh
		}
		bw := bufio.NewWriterSize(w, 256<<10)
		n, err := p.Export(ctx, bw, f)
		if err != nil {
			return err
		}
		if err := bw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "exported %s\n", plural(n, "step", "steps"))
		return nil
	case "import":
		var r io.Reader = os.Stdin
		if fs.Arg(0) != "-" {
			fh, err := os.Open(fs.Arg(0))
			if err != nil {
				return err
			}
			defer fh.Close()
			r = fh
		}
		rep, err := p.Import(ctx, r)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "imported %d, already present %d, bad %d\n", rep.Imported, rep.Duplicates, len(rep.Bad))
		for _, b := range rep.Bad {
			fmt.Fprintf(stdout, "  line %d: %s\n", b.Line, b.Err)
		}
		if len(rep.Bad) > 0 {
			return withHint(fmt.Errorf("%s skipped", plural(len(rep.Bad), "bad line was", "bad lines were")),
				"Fix the lines listed above, then run 'clawmesh pool import' again: the steps in already are left as they are")
		}
		return nil
	case "preview":
		pv, err := p.Preview(ctx, f.Limit)
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, pv)
		}
		return printPreview(stdout, pv)
	}
	return nil
}

func printPreview(w io.Writer, pv *share.Preview) error {
	if pv.Empty {
		fmt.Fprintf(w, "nothing would leave now: %s\n", pv.Note)
		printHeld(w, pv.Held)
		return nil
	}
	h := pv.Header
	if pv.Sealed {
		fmt.Fprintln(w, "next batch  sealed, waiting to leave this device")
	} else {
		fmt.Fprintln(w, "next batch  not sealed yet: what it would be if sealed now, under the policy in force")
	}
	fmt.Fprintf(w, "id          %s\n", pv.ID)
	fmt.Fprintf(w, "size        %d bytes: %s in %s, %s, policy %s (mode %s)\n", pv.Size, plural(h.Steps, "step", "steps"), plural(h.Sessions, "session", "sessions"), h.Created.Format("2006-01-02 15:00 MST"), orDash(h.Policy), pv.Mode)
	r := h.Rewards
	fmt.Fprintf(w, "rewards     %d scored (%d positive, %d negative, mean %+.2f), %d with a hint\n", r.Scored, r.Positive, r.Negative, r.Mean, r.Hints)
	if len(h.Plugins) > 0 {
		var short []string
		for _, p := range h.Plugins {
			short = append(short, p[:min(len(p), 12)])
		}
		fmt.Fprintf(w, "plugins     %s\n", strings.Join(short, " "))
	}
	if len(h.Adapters) > 0 {
		fmt.Fprintf(w, "adapters    %s\n", strings.Join(h.Adapters, " "))
	}
	if len(pv.Found) > 0 {
		var parts []string
		for _, k := range scrub.Kinds {
			if n := pv.Found[k]; n > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", k, n))
			}
		}
		fmt.Fprintf(w, "scrubbed    %s\n", strings.Join(parts, ", "))
	}
	printHeld(w, pv.Held)
	fmt.Fprintf(w, "\n%d of its %s, exactly as they leave:\n", len(pv.Steps), plural(h.Steps, "step", "steps"))
	for i, st := range pv.Steps {
		fmt.Fprintf(w, "\n--- step %d of %d\n", i+1, h.Steps)
		if err := printJSON(w, core.ExportedStep{Schema: core.SchemaVersion, Step: *st}); err != nil {
			return err
		}
	}
	return nil
}

func printHeld(w io.Writer, held []share.Held) {
	if len(held) == 0 {
		return
	}
	fmt.Fprintf(w, "held        %s on this device:\n", plural(len(held), "step stays", "steps stay"))
	for i, h := range held {
		if i == 10 {
			fmt.Fprintf(w, "              … and %d more\n", len(held)-10)
			break
		}
		fmt.Fprintf(w, "              %s  (%s)\n", h.ID, h.Reason)
	}
}

func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("want an RFC 3339 time or a duration like 24h, got %q", s)
	}
	return t, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func rewardText(r *core.Reward) string {
	if r == nil {
		return "-"
	}
	if r.Value == nil {
		return "abstain"
	}
	return fmt.Sprintf("%+.2f", *r.Value)
}

func actionText(m core.Message) string {
	var b strings.Builder
	b.WriteString(m.Content)
	for _, tc := range m.ToolCalls {
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "→%s(%s)", tc.Name, tc.Arguments)
	}
	return b.String()
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

// lsAction is what pool ls shows of a step's action: the reply, or for a
// failed call with none, the upstream's status and error.
func lsAction(s *core.Step) string {
	if t := actionText(s.Action()); t != "" || len(s.Response.Error) == 0 {
		return t
	}
	var e struct {
		Message string `json:"message"`
	}
	msg := string(s.Response.Error)
	if json.Unmarshal(s.Response.Error, &e) == nil && e.Message != "" {
		msg = e.Message
	}
	if s.Response.Status == 0 {
		return "(error: " + msg + ")"
	}
	return fmt.Sprintf("(error %d: %s)", s.Response.Status, msg)
}

func showStep(w io.Writer, s *core.Step) {
	fmt.Fprintf(w, "step     %s\nsession  %s  chain %s  parent %s\n", s.ID, s.SessionID, s.ChainID, orDash(string(s.ParentID)))
	fmt.Fprintf(w, "state    %s  turn %s  api %s  source %s\n", s.State, s.Turn, s.API, orDash(s.Source))
	fmt.Fprintf(w, "model    %s  upstream %s  adapter %s\n", orDash(s.Model), orDash(s.Upstream), orDash(s.Adapter))
	fmt.Fprintf(w, "time     %s  ttft %s  total %s", s.Timings.Start.Local().Format(time.RFC3339), s.Timings.TTFT, s.Timings.Total)
	if s.ClientDisconnected {
		fmt.Fprint(w, "  (client disconnected)")
	}
	fmt.Fprintln(w)
	if u := s.Response.Usage; u != nil {
		fmt.Fprintf(w, "tokens   prompt %d  completion %d\n", u.PromptTokens, u.CompletionTokens)
	}
	fmt.Fprintf(w, "\ncontext (%s, %s):\n", plural(len(s.Request.Messages), "message", "messages"), plural(len(s.Request.Tools), "tool", "tools"))
	msgs := s.Request.Messages
	if len(msgs) > 6 {
		fmt.Fprintf(w, "  … %s\n", plural(len(msgs)-6, "earlier message", "earlier messages"))
		msgs = msgs[len(msgs)-6:]
	}
	for _, m := range msgs {
		fmt.Fprintf(w, "  %-9s %s\n", m.Role, oneLine(actionText(m), 100))
	}
	for _, c := range s.Response.Choices {
		fmt.Fprintf(w, "\naction (choice %d, finish %s, %s recorded, fidelity %s):\n", c.Index, orDash(c.FinishReason), plural(len(c.Tokens), "token", "tokens"), orDash(string(c.Fidelity)))
		if c.Message.Reasoning != "" {
			fmt.Fprintf(w, "  reasoning %s\n", oneLine(c.Message.Reasoning, 200))
		}
		fmt.Fprintf(w, "  %s\n", oneLine(actionText(c.Message), 400))
	}
	if len(s.Response.Error) > 0 {
		fmt.Fprintf(w, "\nupstream error (status %d): %s\n", s.Response.Status, oneLine(string(s.Response.Error), 300))
	}
	fmt.Fprintln(w, "\nnext state:")
	if s.NextState == nil {
		fmt.Fprintln(w, "  (none)")
	} else {
		for _, m := range s.NextState.Messages {
			fmt.Fprintf(w, "  %-9s %s\n", m.Role, oneLine(actionText(m), 200))
		}
	}
	for _, f := range s.Feedback {
		score := "-"
		if f.Score != nil {
			score = fmt.Sprintf("%+.2f", *f.Score)
		}
		fmt.Fprintf(w, "feedback %s %s\n", score, oneLine(f.Text, 200))
	}
	if r := s.Reward; r != nil {
		fmt.Fprintf(w, "\nreward   %s", rewardText(r))
		if r.Hint != "" {
			fmt.Fprintf(w, "  hint: %s", oneLine(r.Hint, 200))
		}
		fmt.Fprintln(w)
		for _, sc := range r.Scores {
			v := "abstain"
			if sc.Value != nil {
				v = fmt.Sprintf("%+.2f", *sc.Value)
			}
			hash := sc.Hash
			if len(hash) > 12 {
				hash = hash[:12]
			}
			fmt.Fprintf(w, "  %-12s %-8s w=%.2f %s", sc.Plugin, v, sc.Weight, hash)
			if sc.Reason != "" {
				fmt.Fprintf(w, "  (%s)", oneLine(sc.Reason, 80))
			}
			if len(sc.Labels) > 0 {
				fmt.Fprintf(w, "  labels: %s", oneLine(strings.Join(sc.Labels, ","), 120))
			}
			if sc.Hint != "" {
				fmt.Fprintf(w, "  hint: %s", oneLine(sc.Hint, 120))
			}
			fmt.Fprintln(w)
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printStats(w io.Writer, st pool.Stats) {
	if h := st.Health; h != nil && !h.Recording {
		fmt.Fprintf(w, "recording paused: %s\n", h.Paused)
		if h.Damaged {
			fmt.Fprintln(w, "          run 'clawmesh pool repair' with the same --data to salvage the pool; the node then records again")
		}
	}
	fmt.Fprintf(w, "steps     %d in %s\n", st.Steps, plural(st.Sessions, "session", "sessions"))
	fmt.Fprint(w, "states   ")
	for _, s := range core.States {
		fmt.Fprintf(w, " %s %d", s, st.ByState[s])
	}
	fmt.Fprintln(w)
	ratio := func(ref, stored int) string {
		if stored == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fx", float64(ref)/float64(stored))
	}
	fmt.Fprintf(w, "messages  %d referenced, %d stored (shared %s)\n", st.MessagesReferenced, st.MessagesStored, ratio(st.MessagesReferenced, st.MessagesStored))
	fmt.Fprintf(w, "tools     %s referenced, %d stored (shared %s)\n", plural(st.ToolListsReferenced, "list", "lists"), st.ToolListsStored, ratio(st.ToolListsReferenced, st.ToolListsStored))
	fmt.Fprintf(w, "bytes     %d of step data (%d in step records, %d in shared blobs), %d on disk\n", st.Bytes, st.StepBytes, st.BlobBytes, st.DiskBytes)
	fmt.Fprintf(w, "outbox    %s, %d shipped\n", plural(st.Batches, "batch", "batches"), st.BatchesShipped)
	if len(st.ByAdapter) > 0 {
		names := slices.Sorted(maps.Keys(st.ByAdapter))
		fmt.Fprint(w, "served by")
		for _, a := range names {
			fmt.Fprintf(w, " %s %d", a, st.ByAdapter[a])
		}
		fmt.Fprintln(w, " (steps per adapter version)")
	}
}

// repairPool runs pool.Repair on the pool of data dir data. A running node
// keeps serving meanwhile and records again once the repaired pool is in
// place.
func repairPool(ctx context.Context, data string, asJSON bool, stdout io.Writer) error {
	dir := filepath.Join(data, "pool")
	if p, err := pool.Open(dir, pool.Options{}); err == nil {
		// It opens: repair only if a table does not read.
		err := p.Verify(ctx)
		p.Close()
		if err == nil {
			return fmt.Errorf("the pool in %s opens and every key in it reads: nothing to repair", dir)
		}
		if !errors.Is(err, pool.ErrDamaged) {
			return err
		}
	} else if errors.Is(err, pool.ErrLocked) {
		return fmt.Errorf("the pool in %s is open in a running node: it is not damaged; nothing to repair", dir)
	}
	rep, err := pool.Repair(ctx, dir, time.Now())
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, rep)
	}
	fmt.Fprintf(stdout, "salvaged %s into a fresh pool in %s\n", plural(rep.Steps, "step", "steps"), dir)
	fmt.Fprintf(stdout, "read %s from the tables and %s; %s\n", plural(rep.Tables, "key", "keys"), plural(rep.WALRecords, "WAL record", "WAL records"),
		plural(rep.BadWALRecords, "WAL record did not check out", "WAL records did not check out"))
	if rep.Unreadable > 0 {
		fmt.Fprintf(stdout, "%s\n", plural(rep.Unreadable, "step could not be read whole and was left out", "steps could not be read whole and were left out"))
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(stdout, "could not read: %s\n", p)
	}
	fmt.Fprintf(stdout, "the damaged pool is kept in %s\n", rep.Moved)
	return nil
}
