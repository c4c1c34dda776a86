package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"path/filepath"
	"strings"

	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/model/serve"
)

const serveHelp = `Usage: clawmesh serve --model DIR | --tiny [flags]

Serves a model with the native Go engine (CPU) as an OpenAI-compatible
server: POST /v1/chat/completions (streaming, n, seed, stop, logprobs,
vLLM's return_token_ids, Qwen tool calls and <think> reasoning) and
GET /v1/models. Every response names the adapter version that served it
in the X-Clawmesh-Adapter header.

--model reads a Hugging Face model directory: config.json,
model.safetensors (F32, BF16 or F16), tokenizer.json, and the chat
template from tokenizer_config.json when it has one (else Qwen3's).
--tiny serves a tiny random Qwen3-shaped model with a tiny tokenizer,
built in memory: everything works with no download (the text is noise).

Adapters (PEFT: adapter_config.json + adapter_model.safetensors) load at
start with --adapter, and at any time without dropping a request:
  curl -X POST http://127.0.0.1:8401/clawmesh/v1/adapter \
       -d '{"path": "/path/to/adapter", "version": "v3"}'
Requests in flight finish on the adapter they started with.

Web pages cannot use the server: browsers' cross-origin requests are
refused, and without --token so are names other than localhost and IP
addresses (against DNS rebinding; --allow-host adds names).

Examples:
  clawmesh serve --tiny
  clawmesh serve --tiny --save-tiny /tmp/tiny     # also write it as an HF dir
  clawmesh serve --model ~/models/Qwen3-0.6B --adapter ./adapters/v3
  # record the calls of an agent pointed at the node:
  clawmesh node --upstream http://127.0.0.1:8401/v1 --upstream-kind clawmesh
  curl http://127.0.0.1:8401/v1/chat/completions \
       -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}'
`

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fset := newFlags("serve", serveHelp, stderr)
	model := fset.String("model", "", "Hugging Face model directory to serve")
	tiny := fset.Bool("tiny", false, "serve a tiny random model and tokenizer built in memory")
	saveTiny := fset.String("save-tiny", "", "with --tiny: also write the tiny model and tokenizer to this directory")
	listen := fset.String("listen", "127.0.0.1:8401", "address to listen on")
	adapter := fset.String("adapter", "", "PEFT adapter directory to load at start")
	adapterVersion := fset.String("adapter-version", "", "version name of --adapter (default: its directory name)")
	seed := fset.Uint64("seed", 1, "seed of the tiny model's weights and of the LoRA initialisation")
	name := fset.String("name", "", "model id reported to clients (default: tiny, or the model directory's name)")
	maxTokens := fset.Int("max-tokens", 0, "completion length when a request sets none (default 1024)")
	concurrency := fset.Int("concurrency", 0, "completions generated at once (default: the number of CPUs)")
	threads := fset.Int("threads", 0, "goroutines per matrix product (default: the number of CPUs)")
	token := fset.String("token", "", "bearer token clients must send (default: none)")
	var allowHosts []string
	fset.Func("allow-host", "a host name, beyond loopback names and IP addresses, that clients may reach the server by when it has no --token (repeat, or separate by commas); other names are refused, against DNS rebinding", func(v string) error {
		for _, h := range strings.Split(v, ",") {
			if h = strings.TrimSpace(h); h == "" || strings.ContainsAny(h, "/: ") {
				return fmt.Errorf("%q is not a host name", h)
			}
			allowHosts = append(allowHosts, h)
		}
		return nil
	})
	logLevel := fset.String("log", "info", "log level: debug, info, warn, error")
	if err := parse(fset, args); err != nil {
		return err
	}
	if fset.NArg() > 0 {
		return usageErr("unexpected arguments %q", fset.Args())
	}
	if (*model == "") == !*tiny {
		return usageErr("give exactly one of --model DIR and --tiny")
	}
	if *saveTiny != "" && !*tiny {
		return usageErr("--save-tiny needs --tiny")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageErr("--log: %v", err)
	}
	log := newLogger(stderr, level)
	if !isLoopback(*listen) && *token == "" {
		log.Warn("serving beyond loopback with no --token: anyone who can reach it can use the model and load adapters", "listen", *listen)
	}

	opts := native.Options{Name: *name, Seed: *seed, Threads: *threads, Logger: log}
	var (
		eng *native.Engine
		txt modeldir.Text
		err error
	)
	if *tiny {
		if opts.Name == "" {
			opts.Name = "tiny"
		}
		var cfg native.Config
		if txt, cfg, err = modeldir.Tiny(); err != nil {
			return err
		}
		if eng, err = native.NewTiny(cfg, *seed, opts); err != nil {
			return err
		}
		if *saveTiny != "" {
			if err := native.CreateTiny(*saveTiny, cfg, *seed); err != nil {
				return err
			}
			if err := txt.Tokenizer.Save(filepath.Join(*saveTiny, modeldir.TokenizerFile)); err != nil {
				return err
			}
			log.Info("tiny model written", "dir", *saveTiny)
		}
	} else {
		if opts.Name == "" {
			opts.Name = filepath.Base(filepath.Clean(*model))
		}
		if txt, err = modeldir.Load(*model); errors.Is(err, fs.ErrNotExist) {
			return withHint(fmt.Errorf("%s is not a model directory: %v", *model, strings.TrimPrefix(userMessage(err.Error()), "open ")),
				"Give 'clawmesh serve --model' a Hugging Face model directory (config.json, model.safetensors, tokenizer.json), or try --tiny")
		} else if err != nil {
			return err
		}
		if txt.TemplateErr != nil {
			log.Warn("no usable chat template in tokenizer_config.json; using Qwen3's", "err", txt.TemplateErr)
		}
		if eng, err = native.Open(ctx, *model, opts); err != nil {
			return err
		}
	}
	defer eng.Close()

	srv, err := serve.New(serve.Config{
		Model:         eng,
		Tokenizer:     txt.Tokenizer,
		Renderer:      txt.Renderer,
		ModelName:     opts.Name,
		MaxTokens:     *maxTokens,
		MaxConcurrent: *concurrency,
		Token:         *token,
		AllowedHosts:  allowHosts,
		Logger:        log,
	})
	if err != nil {
		return err
	}
	if *adapter != "" {
		v := *adapterVersion
		if v == "" {
			v = filepath.Base(filepath.Clean(*adapter))
		}
		if err := srv.LoadAdapter(ctx, *adapter, v); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return addrError(err, "the model server", "serve", *listen, "listen")
	}
	info := eng.Info()
	fmt.Fprintf(stdout, "clawmesh serve: %s on http://%s/v1 (adapter %s, %d params, context %d)\n",
		opts.Name, ln.Addr(), srv.Adapter(), info.Params, info.MaxPosition)
	if err := srv.Run(ctx, ln); err != nil {
		return err
	}
	fmt.Fprintln(stderr, "clawmesh serve: stopped")
	return nil
}
