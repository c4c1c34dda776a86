package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/modelserver"
	"github.com/clawmesh/clawmesh/node/setup"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/reward"
)

const nodeHelp = `Usage: clawmesh node [flags]

Runs a device node: an OpenAI- and Anthropic-compatible gateway on loopback
that forwards every call to your LLM server (--upstream), streams the reply
back unchanged, and records each call, with what followed it, in the
DataPool under --data. Closed steps are scored by the reward plugins in the
background.

Point your agent at the gateway instead of the LLM server:
  OpenAI SDKs      base URL http://127.0.0.1:8400/v1
  Anthropic SDKs   base URL http://127.0.0.1:8400
  OpenClaw         provider baseUrl http://127.0.0.1:8400/v1, api "openai-completions"
Pin a session with the URL prefix /s/SESSION/v1/... or the X-Session-Id header.

With no upstream set, the node looks for a local model server on its usual
port (Ollama 11434, LM Studio 1234, vLLM 8000, llama.cpp 8080, SGLang 30000)
that answers /v1/models, uses it (asking which, in a terminal, when several
answer) and says which it chose.

With --serve, the node runs the model server itself and needs no
--upstream (giving both is an error; given here, either wins over the
other in the config file): it starts the server on a free
127.0.0.1 port with --model, forwards to it, restarts it if it crashes
or stops answering (waiting longer after each crash; after 5 crashes in
a row before it answers it gives up and says why), appends the server's
output to a log in DATA/logs (clawmesh.log, mlx.log, or one per version
for llama-server: llama-server-base.log, llama-server-v3.log), and stops
it when the node stops.
  --serve clawmesh       clawmesh serve --model DIR (this program, or
                         --serve-bin): a Hugging Face model directory
  --serve mlx            mlx_lm.server --model PATH (mlx-lm, Apple
                         silicon): an MLX model directory or repo
  --serve llama-server   llama-server -m FILE.gguf (llama.cpp)
--serve-args passes more arguments to the server (quoted as in a shell),
e.g. --serve-args "-c 8192 --threads 8". In a mesh, each adapter version
the node follows goes into service on that server: clawmesh serve and
mlx_lm.server load it while they run; llama-server reads adapters only
when it starts, so the node exports the version as a GGUF adapter
(DATA/gguf/vN.gguf), starts a second llama-server with --lora on it,
sends new calls there once it answers, and stops the old one when the
calls still running on it have finished (each call is served wholly by
one of them; both map the same model file, so the second costs its own
context memory, not the model's again). A restarted llama-server keeps
its version.

On the same address: the owner's dashboard at /clawmesh/ (open the URL that
'clawmesh login' prints first) and Prometheus metrics at /metrics.

Settings come from flags, then CLAWMESH_* environment variables
(CLAWMESH_UPSTREAM, CLAWMESH_LISTEN, CLAWMESH_DATA, CLAWMESH_TOKEN,
CLAWMESH_UPSTREAM_KIND, CLAWMESH_CONFIG), then the config file
(DATA/config.toml by default), then defaults.

Scored steps leave the device only as the sharing policy ([share] in the
config file) allows, scrubbed of personal data and secrets, in outbox
batches: see 'clawmesh pool preview' for exactly what would leave, and
'clawmesh scrub --help'. With no [share] mode, a node that has joined a
mesh shares its scored steps that carry a learning signal (mode
"scored"), and a node in no mesh shares nothing; mode = "none" keeps
everything on this device. The node logs the policy in force at start.

SIGINT or SIGTERM stops accepting new calls, lets in-flight streams finish
(up to --drain-timeout), and exits; whatever state the pool is in, the node
is gone a few seconds after the drain timeout, and a second SIGINT or
SIGTERM exits at once.

Recording never stops the agent: a full or failing disk, or a damaged pool,
pauses recording (calls are still answered), 'clawmesh pool stats' says why,
and the node records again by itself once the disk works (or after
'clawmesh pool repair'). Below --min-free free space the node pauses
recording before the disk is full.

A call the LLM server refused (4xx, 5xx) or could not be reached for is
recorded as failed: counted by 'clawmesh pool stats', listed by 'clawmesh
pool ls --state failed', never scored, batched or shipped, and of its long
texts (a prompt refused as too long) only the first 16 KiB are kept. A call
whose body is over --max-body is refused with 413 and not recorded.

Memory stays bounded under load: the gateway follows at most --max-sessions
conversations at once, the pool's caches and the reward plugins' instances
have fixed budgets, and --memory-limit (default 512MiB) makes the Go runtime
collect harder rather than grow past it: under a sustained overload the
node's RSS levels off near the limit plus about 150 MiB held outside the Go
heap (Pebble's block cache and memtables, the plugins' compiled code). The scorer
keeps up with bursts of over a thousand calls a second; past
--max-score-backlog waiting steps it skips the oldest and comes back to
them once it has caught up ('clawmesh bench soak' measures both).

SIGHUP reloads the reward plugins ([[plugins]]) and the sharing
policy ([share]) from the config file; a new set with a plugin that cannot
be loaded is refused (logged as an error, naming it) and the plugins in use
stay. A relative plugin path is
resolved from the config file's directory.

The gateway serves at once; the reward plugins are compiled in the
background (seconds on a first start, whose log says so; then cached in
clawmesh/wazero in the user's cache directory, shared by the nodes of the
machine, or in DATA/cache when there is none) and score what was recorded
meanwhile once they are ready; a plugin unused for 30s lets its compiled
code and instances go (most of an idle node's memory) and is loaded again
from the cache by the next step it scores. The
node does not start if an enabled plugin's file cannot be read or is not
WebAssembly, and stops, naming it, if one turns out unusable as it is
compiled (missing exports, a start-up that fails).

One process at a time has a data directory: a node refuses one that a
node, a trainer or a command writing it (pool import, mesh init, ...)
holds, naming the command, its pid and since when; and it refuses a
trainer's directory. An upstream that is the gateway itself (its --listen
address; 127.0.0.1, localhost, [::1] and 0.0.0.0 count as one) is refused
at start, and a call that comes back to the gateway through other hops
(X-Clawmesh-Hop) is answered 508 Loop Detected and not recorded. A
--listen address in use is found before the data directory is made.

Examples:
  clawmesh node --upstream http://127.0.0.1:11434/v1 --upstream-kind ollama --data ~/.clawmesh
  clawmesh node --serve llama-server --model ~/models/Qwen3-0.6B-F16.gguf
`

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var s settings
	fs := newFlags("node", nodeHelp, stderr)
	s.bindCommon(fs)
	fs.StringVar(&s.Upstream, "upstream", "", "LLM server base URL including /v1, e.g. http://127.0.0.1:11434/v1 (default: a local server that answers on its usual port: Ollama, LM Studio, vLLM, llama.cpp, SGLang)")
	fs.StringVar(&s.UpstreamKind, "upstream-kind", "", "upstream flavour: openai, vllm, sglang, clawmesh, ollama, llamacpp, mlx (mlx_lm.server), none (decides whether logprobs and token ids are asked for, and how adapter versions are swapped in; default openai)")
	fs.StringVar(&s.UpstreamToken, "upstream-token", "", "bearer token sent to the upstream instead of the client's")
	fs.StringVar(&s.Serve, "serve", "", "run this model server and forward to it, instead of --upstream: llama-server, mlx or clawmesh")
	fs.StringVar(&s.Model, "model", "", "with --serve: what the server serves (llama-server: a GGUF file; mlx: an MLX model directory or repo; clawmesh: a Hugging Face model directory)")
	fs.StringVar(&s.ServeBin, "serve-bin", "", "with --serve: the server's program (default: llama-server or mlx_lm.server on PATH; this program for clawmesh)")
	fs.StringVar(&s.ServeArgs, "serve-args", "", `with --serve: more arguments for the server, quoted as in a shell (e.g. "-c 8192 --threads 8")`)
	fs.StringVar(&s.JudgeModel, "judge-model", "", "model name for reward plugins' judge calls (default: the model the judged step asked for)")
	fs.DurationVar(&s.PluginDeadline, "reward-deadline", 0, "deadline of one reward plugin call (default 100ms; [rewards] deadline)")
	fs.Int64Var(&s.PluginMemoryMiB, "reward-memory-mib", 0, "memory cap of a reward plugin instance, MiB (default 64; [rewards] memory_mib)")
	fs.DurationVar(&s.JudgeTimeout, "judge-timeout", 0, "time budget of the judge calls of one reward plugin call (default 30s; [rewards] judge_timeout)")
	fs.Func("allow-host", "a host name, beyond loopback names and IP addresses, that clients may reach the gateway by when it has no --token (repeat, or separate by commas); other names are refused, against DNS rebinding", func(v string) error {
		for _, h := range strings.Split(v, ",") {
			if h = strings.TrimSpace(h); h == "" || strings.ContainsAny(h, "/: ") {
				return fmt.Errorf("%q is not a host name", h)
			}
			s.AllowedHosts = append(s.AllowedHosts, strings.TrimSpace(h))
		}
		return nil
	})
	fs.DurationVar(&s.IdleTimeout, "idle-timeout", 0, "close a session's chain after this long without a call; its last step then has no next state (default 30m)")
	fs.DurationVar(&s.DrainTimeout, "drain-timeout", 0, "on SIGTERM or SIGINT, let in-flight calls and streams run this long before cutting them (default 60s)")
	fs.DurationVar(&s.MaxAge, "max-age", 0, "retention: drop steps older than this (e.g. 720h; 0 keeps them)")
	fs.Int64Var(&s.MaxBytes, "max-bytes", 0, "retention: keep the pool under this many bytes (0: no limit)")
	noScore := fs.Bool("no-scoring", false, "do not score closed steps in the background")
	maxBody := fs.String("max-body", "32MiB", "largest request body a call may send (a number of bytes, or with KiB, MiB or GiB); larger calls are refused with 413")
	logRequests := fs.Bool("log-requests", true, "log one line per call (API, model, session, status, stream, duration, step id); --log-requests=false turns it off")
	var p2pListen, bootstrap multiFlag
	fs.Var(&p2pListen, "p2p-listen", "libp2p multiaddr to listen on when the data directory is in a mesh (repeatable; default QUIC and TCP on port 4001, or a free port)")
	fs.Var(&bootstrap, "bootstrap", "a mesh peer's multiaddr to dial at start (repeatable)")
	noMDNS := fs.Bool("no-mdns", false, "do not look for mesh peers on the local network")
	weightsListen := fs.String("weights", ":0", "UDP address of the QUIC service that fetches the trainers' adapter versions and serves them on to other devices, when the data directory is in a mesh; off follows none (see 'clawmesh weights')")
	shareEvery := fs.Duration("share-interval", 0, "how often scored steps are sealed into outbox batches, as [share] allows (default 30s)")
	logLevel := fs.String("log", "info", "log level: debug, info, warn, error")
	personalMode := fs.String("personal", "", "the personal adapter: local (trained here while the agent is idle), mesh (by a trainer you trust) or off; overrides [personal] mode (see 'clawmesh personal --help')")
	memLimit := fs.String("memory-limit", "512MiB", "soft limit of the node's Go memory (the runtime collects harder as it nears it; the process's RSS stays near it plus about 150 MiB that Pebble and the plugins' compiled code hold outside it; a size, or 0 for none; GOMEMLIMIT, if set, wins)")
	maxSessions := fs.Int("max-sessions", 0, "conversations the gateway follows in memory at once; the least recently used one beyond this is closed and forgotten (bounds the node's memory under load; default 10000)")
	maxBacklog := fs.Int("max-score-backlog", 0, "closed steps the scorer may fall behind by; beyond this it skips the oldest (counted as shed in 'clawmesh pool stats') and scores them once it has caught up (default 50000)")
	minFreeFlag := fs.String("min-free", "", "pause recording while the data directory's filesystem has less than this free (a number of bytes, or with KiB, MiB or GiB; 0 turns the guard off); recording resumes at a quarter more (default the smaller of 1GiB and 5% of the filesystem)")
	if err := parse(fs, args); err != nil {
		return err
	}
	maxBodyBytes, err := parseSize(*maxBody)
	if err != nil || maxBodyBytes < 1024 {
		return usageErr("--max-body %q: want a size of at least 1KiB, such as 32MiB", *maxBody)
	}
	var minFree int64
	if *minFreeFlag != "" {
		v, err := parseSize(*minFreeFlag)
		if err != nil || v < 0 {
			return usageErr("--min-free %q: want a size such as 1GiB, or 0 to turn the guard off", *minFreeFlag)
		}
		minFree = v
		if v == 0 {
			minFree = -1
		}
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments %q", fs.Args())
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	if s.IdleTimeout < 0 {
		return usageErr("--idle-timeout must be positive")
	}
	if s.DrainTimeout < 0 {
		return usageErr("--drain-timeout must be positive")
	}
	if s.PluginDeadline < 0 || s.JudgeTimeout < 0 {
		return usageErr("--reward-deadline and --judge-timeout must be positive")
	}
	if *shareEvery < 0 {
		return usageErr("--share-interval must be positive")
	}
	memLimitBytes, err := parseSize(*memLimit)
	if err != nil || memLimitBytes < 0 || (memLimitBytes > 0 && memLimitBytes < 64<<20) {
		return usageErr("--memory-limit %q: want a size of at least 64MiB, such as 1GiB, or 0 for none", *memLimit)
	}
	if memLimitBytes > 0 && os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memLimitBytes)
	}
	if *maxSessions < 0 || *maxBacklog < 0 {
		return usageErr("--max-sessions and --max-score-backlog must be positive")
	}
	if s.PluginMemoryMiB < 0 || s.PluginMemoryMiB > 4096 {
		return usageErr("--reward-memory-mib must be 1 to 4096")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageErr("--log: %v", err)
	}
	log := newLogger(stderr, level)
	serve, err := serveConfig(s)
	if err != nil {
		return err
	}
	if err := personalFlag(&s, *personalMode); err != nil {
		return err
	}
	pcfg, err := personalConfig(s, serve, log)
	if err != nil {
		return err
	}
	if s.Upstream == "" && serve == nil {
		f, err := discoverUpstream(ctx, stdin, stdinIsTerminal(), stderr)
		if err != nil {
			return err
		}
		s.Upstream = f.URL
		if s.UpstreamKind == "" {
			s.UpstreamKind = f.Kind
		}
		log.Info("no upstream configured: using the local model server that answers", "server", f.Name, "upstream", f.URL,
			"kind", s.UpstreamKind, "models", len(f.Models), "fix", "upstream in "+nodeConfigPath(s))
	}
	if _, _, err := net.SplitHostPort(s.Listen); s.Listen != "" && err != nil {
		return usageErr("--listen %q: want HOST:PORT, such as 127.0.0.1:8400", s.Listen)
	}
	if s.Listen != "" && !isLoopback(s.Listen) && s.Token == "" {
		log.Warn("gateway listens beyond loopback with no --token: anyone who can reach it can use your LLM through it", "listen", s.Listen)
	}
	cfg := node.Config{
		DataDir:       s.Data,
		Listen:        s.Listen,
		Upstream:      s.Upstream,
		UpstreamKind:  s.UpstreamKind,
		Token:         s.Token,
		UpstreamToken: s.UpstreamToken,
		AllowedHosts:  s.AllowedHosts,
		IdleTimeout:   s.IdleTimeout,
		DrainTimeout:  s.DrainTimeout,
		JudgeModel:    s.JudgeModel,
		MaxAge:        s.MaxAge,
		MaxBytes:      s.MaxBytes,
		Plugins:       s.Plugins,
		Share:         s.Share,
		Mesh:          &node.MeshConfig{Listen: p2pListen, Bootstrap: bootstrap, MDNS: !*noMDNS, NAT: true, Weights: *weightsListen},
		ShareInterval: *shareEvery,
		NoScoring:     *noScore,
		LogCalls:      *logRequests,
		MaxBody:       maxBodyBytes,
		MinFree:       minFree,
		Logger:        log,

		MaxSessions:     *maxSessions,
		MaxScoreBacklog: *maxBacklog,
		PoolFS:          poolFS(s.Data),

		PluginDeadline:    s.PluginDeadline,
		PluginMemoryLimit: uint64(s.PluginMemoryMiB) << 20,
		JudgeTimeout:      s.JudgeTimeout,
		Serve:             serve,
		Personal:          pcfg,
	}
	// Everything that can be checked is checked before the data directory
	// is made or a plugin compiled, and the directory is this process's
	// before anything in it is opened: taken first when it exists, so that
	// a node or trainer already on it is named (not its port).
	lock, err := lockData(s.Data, "node", false)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	defer func() { lock.Release() }()
	if err := node.Preflight(ctx, cfg); err != nil {
		return nodeStartError(err, s.Data)
	}
	listen := cmp.Or(s.Listen, node.DefaultListen)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return listenError(err, listen)
	}
	if lock == nil {
		if lock, err = lockData(s.Data, "node", true); err != nil {
			ln.Close()
			return err
		}
	}
	n, err := node.New(ctx, cfg)
	if err != nil {
		ln.Close()
		return nodeStartError(err, s.Data)
	}
	// SIGHUP re-reads the config file's plugins and swaps them in.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			reloadPlugins(ctx, s, n, log)
			reloadShare(s, n, log)
		}
	}()
	finished := make(chan struct{})
	defer close(finished)
	go exitIfStuck(ctx, finished, s.DrainTimeout, stderr)
	runErr := n.Serve(ctx, ln)
	closeCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Close(closeCtx); err != nil && runErr == nil {
		runErr = err
	}
	if runErr == nil {
		fmt.Fprintln(stderr, "clawmesh node: stopped")
	}
	return nodeStartError(runErr, s.Data)
}

// serveConfig is the model server the node runs, from --serve, --model,
// --serve-bin and --serve-args (nil: none).
func serveConfig(s settings) (*modelserver.Config, error) {
	if s.Serve == "" {
		if s.Model != "" || s.ServeBin != "" || s.ServeArgs != "" {
			return nil, usageErr("--model, --serve-bin and --serve-args go with --serve (llama-server, mlx or clawmesh)")
		}
		return nil, nil
	}
	if !slices.Contains(modelserver.Kinds(), s.Serve) {
		return nil, usageErr("--serve %q: want one of %s", s.Serve, strings.Join(modelserver.Kinds(), ", "))
	}
	if s.Upstream != "" {
		return nil, usageErr("--serve %s and --upstream %s: the node's upstream is the server it runs; give one or the other", s.Serve, s.Upstream)
	}
	if s.Model == "" {
		return nil, usageErr("--serve %s needs --model (%s)", s.Serve, map[string]string{
			modelserver.KindLlamaServer: "a GGUF file", modelserver.KindMLX: "an MLX model directory or repo", modelserver.KindClawmesh: "a Hugging Face model directory"}[s.Serve])
	}
	args, err := splitArgs(s.ServeArgs)
	if err != nil {
		return nil, usageErr("--serve-args: %v", err)
	}
	model := expandHome(s.Model)
	if _, err := os.Stat(model); err == nil {
		model, _ = filepath.Abs(model)
	} else if s.Serve != modelserver.KindMLX {
		return nil, usageErr("--model %s: %v", s.Model, errors.Unwrap(err))
	}
	bin := s.ServeBin
	if bin != "" {
		bin = expandHome(bin)
	}
	return &modelserver.Config{Kind: s.Serve, Model: model, Bin: bin, Args: args}, nil
}

// splitArgs splits a command line as a POSIX shell would, without
// expanding anything: words separated by blanks, '...' taken as it is,
// "..." with \\ \" \$ \` escapes, and \ escaping a character outside
// quotes. (Written here: the standard library has no such splitter and
// none is among this module's dependencies.)
func splitArgs(line string) ([]string, error) {
	var (
		out   []string
		cur   strings.Builder
		word  bool
		quote rune
	)
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case quote == '"':
			switch {
			case c == '"':
				quote = 0
			case c == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`+"`", rs[i+1]):
				i++
				cur.WriteRune(rs[i])
			default:
				cur.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, word = c, true
		case c == '\\':
			if i+1 == len(rs) {
				return nil, fmt.Errorf("a \\ ends %q", line)
			}
			i++
			cur.WriteRune(rs[i])
			word = true
		case c == ' ' || c == '\t' || c == '\n':
			if word {
				out = append(out, cur.String())
				cur.Reset()
				word = false
			}
		default:
			cur.WriteRune(c)
			word = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unclosed %c in %q", quote, line)
	}
	if word {
		out = append(out, cur.String())
	}
	return out, nil
}

// nodeStartError is why a node could not start, as its user reads it: a
// setting the node refused is a usage error; a pool or an address another
// process holds says so, and what to do.
func nodeStartError(err error, data string) error {
	var op *net.OpError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, node.ErrConfig):
		return usageErr("%s", strings.TrimPrefix(userMessage(err.Error()), "bad config: "))
	case errors.Is(err, pool.ErrLocked):
		return withHint(fmt.Errorf("another clawmesh process (a node, or a pool command) is using the pool in %s", data),
			"Stop it first, or give 'clawmesh node' another --data")
	case errors.Is(err, syscall.EADDRINUSE) && errors.As(err, &op) && op.Addr != nil:
		return addrError(err, "the gateway", "node", op.Addr.String(), "listen")
	}
	return err
}

// listenError says why the gateway cannot listen on addr, and what to do.
func listenError(err error, addr string) error {
	return addrError(err, "the gateway", "node", addr, "listen")
}

// addrError says why what (of the command cmd: node, trainer, serve)
// cannot listen on addr, in one line, and which flag picks another.
func addrError(err error, what, cmd, addr, flag string) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		another := cmd
		if cmd == "serve" {
			another = "model server"
		}
		return withHint(fmt.Errorf("%s address %s is in use by another process (another %s?)", what, addr, another),
			"Stop it, or give 'clawmesh %s' another --%s", cmd, flag)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		err = op.Err
	}
	return withHint(fmt.Errorf("%s cannot listen on %s: %v", what, addr, err), "Give 'clawmesh %s' another --%s", cmd, flag)
}

// poolFS is the filesystem the node's pool is on: the disk (nil), unless
// the binary is built with the faultinject tag for tests (faultinject.go).
var poolFS = func(data string) vfs.FS { return nil }

// stopGrace is how long after the drain timeout a stopping node may take
// to close its store before it exits anyway.
const stopGrace = 10 * time.Second

// exitIfStuck makes shutdown always end: once ctx is done (the first
// SIGINT or SIGTERM), a second signal exits at once, and a node still
// stopping stopGrace after the drain timeout exits anyway (the pool's
// acknowledged writes are on disk; a stuck store loses nothing of them).
func exitIfStuck(ctx context.Context, finished <-chan struct{}, drain time.Duration, stderr io.Writer) {
	select {
	case <-ctx.Done():
	case <-finished:
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	if drain == 0 {
		drain = 60 * time.Second
	}
	t := time.NewTimer(drain + stopGrace)
	defer t.Stop()
	select {
	case <-finished:
	case s := <-sig:
		fmt.Fprintf(stderr, "clawmesh node: %v again: exiting now\n", s)
		os.Exit(1)
	case <-t.C:
		fmt.Fprintf(stderr, "clawmesh node: still stopping %v after the drain timeout: exiting\n", stopGrace)
		os.Exit(1)
	}
}

// reloadPlugins re-reads the config file's plugins and swaps them in, as
// SIGHUP asks. A config that does not parse, or a set with a plugin that
// cannot be loaded, is logged as an error and changes nothing.
func reloadPlugins(ctx context.Context, s settings, n *node.Node, log *slog.Logger) {
	fresh := settings{Config: s.Config, Data: s.Data}
	if err := fresh.resolve(newFlags("node", "", io.Discard)); err != nil {
		log.Error("reward plugins not reloaded; the plugins in use stay", "err", err)
		return
	}
	if err := n.ReloadPlugins(ctx, fresh.Plugins); err != nil {
		log.Error("reward plugins not reloaded; the plugins in use stay", "config", fresh.Config, "err", err)
		return
	}
	plugins := fresh.Plugins
	if plugins == nil {
		plugins = reward.Builtins()
	}
	var on []string
	for _, p := range plugins {
		if p.Enabled {
			on = append(on, p.Name)
		}
	}
	log.Info("reward plugins reloaded", "config", fresh.Config, "enabled", strings.Join(on, ","))
}

// reloadShare re-reads the config file's [share] policy and puts it in
// force, as SIGHUP asks; an invalid one is logged and changes nothing.
func reloadShare(s settings, n *node.Node, log *slog.Logger) {
	fresh := settings{Config: s.Config, Data: s.Data}
	if err := fresh.resolve(newFlags("node", "", io.Discard)); err != nil {
		log.Error("sharing policy not reloaded; the policy in force stays", "err", err)
		return
	}
	if err := n.ReloadShare(fresh.Share); err != nil {
		log.Error("sharing policy not reloaded; the policy in force stays", "config", fresh.Config, "err", err)
		return
	}
	p := n.Outbox().Policy()
	log.Info("sharing policy reloaded: "+p.Summary(), "config", fresh.Config, "mode", p.Mode, "policy", p.Digest())
}

func isLoopback(addr string) bool {
	host := addr
	if i := strings.LastIndex(addr, ":"); i >= 0 {
		host = addr[:i]
	}
	host = strings.Trim(host, "[]")
	return host == "127.0.0.1" || host == "localhost" || host == "::1" || strings.HasPrefix(host, "127.")
}

// parseSize reads a size in bytes: a number, optionally followed by KiB,
// MiB or GiB (or K, M, G, KB, MB, GB, meaning the same powers of 1024).
func parseSize(v string) (int64, error) {
	t, mult := strings.TrimSpace(v), int64(1)
	units := []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"GB", 1 << 30}, {"G", 1 << 30}, {"MiB", 1 << 20}, {"MB", 1 << 20}, {"M", 1 << 20},
		{"KiB", 1 << 10}, {"KB", 1 << 10}, {"K", 1 << 10}, {"B", 1}}
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.m
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q", v)
	}
	return n * mult, nil
}

// localServers are the model servers looked for when no upstream is set;
// tests point it elsewhere.
var localServers = setup.LocalServers

// stdin is where a question to the user is answered.
var stdin io.Reader = os.Stdin

// stdinIsTerminal says whether a person can answer on stdin: a terminal,
// not /dev/null (a character device too, and what launchd and systemd give
// a service).
func stdinIsTerminal() bool { return isTerminal(os.Stdin) }

// discoverUpstream finds the local model servers that answer and picks
// one: the only one, else the user's choice in a terminal, else the first
// in the order of localServers.
func discoverUpstream(ctx context.Context, in io.Reader, interactive bool, out io.Writer) (node.Found, error) {
	found := node.Discover(ctx, localServers)
	if len(found) == 0 {
		var where []string
		for _, s := range localServers {
			where = append(where, s.Name+" :"+s.Port)
		}
		return node.Found{}, usageErr("no upstream is set, and no local model server answers at /v1/models on its usual port (%s): start one, or give --upstream URL (or upstream in the config file)", strings.Join(where, ", "))
	}
	if len(found) == 1 || !interactive {
		return found[0], nil
	}
	fmt.Fprintln(out, "No upstream is set, and several model servers answer:")
	for i, f := range found {
		fmt.Fprintf(out, "  %d) %s at %s (%s)\n", i+1, f.Name, f.URL, plural(len(f.Models), "model", "models"))
	}
	r := bufio.NewReader(in)
	for range 3 {
		fmt.Fprintf(out, "Which one should the node forward to? [1-%d, default 1] ", len(found))
		line, err := r.ReadString('\n')
		line = strings.TrimSpace(line)
		if line == "" {
			return found[0], nil
		}
		if i, perr := strconv.Atoi(line); perr == nil && i >= 1 && i <= len(found) {
			return found[i-1], nil
		}
		if err != nil {
			break
		}
	}
	return node.Found{}, usageErr("no model server chosen")
}

// plural writes n with the noun in agreement: "1 model", "2 models".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}
