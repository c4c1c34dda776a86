package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/model/baseid"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/node/setup"
)

const setupHelp = `Usage: clawmesh setup openclaw [--data DIR] [--dry-run] [--undo]
       clawmesh setup ollama --model NAME [--data DIR] [--dry-run] [--undo]

Routes OpenClaw through the node. It reads OpenClaw's config (by OpenClaw's
own precedence: $OPENCLAW_CONFIG_PATH, then $OPENCLAW_STATE_DIR/openclaw.json,
then ~/.openclaw/openclaw.json), finds the provider the default agent's model
uses, makes that provider's base URL the node's upstream (upstream and
upstream_kind in DATA/config.toml), and points the provider at the gateway
(baseUrl http://127.0.0.1:8400/v1 for the OpenAI APIs, the gateway's root
for anthropic-messages; api unchanged). Where the node demands a token
(--token, token in config.toml), the provider's apiKey becomes that token
and its own key the node's upstream_token.

Where the openclaw command is installed, the change is made with OpenClaw's
own 'openclaw config set', checked with 'openclaw config validate' and read
back with 'openclaw config get' (OpenClaw rewrites the file, without its
comments); otherwise only the provider's
fields are edited in the JSON5 file, and everything else stays byte for
byte. Either way a copy of the config is kept beside it
(openclaw.json.clawmesh-TIME.bak) and what was changed is recorded in
DATA/openclaw-setup.json, so that --undo puts the provider back exactly.
Running it again changes nothing.

Then run the node: 'clawmesh service install' (at login, restarted on
failure) or 'clawmesh node'.

setup ollama serves a model you pulled with Ollama through llama-server,
which the node runs itself, so that the adapters the mesh trains reach it
(recent Ollama releases no longer load LoRA adapters). Nothing is
downloaded again: it finds the model's GGUF in Ollama's own store
($OLLAMA_MODELS, else ~/.ollama/models; on Linux also
/usr/share/ollama/.ollama/models, where the service install keeps it), by
the model's manifest (manifests/registry.ollama.ai/library/qwen3/4b for
qwen3:4b), checks that it is a GGUF, reads its architecture and shape,
and writes serve = "llama-server" and model = "<the GGUF>" to the node's
config (DATA/config.toml). The node's upstream is then the server it
runs, so an upstream (and an upstream_kind other than llamacpp) set there
before, such as Ollama's, is commented out in place. The lines it changed
are recorded in DATA/ollama-setup.json, so that --undo puts them back
exactly. Where the node holds a version the mesh trained on another base
model, setup warns that it will not load on this one. llama-server must
be installed (macOS: brew install llama.cpp; elsewhere a release of
https://github.com/ggml-org/llama.cpp/releases); setup says so where it is
not on PATH.

Examples:
  clawmesh setup openclaw --dry-run     # show the change, make none
  clawmesh setup openclaw
  clawmesh setup openclaw --undo        # OpenClaw calls the model server directly again
  clawmesh setup ollama --model qwen3:4b --dry-run
  clawmesh setup ollama --model qwen3:4b
  clawmesh setup ollama --undo          # the node's config as it was
`

func runSetup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
			fmt.Fprint(stdout, setupHelp)
			return nil
		}
		return usageErr("say what to set up: clawmesh setup openclaw, or clawmesh setup ollama --model NAME")
	}
	switch args[0] {
	case "openclaw":
		return runSetupOpenClaw(ctx, args[1:], stdout, stderr)
	case "ollama":
		return runSetupOllama(ctx, args[1:], stdout, stderr)
	}
	return usageErr("unknown target %q (want openclaw or ollama)", args[0])
}

func runSetupOpenClaw(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var s settings
	flags := newFlags("setup openclaw", setupHelp, stderr)
	s.bindCommon(flags)
	dry := flags.Bool("dry-run", false, "print the change as a diff and make none")
	undo := flags.Bool("undo", false, "put OpenClaw's provider back as it was before setup")
	ocBin := flags.String("openclaw", "", "the openclaw command that makes the change (default: openclaw on PATH; \"none\": edit the file directly)")
	if err := parse(flags, args); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return usageErr("unexpected arguments %q", flags.Args())
	}
	if err := s.resolve(flags); err != nil {
		return err
	}
	oc := openClaw{bin: *ocBin}
	switch oc.bin {
	case "none":
		oc.bin = ""
	case "":
		oc.bin, _ = exec.LookPath("openclaw")
	}
	path, err := oc.configPath(ctx)
	if err != nil {
		return err
	}
	src, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return withHint(fmt.Errorf("OpenClaw's config %s does not exist", path),
			"Set OpenClaw up first ('openclaw onboard'), or say where its config is with OPENCLAW_CONFIG_PATH; then run 'clawmesh setup openclaw' again")
	case err != nil:
		return fmt.Errorf("cannot read OpenClaw's config: %v", err)
	}
	root, err := setup.ParseJSON5(src)
	if err != nil {
		return fmt.Errorf("OpenClaw's config %s cannot be read: %v", path, strings.TrimPrefix(err.Error(), "setup: "))
	}
	if !*dry {
		// Setup writes the data directory (the node's config.toml, the
		// record --undo reads): no node may start on it meanwhile, and
		// another command writing it is named. A node running there goes
		// on; it reads config.toml when it starts.
		release, err := lockOffline(s.Data, "setup openclaw", !*undo)
		if err != nil {
			return err
		}
		defer release()
	}
	if *undo {
		return undoOpenClaw(ctx, s, oc, path, src, *dry, stdout)
	}

	listen := s.Listen
	if listen == "" {
		listen = node.DefaultListen
	}
	gw, err := setup.GatewayURL(listen)
	if err != nil {
		return usageErr("--listen: %v", err)
	}
	route := setup.Route{Gateway: gw, NodeToken: s.Token}
	plan, err := setup.PlanOpenClaw(src, root, route)
	if err != nil {
		return fmt.Errorf("%s: %s", path, strings.TrimPrefix(err.Error(), "setup: "))
	}
	recPath := filepath.Join(s.Data, setup.RecordFile)
	rec, hasRec, err := readRecord(recPath)
	if err != nil {
		return err
	}
	if len(plan.Changes) == 0 {
		fmt.Fprintf(stdout, "OpenClaw's provider %q already goes through the node at %s: nothing to change.\n", plan.Provider.Name, gw)
		if !hasRec {
			fmt.Fprintln(stdout, "(It was set so by hand: --undo has no record to put it back from.)")
		}
		return nil
	}
	if hasRec && rec.Provider == plan.Provider.Name && rec.Config == path && recordedBaseURL(rec) == plan.Provider.BaseURL {
		// Put back by hand as it was before setup: the record is stale.
		if err := os.Remove(recPath); err != nil {
			return err
		}
		hasRec = false
	}
	if hasRec && rec.Provider == plan.Provider.Name && rec.Config == path {
		return withHint(fmt.Errorf("OpenClaw's provider %q was routed through the node on %s, and now goes to %s instead: it was routed elsewhere since, and is left as it is",
			plan.Provider.Name, rec.At.Local().Format("2006-01-02 15:04"), plan.Provider.BaseURL),
			"Edit %s by hand, or remove %s and run 'clawmesh setup openclaw' to set it up afresh", path, recPath)
	}
	if s.Serve == "" && s.Upstream != "" && strings.TrimSuffix(s.Upstream, "/") != plan.Upstream {
		return withHint(fmt.Errorf("the node already forwards to %s (upstream in %s), but OpenClaw's provider %q goes to %s",
			s.Upstream, nodeConfigPath(s), plan.Provider.Name, plan.Provider.BaseURL),
			"Change one of them so that they agree, then run 'clawmesh setup openclaw' again")
	}

	after, err := setup.ApplyJSON5(src, plan.Provider.Name, plan.Changes, false)
	if err != nil {
		return err
	}
	cfgPath := nodeConfigPath(s)
	oldToml, err := os.ReadFile(cfgPath)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cannot read the node's config: %v", err)
	}
	keys, vals := []string{"upstream"}, map[string]string{"upstream": plan.Upstream}
	if plan.UpstreamKind != "" && s.UpstreamKind == "" {
		keys, vals["upstream_kind"] = append(keys, "upstream_kind"), plan.UpstreamKind
	}
	if plan.UpstreamToken != "" {
		keys, vals["upstream_token"] = append(keys, "upstream_token"), plan.UpstreamToken
	}
	if s.Serve != "" {
		// The node runs its model server itself (serve in its config, as
		// setup ollama writes): that server is its upstream, so only
		// OpenClaw changes.
		keys = nil
	}
	newToml := setup.SetTOMLKeys(string(oldToml), keys, vals)
	var check fileConfig
	if _, err := toml.Decode(newToml, &check); err != nil {
		return fmt.Errorf("cannot add the upstream to %s: %v", cfgPath, err)
	}

	if *dry {
		fmt.Fprintf(stdout, "OpenClaw's default model %s uses provider %q (%s, %s).\n", plan.Provider.Model, plan.Provider.Name, plan.Provider.BaseURL, plan.Provider.API)
		if s.Serve != "" {
			fmt.Fprintf(stdout, "The node runs %s on %s itself; OpenClaw would call the gateway at %s.\n\n", s.Serve, s.Model, gw)
		} else {
			fmt.Fprintf(stdout, "The node would forward to %s; OpenClaw would call the gateway at %s.\n\n", plan.Upstream, gw)
		}
		fmt.Fprint(stdout, setup.Diff(path, path+" (after setup)", string(src), string(after)))
		fmt.Fprint(stdout, redactDiff(setup.Diff(cfgPath, cfgPath+" (after setup)", string(oldToml), newToml), plan.UpstreamToken))
		if oc.bin != "" {
			fmt.Fprintf(stdout, "\n(The change would be made with %s config set, which rewrites the file without its comments.)\n", oc.bin)
		}
		fmt.Fprintln(stdout, "\nNothing was changed (--dry-run).")
		return nil
	}

	// The node's config first: once OpenClaw calls the gateway, the node
	// must know where to forward.
	if err := atomicfile.Write(cfgPath, []byte(newToml), 0o600); err != nil {
		return fmt.Errorf("cannot write the node's config: %v", err)
	}
	backup := setup.BackupName(path, time.Now())
	if err := os.WriteFile(backup, src, 0o600); err != nil {
		return fmt.Errorf("cannot keep a copy of OpenClaw's config: %v", err)
	}
	rec = setup.Record{Config: path, Provider: plan.Provider.Name, Changes: plan.Changes, Backup: backup, At: time.Now().UTC()}
	if oc.bin != "" {
		rec.Via = "openclaw"
		if err := oc.set(ctx, plan.Provider.Name, plan.Changes, false); err != nil {
			return restoreAfter(err, path, src)
		}
		if err := oc.validate(ctx); err != nil {
			return restoreAfter(err, path, src)
		}
		if err := oc.check(ctx, plan.Provider.Name, route.BaseURL(plan.Provider.API)); err != nil {
			return restoreAfter(err, path, src)
		}
	} else {
		rec.Via = "file"
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(path, after, info.Mode().Perm()); err != nil {
			return fmt.Errorf("cannot write OpenClaw's config: %v", err)
		}
	}
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := atomicfile.Write(recPath, append(b, '\n'), 0o600); err != nil {
		return restoreAfter(fmt.Errorf("cannot record the change for --undo: %v", err), path, src)
	}
	fmt.Fprintf(stdout, "OpenClaw's provider %q now goes through the node at %s.\n", plan.Provider.Name, route.BaseURL(plan.Provider.API))
	fmt.Fprintf(stdout, "  OpenClaw's config: %s (a copy of it as it was: %s)\n", path, backup)
	if s.Serve != "" {
		fmt.Fprintf(stdout, "  the node runs %s on %s itself (serve and model in %s)\n", s.Serve, s.Model, cfgPath)
	} else {
		fmt.Fprintf(stdout, "  the node's upstream: %s (in %s)\n", plan.Upstream, cfgPath)
	}
	fmt.Fprintln(stdout, "Run the node now: clawmesh service install (at login, restarted on failure), or clawmesh node.")
	fmt.Fprintln(stdout, "clawmesh setup openclaw --undo puts the provider back as it was.")
	return nil
}

// restoreAfter puts OpenClaw's config back after a failed change.
func restoreAfter(err error, path string, src []byte) error {
	if werr := atomicfile.Write(path, src, 0o600); werr != nil {
		return fmt.Errorf("%v; and putting the config back failed too: %v", err, werr)
	}
	return fmt.Errorf("%v (OpenClaw's config is as it was)", err)
}

func undoOpenClaw(ctx context.Context, s settings, oc openClaw, path string, src []byte, dry bool, stdout io.Writer) error {
	recPath := filepath.Join(s.Data, setup.RecordFile)
	rec, ok, err := readRecord(recPath)
	if err != nil {
		return err
	}
	if !ok {
		return withHint(fmt.Errorf("nothing to undo: %s does not exist (setup was not run with this --data, or was undone)", recPath),
			"Give 'clawmesh setup openclaw --undo' the --data setup ran with, if it ran")
	}
	if rec.Config != path {
		return withHint(fmt.Errorf("setup changed %s, but OpenClaw reads %s now", rec.Config, path),
			"Set OPENCLAW_CONFIG_PATH=%s and run 'clawmesh setup openclaw --undo' again to undo it there", rec.Config)
	}
	after, err := setup.ApplyJSON5(src, rec.Provider, rec.Changes, true)
	if err != nil {
		return fmt.Errorf("%s; the copy made before setup is %s", strings.TrimPrefix(err.Error(), "setup: "), rec.Backup)
	}
	if dry {
		fmt.Fprint(stdout, setup.Diff(path, path+" (after undo)", string(src), string(after)))
		fmt.Fprintln(stdout, "\nNothing was changed (--dry-run).")
		return nil
	}
	if oc.bin != "" {
		if err := oc.set(ctx, rec.Provider, rec.Changes, true); err != nil {
			return restoreAfter(err, path, src)
		}
		if err := oc.validate(ctx); err != nil {
			return restoreAfter(err, path, src)
		}
		if err := oc.check(ctx, rec.Provider, recordedBaseURL(rec)); err != nil {
			return restoreAfter(err, path, src)
		}
	} else {
		info, err := os.Stat(path)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(path, after, info.Mode().Perm()); err != nil {
			return fmt.Errorf("cannot write OpenClaw's config: %v", err)
		}
	}
	if err := os.Remove(recPath); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "OpenClaw's provider %q goes to %s again, as before setup.\n", rec.Provider, recordedBaseURL(rec))
	fmt.Fprintf(stdout, "  the copy made before setup stays: %s\n", rec.Backup)
	return nil
}

// recordedBaseURL is the provider's baseUrl before setup, as recorded.
func recordedBaseURL(rec setup.Record) string {
	for _, c := range rec.Changes {
		if c.Field == "baseUrl" {
			if s, ok := c.OldValue.(string); ok {
				return s
			}
		}
	}
	return ""
}

func readRecord(path string) (setup.Record, bool, error) { return readSetupRecord[setup.Record](path) }

// readSetupRecord reads the record a setup keeps for --undo; ok is false
// when there is none.
func readSetupRecord[T any](path string) (rec T, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, fmt.Errorf("cannot read the setup record: %v", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, false, fmt.Errorf("the setup record %s is damaged: %v", path, err)
	}
	return rec, true, nil
}

func nodeConfigPath(s settings) string {
	if s.Config != "" {
		return expandHome(s.Config)
	}
	return filepath.Join(s.Data, "config.toml")
}

// redactDiff hides a token in a diff that is printed.
func redactDiff(d, secret string) string {
	if secret == "" {
		return d
	}
	return strings.ReplaceAll(d, secret, "<the provider's key>")
}

// openClaw runs the openclaw command, where there is one (bin "").
type openClaw struct{ bin string }

func (o openClaw) run(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.bin, args...)
	cmd.Env = append(os.Environ(), "NO_COLOR=1")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(errb.String())
		if msg == "" {
			msg = strings.TrimSpace(out.String())
		}
		return "", fmt.Errorf("openclaw %s: %v: %s", strings.Join(args[:min(2, len(args))], " "), err, msg)
	}
	return out.String(), nil
}

// configPath is the file OpenClaw reads: as its command says, else by its
// precedence.
func (o openClaw) configPath(ctx context.Context) (string, error) {
	if o.bin != "" {
		out, err := o.run(ctx, "config", "file")
		if err != nil {
			return "", err
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if p := strings.TrimSpace(lines[len(lines)-1]); p != "" {
			return expandHome(p), nil
		}
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return setup.OpenClawConfigPath(os.Getenv, home), nil
}

// providerPath is the provider's path in openclaw config's notation.
func providerPath(provider string) string {
	if !isIdentifier(provider) {
		b, _ := json.Marshal(provider)
		return "models.providers[" + string(b) + "]"
	}
	return "models.providers." + provider
}

// check reads the provider's baseUrl back with openclaw config get: what
// OpenClaw itself now reads must be what was set. (Its apiKey it shows
// redacted.)
func (o openClaw) check(ctx context.Context, provider, baseURL string) error {
	if baseURL == "" {
		return nil
	}
	out, err := o.run(ctx, "config", "get", "--json", providerPath(provider)+".baseUrl")
	if err != nil {
		return err
	}
	var got string
	i := strings.Index(out, "\"")
	if i < 0 || json.NewDecoder(strings.NewReader(out[i:])).Decode(&got) != nil {
		return fmt.Errorf("openclaw config get: cannot read the provider's baseUrl from %q", strings.TrimSpace(out))
	}
	if got != baseURL {
		return fmt.Errorf("OpenClaw reads provider %q's baseUrl as %q after the change, not %q", provider, got, baseURL)
	}
	return nil
}

// set makes the changes (or undoes them) with openclaw config set/unset.
func (o openClaw) set(ctx context.Context, provider string, changes []setup.Change, undo bool) error {
	type op struct {
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	var ops []op
	prefix := providerPath(provider)
	for _, c := range changes {
		p := prefix + "." + c.Field
		switch {
		case !undo:
			ops = append(ops, op{p, c.New})
		case c.Old == "":
			if _, err := o.run(ctx, "config", "unset", p); err != nil {
				return err
			}
		default:
			ops = append(ops, op{p, c.OldValue})
		}
	}
	if len(ops) == 0 {
		return nil
	}
	b, _ := json.Marshal(ops)
	_, err := o.run(ctx, "config", "set", "--batch-json", string(b))
	return err
}

func (o openClaw) validate(ctx context.Context) error {
	out, err := o.run(ctx, "config", "validate", "--json")
	if err != nil {
		return err
	}
	var v struct {
		Valid  bool `json:"valid"`
		Issues any  `json:"issues"`
	}
	i := strings.Index(out, "{")
	if i < 0 || json.Unmarshal([]byte(out[i:]), &v) != nil || !v.Valid {
		return fmt.Errorf("OpenClaw finds its config invalid after the change: %s", strings.TrimSpace(out))
	}
	return nil
}

func isIdentifier(s string) bool {
	for i, r := range s {
		if !(r == '_' || r == '$' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && (r >= '0' && r <= '9' || r == '-')) {
			return false
		}
	}
	return s != ""
}

// llamaServerHint says how to install llama-server, for this system.
func llamaServerHint(goos string) string {
	if goos == "darwin" {
		return "install llama.cpp: brew install llama.cpp"
	}
	return "install llama.cpp: a release from https://github.com/ggml-org/llama.cpp/releases (llama-server is in its archive), or build it"
}

func runSetupOllama(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var s settings
	flags := newFlags("setup ollama", setupHelp, stderr)
	s.bindCommon(flags)
	name := flags.String("model", "", "the Ollama model to serve, as Ollama names it (qwen3:4b, user/model:tag)")
	dry := flags.Bool("dry-run", false, "print the change as a diff and make none")
	undo := flags.Bool("undo", false, "put the node's config back as it was before setup ollama")
	if err := parse(flags, args); err != nil {
		return err
	}
	if flags.NArg() > 0 {
		return usageErr("unexpected arguments %q", flags.Args())
	}
	if *name == "" && !*undo {
		return usageErr("say which model: clawmesh setup ollama --model NAME (as 'ollama list' shows it)")
	}
	if *name != "" && *undo {
		return usageErr("--undo takes no --model: it puts back what setup ollama changed")
	}
	if err := s.resolve(flags); err != nil {
		return err
	}
	cfgPath := nodeConfigPath(s)
	recPath := filepath.Join(s.Data, setup.OllamaRecordFile)
	if !*dry {
		release, err := lockOffline(s.Data, "setup ollama", !*undo)
		if err != nil {
			return err
		}
		defer release()
	}
	if *undo {
		return undoOllama(cfgPath, recPath, *dry, stdout)
	}
	on, err := setup.ParseOllamaName(*name)
	if err != nil {
		return usageErr("--model: %v", strings.TrimPrefix(err.Error(), "setup: "))
	}
	m, err := findOllamaModel(on)
	if err != nil {
		return err
	}
	id, err := baseid.FromGGUF(m.Blob)
	if err != nil {
		return fmt.Errorf("Ollama's model %s cannot be served by llama-server: %s", on, strings.TrimPrefix(err.Error(), "baseid: "))
	}

	oldToml, err := os.ReadFile(cfgPath)
	created := errors.Is(err, fs.ErrNotExist)
	if err != nil && !created {
		return fmt.Errorf("cannot read the node's config: %v", err)
	}
	keys := []string{"serve", "model"}
	vals := map[string]string{"serve": "llama-server", "model": m.Blob}
	var changes []setup.KeyChange
	for _, k := range keys {
		changes = append(changes, setup.KeyChange{Key: k, Old: setup.TOMLKeyLine(string(oldToml), k), New: vals[k]})
	}
	var check fileConfig
	if _, err := toml.Decode(string(oldToml), &check); err != nil {
		return fmt.Errorf("the node's config %s: %v", cfgPath, err)
	}
	newToml := setup.SetTOMLKeys(string(oldToml), keys, vals)
	// The node's upstream is the server it runs: an upstream set before
	// (Ollama's, by setup openclaw) and a kind other than llama.cpp's are
	// commented out, in place, to come back with --undo.
	var dropped []string
	for _, k := range []string{"upstream", "upstream_kind"} {
		line := setup.TOMLKeyLine(newToml, k)
		if line == "" || k == "upstream_kind" && (check.UpstreamKind == "llamacpp" || check.UpstreamKind == "llama.cpp") {
			continue
		}
		var c string
		newToml, c, _ = setup.CommentTOMLKey(newToml, k, "clawmesh setup ollama: the node runs llama-server on "+on.String())
		changes = append(changes, setup.KeyChange{Key: k, Old: line, Comment: c})
		dropped = append(dropped, strings.TrimSpace(line))
	}
	if _, err := toml.Decode(newToml, &fileConfig{}); err != nil {
		return fmt.Errorf("cannot set the model in %s: %v", cfgPath, err)
	}
	bin, binErr := exec.LookPath(cmp.Or(s.ServeBin, "llama-server"))
	fmt.Fprintf(stdout, "Ollama's %s is %s: %s, %s, in %s.\n", on, m.Blob, id, sizeText(m.Size), m.Models)
	if v, err := newestInstalled(s.Data); err == nil {
		if err := baseid.Same(v.id, id); err != nil {
			fmt.Fprintf(stdout, "\nWARNING: the mesh's %s was trained on another base model than %s, so the node will not load it there:\n  %s\nServe the mesh's base model instead to have it learn.\n\n",
				v.name, on, strings.TrimPrefix(err.Error(), "baseid: a different base model: "))
		}
	}
	if newToml == string(oldToml) {
		fmt.Fprintf(stdout, "The node already serves it with llama-server (%s): nothing to change.\n", cfgPath)
		printLlamaServer(stdout, bin, binErr)
		return nil
	}
	if *dry {
		fmt.Fprintf(stdout, "The node would run llama-server on it.\n\n")
		fmt.Fprint(stdout, redactDiff(setup.Diff(cfgPath, cfgPath+" (after setup)", string(oldToml), newToml), s.UpstreamToken))
		printLlamaServer(stdout, bin, binErr)
		fmt.Fprintln(stdout, "\nNothing was changed (--dry-run).")
		return nil
	}
	rec := setup.OllamaRecord{Config: cfgPath, Model: on.String(), Blob: m.Blob, Keys: changes, Created: created,
		NoFinalNewline: len(oldToml) > 0 && !bytes.HasSuffix(oldToml, []byte("\n")), At: time.Now().UTC()}
	if prev, ok, err := readOllamaRecord(recPath); err != nil {
		return err
	} else if ok && prev.Config != cfgPath {
		return withHint(fmt.Errorf("setup ollama changed %s before, and the node's config is %s now", prev.Config, cfgPath),
			"Undo it there first ('clawmesh setup ollama --undo --config %s'), then run setup again", prev.Config)
	} else if ok {
		// Set up before, for another model: what --undo puts back is the
		// config from before the first setup, where it is still as that
		// setup left it.
		if _, err := setup.UndoTOMLKeys(string(oldToml), prev.Keys); err == nil {
			for i, k := range rec.Keys {
				for _, pk := range prev.Keys {
					if pk.Key == k.Key && pk.Comment == "" {
						rec.Keys[i].Old = pk.Old
					}
				}
			}
			for _, pk := range prev.Keys {
				if pk.Comment != "" {
					rec.Keys = append(rec.Keys, pk)
				}
			}
			rec.Created, rec.NoFinalNewline = prev.Created, prev.NoFinalNewline
		}
	}
	mode := os.FileMode(0o600)
	if fi, err := os.Stat(cfgPath); err == nil {
		mode = fi.Mode().Perm()
	}
	if err := os.MkdirAll(filepath.Dir(cfgPath), 0o700); err != nil {
		return err
	}
	if err := atomicfile.Write(cfgPath, []byte(newToml), mode); err != nil {
		return fmt.Errorf("cannot write the node's config: %v", err)
	}
	b, _ := json.MarshalIndent(rec, "", "  ")
	if err := atomicfile.Write(recPath, append(b, '\n'), 0o600); err != nil {
		err = fmt.Errorf("cannot record the change for --undo: %v", err)
		if created {
			os.Remove(cfgPath)
		} else if werr := atomicfile.Write(cfgPath, oldToml, mode); werr != nil {
			return fmt.Errorf("%v; and putting the config back failed too: %v", err, werr)
		}
		return fmt.Errorf("%v (the node's config is as it was)", err)
	}
	fmt.Fprintf(stdout, "The node now runs llama-server on it: serve and model in %s.\n", cfgPath)
	for _, d := range dropped {
		fmt.Fprintf(stdout, "  commented out there, as the node's upstream is now the server it runs: %s\n", d)
	}
	printLlamaServer(stdout, bin, binErr)
	fmt.Fprintln(stdout, "Run the node now: clawmesh service install (at login, restarted on failure), or clawmesh node.")
	fmt.Fprintf(stdout, "The file is Ollama's: after 'ollama rm %s', run setup ollama again for another model.\n", on)
	fmt.Fprintln(stdout, "clawmesh setup ollama --undo puts the node's config back as it was.")
	return nil
}

// printLlamaServer says where llama-server is, or how to install it.
func printLlamaServer(w io.Writer, bin string, err error) {
	if err != nil {
		fmt.Fprintf(w, "\nllama-server is not on PATH: %s. The node cannot serve the model until it is.\n", llamaServerHint(runtime.GOOS))
		return
	}
	fmt.Fprintf(w, "llama-server: %s\n", bin)
}

// findOllamaModel looks for the model in each place Ollama may keep its
// store, and says where it looked when it is in none.
func findOllamaModel(n setup.OllamaName) (setup.OllamaModel, error) {
	home, _ := os.UserHomeDir()
	dirs := setup.OllamaModelsDirs(os.Getenv, home, runtime.GOOS)
	var first error
	var seen []string
	for _, d := range dirs {
		if fi, err := os.Stat(filepath.Join(d, "manifests")); err != nil || !fi.IsDir() {
			continue
		}
		seen = append(seen, d)
		m, err := setup.FindOllamaModel(d, n)
		if err == nil {
			return m, nil
		}
		if first == nil || !errors.Is(err, setup.ErrOllamaModel) {
			first = err
		}
		if !errors.Is(err, setup.ErrOllamaModel) {
			break
		}
	}
	if len(seen) == 0 {
		return setup.OllamaModel{}, withHint(fmt.Errorf("no Ollama model store in %s", strings.Join(dirs, " or ")),
			"Install Ollama and pull the model ('ollama pull %s'), or say where its models are with OLLAMA_MODELS", n)
	}
	msg := strings.TrimPrefix(first.Error(), "setup: ")
	if errors.Is(first, setup.ErrOllamaModel) {
		return setup.OllamaModel{}, withHint(errors.New(msg), "Pull it first ('ollama pull %s'), or name one of those", n)
	}
	return setup.OllamaModel{}, errors.New(msg)
}

func readOllamaRecord(path string) (setup.OllamaRecord, bool, error) {
	return readSetupRecord[setup.OllamaRecord](path)
}

func undoOllama(cfgPath, recPath string, dry bool, stdout io.Writer) error {
	rec, ok, err := readOllamaRecord(recPath)
	if err != nil {
		return err
	}
	if !ok {
		return withHint(fmt.Errorf("nothing to undo: %s does not exist (setup ollama was not run with this --data, or was undone)", recPath),
			"Give 'clawmesh setup ollama --undo' the --data setup ran with, if it ran")
	}
	if rec.Config != cfgPath {
		return withHint(fmt.Errorf("setup ollama changed %s, but the node's config is %s now", rec.Config, cfgPath),
			"Run 'clawmesh setup ollama --undo --config %s'", rec.Config)
	}
	cur, err := os.ReadFile(cfgPath)
	if err != nil {
		return fmt.Errorf("cannot read the node's config: %v", err)
	}
	after, err := setup.UndoTOMLKeys(string(cur), rec.Keys)
	if err != nil {
		return withHint(fmt.Errorf("%s: %s", cfgPath, strings.TrimPrefix(err.Error(), "setup: ")),
			"Edit serve and model in %s by hand, then remove %s", cfgPath, recPath)
	}
	if rec.NoFinalNewline {
		after = strings.TrimSuffix(after, "\n")
	}
	remove := rec.Created && strings.TrimSpace(after) == ""
	if dry {
		fmt.Fprint(stdout, setup.Diff(cfgPath, cfgPath+" (after undo)", string(cur), after))
		fmt.Fprintln(stdout, "\nNothing was changed (--dry-run).")
		return nil
	}
	if remove {
		err = os.Remove(cfgPath)
	} else {
		fi, serr := os.Stat(cfgPath)
		if serr != nil {
			return serr
		}
		err = atomicfile.Write(cfgPath, []byte(after), fi.Mode().Perm())
	}
	if err != nil {
		return fmt.Errorf("cannot write the node's config: %v", err)
	}
	if err := os.Remove(recPath); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "The node's config is as it was before setup ollama (%s): it no longer serves %s.\n", cfgPath, rec.Model)
	return nil
}

// installedVersion is the newest adapter version installed on a node.
type installedVersion struct {
	name string
	id   baseid.ID // the base it was trained on
}

// newestInstalled finds the newest version installed in DATA/adapters
// and the base it was trained on.
func newestInstalled(data string) (installedVersion, error) {
	ents, err := os.ReadDir(filepath.Join(data, node.AdaptersDir))
	if err != nil {
		return installedVersion{}, err
	}
	var best uint64
	var name string
	for _, e := range ents {
		if n, err := adapters.ParseVersion(e.Name()); err == nil && e.IsDir() && n > best {
			best, name = n, e.Name()
		}
	}
	if name == "" {
		return installedVersion{}, fs.ErrNotExist
	}
	id, err := baseid.FromAdapter(filepath.Join(data, node.AdaptersDir, name))
	return installedVersion{name: name, id: id}, err
}

// sizeText is a file size for people: "2.5 GiB", "140.2 MiB".
func sizeText(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
