package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/internal/private"
	"github.com/clawmesh/clawmesh/node/personal"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/reward"
)

// fileConfig is the TOML config file. Every key is optional.
//
//	data          = "~/.clawmesh"
//	listen        = "127.0.0.1:8400"
//	upstream      = "http://127.0.0.1:11434/v1"
//	upstream_kind = "ollama"
//	token         = ""
//	judge_model   = "qwen3:8b"
//	allowed_hosts = ["macmini.lan"]
//	idle_timeout  = "30m"
//	drain_timeout = "60s"
//	serve         = "llama-server"   # a model server the node runs itself: llama-server, mlx, clawmesh
//	model         = "/path/to/model.gguf"
//	serve_bin     = ""               # the server's program (default: found on PATH)
//	serve_args    = ""               # more arguments for it
//
//	[retention]
//	max_age   = "720h"
//	max_bytes = 10_000_000_000
//
//	[share]                 # what may leave the device; read at start and on SIGHUP
//	mode  = "scored"        # "none" (nothing leaves, ever), "scored" (scored steps with a signal), "all"
//	tools = ["read", "exec"] # tools whose results may leave (scrubbed); others are withheld; ["*"]: all
//	names = ["Alice Zhou", "Project Falcon"]  # words to hide as well
//	min_reward_abs = 0.0    # leave out steps whose |reward| is below this (no signal)
//
//	[personal]              # a personal adapter on top of the mesh's, from this device's steps only; read at start
//	mode      = "off"       # "local" (trained here while the agent is idle), "mesh" (by a trainer you trust), "off"
//	base      = ""          # local: the base model's directory the worker trains on (default: model, if a directory)
//	trainers  = []          # mesh: the peer ids of the trainers you trust with your steps
//	engine    = "native"    # local: native (small models) or torch (where the device has PyTorch)
//	device    = "cpu"       # local, torch: cpu or cuda
//	idle      = "2m"        # local: how long the agent is quiet before training starts
//	min_steps = 16          # new scored steps before a new personal version is trained
//
//	[rewards]               # limits of every plugin call; read at start
//	deadline      = "100ms"
//	memory_mib    = 64
//	judge_timeout = "30s"
//
//	[[plugins]]
//	path    = "polite.wasm" # relative to this file's directory
//	weight  = 1.0
//	enabled = true
//	judge   = false
//	[plugins.config]        # passed to the plugin as meta.config
//	votes = 3
//
// A key the file does not know is an error, so that a misspelt setting is
// not silently ignored.
type fileConfig struct {
	Data          string   `toml:"data"`
	Listen        string   `toml:"listen"`
	Upstream      string   `toml:"upstream"`
	UpstreamKind  string   `toml:"upstream_kind"`
	Token         string   `toml:"token"`
	UpstreamToken string   `toml:"upstream_token"`
	JudgeModel    string   `toml:"judge_model"`
	AllowedHosts  []string `toml:"allowed_hosts"`
	IdleTimeout   string   `toml:"idle_timeout"`
	DrainTimeout  string   `toml:"drain_timeout"`
	Serve         string   `toml:"serve"`
	Model         string   `toml:"model"`
	ServeBin      string   `toml:"serve_bin"`
	ServeArgs     string   `toml:"serve_args"`
	Retention     struct {
		MaxAge   string `toml:"max_age"`
		MaxBytes int64  `toml:"max_bytes"`
	} `toml:"retention"`
	Rewards struct {
		Deadline     string `toml:"deadline"`
		MemoryMiB    int64  `toml:"memory_mib"`
		JudgeTimeout string `toml:"judge_timeout"`
	} `toml:"rewards"`
	Share struct {
		Mode         string   `toml:"mode"`
		Tools        []string `toml:"tools"`
		Names        []string `toml:"names"`
		MinRewardAbs float64  `toml:"min_reward_abs"`
	} `toml:"share"`
	Personal struct {
		Mode     string   `toml:"mode"`
		Base     string   `toml:"base"`
		Trainers []string `toml:"trainers"`
		Engine   string   `toml:"engine"`
		Device   string   `toml:"device"`
		Idle     string   `toml:"idle"`
		MinSteps int      `toml:"min_steps"`
	} `toml:"personal"`
	Plugins []filePlugin `toml:"plugins"`
}

type filePlugin struct {
	Name    string  `toml:"name"`
	Path    string  `toml:"path"`
	Builtin string  `toml:"builtin"`
	Weight  float64 `toml:"weight"`
	Enabled *bool   `toml:"enabled"`
	Judge   bool    `toml:"judge"`
	// Config reaches the plugin as meta.config: strings, numbers, booleans.
	Config map[string]any `toml:"config"`
}

// settings are the values shared by the commands that touch a node: the
// data directory, the gateway address and so on. They come from defaults,
// then the config file, then CLAWMESH_* environment variables, then flags.
type settings struct {
	Config       string
	Data         string
	Listen       string
	Upstream     string
	UpstreamKind string
	// Serve names the model server the node runs itself (llama-server,
	// mlx, clawmesh; "" runs none), Model what it serves, ServeBin its
	// program and ServeArgs more arguments for it.
	Serve, Model, ServeBin, ServeArgs string
	Token                             string
	UpstreamToken                     string
	JudgeModel                        string
	AllowedHosts                      []string
	IdleTimeout                       time.Duration
	DrainTimeout                      time.Duration
	MaxAge                            time.Duration
	MaxBytes                          int64
	Plugins                           []reward.PluginConfig // nil: built-ins
	// Limits of every plugin call ([rewards]); zero: reward's defaults.
	PluginDeadline  time.Duration
	PluginMemoryMiB int64
	JudgeTimeout    time.Duration
	// Share is the [share] policy; Mode "" means the node's default.
	Share share.Policy
	// Personal is the [personal] policy.
	Personal personalSettings
}

// personalSettings are the [personal] policy's settings.
type personalSettings struct {
	Mode     personal.Mode
	Base     string
	Trainers []string
	// Engine and Device are the local worker's (native, or torch on cpu
	// or cuda).
	Engine, Device string
	Idle           time.Duration
	MinSteps       int
}

// envNames maps setting names to their environment variables.
var envNames = map[string]string{
	"config":         "CLAWMESH_CONFIG",
	"data":           "CLAWMESH_DATA",
	"listen":         "CLAWMESH_LISTEN",
	"upstream":       "CLAWMESH_UPSTREAM",
	"upstream-kind":  "CLAWMESH_UPSTREAM_KIND",
	"token":          "CLAWMESH_TOKEN",
	"upstream-token": "CLAWMESH_UPSTREAM_TOKEN",
}

func defaultDataDir() string {
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".clawmesh")
	}
	return ".clawmesh"
}

// bindCommon adds the flags every node-facing command shares.
func (s *settings) bindCommon(flags *flag.FlagSet) {
	flags.StringVar(&s.Config, "config", "", "config file (TOML); default $CLAWMESH_CONFIG, else DATA/config.toml if it exists")
	flags.StringVar(&s.Data, "data", "", "data directory holding the pool (default $CLAWMESH_DATA, else ~/.clawmesh)")
	flags.StringVar(&s.Listen, "listen", "", "gateway address, loopback by default (default $CLAWMESH_LISTEN, else 127.0.0.1:8400)")
	flags.StringVar(&s.Token, "token", "", "bearer token clients must send (default $CLAWMESH_TOKEN, else none)")
}

// bindClient adds the same flags to a command that talks to a running
// node or trainer, with what they mean there.
func (s *settings) bindClient(flags *flag.FlagSet) {
	flags.StringVar(&s.Config, "config", "", "config file (TOML); default $CLAWMESH_CONFIG, else DATA/config.toml if it exists")
	flags.StringVar(&s.Data, "data", "", "data directory of the node or trainer (default $CLAWMESH_DATA, else ~/.clawmesh)")
	flags.StringVar(&s.Listen, "listen", "", "not used here: a running node is found through DATA (its admin.sock, else the address in DATA/node.addr)")
	flags.StringVar(&s.Token, "token", "", "admin credential to send when DATA/admin.token cannot be read (default $CLAWMESH_TOKEN); the owner needs none")
}

// resolve fills s from the config file and the environment, leaving values
// set by flags on fs as they are. A config file that cannot be used says
// so, and that it is to be fixed.
func (s *settings) resolve(flags *flag.FlagSet) error {
	err := s.resolveFile(flags)
	var h *hinted
	if err == nil || errors.Is(err, errUsage) || errors.As(err, &h) {
		return err
	}
	return withHint(err, "Fix the config file, or give another with --config ('clawmesh node --help' says where settings come from)")
}

func (s *settings) resolveFile(flags *flag.FlagSet) error {
	set := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	env := func(name string, dst *string) {
		if !set[name] {
			if v, ok := os.LookupEnv(envNames[name]); ok && v != "" {
				*dst = v
				set[name] = true
			}
		}
	}
	env("config", &s.Config)
	env("data", &s.Data)
	data := s.Data
	if data == "" {
		data = defaultDataDir()
	}
	if fi, err := os.Stat(expandHome(data)); err == nil && !fi.IsDir() {
		return fmt.Errorf("%w: --data %s is a file: the data directory must be a directory (or not exist yet)", errUsage, data)
	} else if errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%w: --data %s is inside a file, not a directory: the data directory must be a directory (or not exist yet)", errUsage, data)
	}
	path, explicit := s.Config, s.Config != ""
	if !explicit {
		path = filepath.Join(expandHome(data), "config.toml")
	}
	var fc fileConfig
	if md, err := toml.DecodeFile(expandHome(path), &fc); err != nil {
		if !explicit && errors.Is(err, fs.ErrNotExist) {
			// No config file: defaults only.
		} else {
			return fmt.Errorf("config %s: %w", path, err)
		}
	} else {
		for _, k := range md.Undecoded() {
			if len(k) >= 3 && k[0] == "plugins" && k[2] == "config" {
				continue // checked below, per plugin
			}
			return fmt.Errorf("config %s: unknown key %q", path, k.String())
		}
		s.Config = path
		if fc.Token != "" || fc.UpstreamToken != "" {
			// Credentials are the owner's (as ssh is with a private key).
			if err := private.CheckFile(expandHome(path)); err != nil {
				mode := ""
				if fi, serr := os.Stat(expandHome(path)); serr == nil {
					mode = fmt.Sprintf(" (mode %#o)", fi.Mode().Perm())
				}
				return withHint(fmt.Errorf("config %s holds tokens, and other accounts can read it%s", path, mode),
					"Run 'chmod 600 %s' so that only you can read it", path)
			}
		}
	}
	file := func(name string, dst *string, v string) {
		if !set[name] && v != "" {
			*dst = v
		}
	}
	file("data", &s.Data, fc.Data)
	for _, p := range []struct {
		name string
		dst  *string
		file string
	}{
		{"listen", &s.Listen, fc.Listen},
		{"upstream", &s.Upstream, fc.Upstream},
		{"upstream-kind", &s.UpstreamKind, fc.UpstreamKind},
		{"token", &s.Token, fc.Token},
		{"upstream-token", &s.UpstreamToken, fc.UpstreamToken},
		{"serve", &s.Serve, fc.Serve},
		{"model", &s.Model, fc.Model},
		{"serve-bin", &s.ServeBin, fc.ServeBin},
		{"serve-args", &s.ServeArgs, fc.ServeArgs},
	} {
		env(p.name, p.dst)
		file(p.name, p.dst, p.file)
	}
	// A model server to run and an upstream to forward to exclude each
	// other: the one given here (flag or environment) wins over the
	// other from the file (the upstream setup openclaw recorded, say,
	// when the node is told to run its server itself).
	switch {
	case set["serve"] && !set["upstream"]:
		if !set["upstream-kind"] {
			s.UpstreamKind = ""
		}
		s.Upstream = ""
	case set["upstream"] && !set["serve"]:
		s.Serve, s.Model, s.ServeBin, s.ServeArgs = "", "", "", ""
	}
	if s.JudgeModel == "" {
		s.JudgeModel = fc.JudgeModel
	}
	if len(s.AllowedHosts) == 0 {
		s.AllowedHosts = fc.AllowedHosts
	}
	if fc.IdleTimeout != "" && !set["idle-timeout"] {
		d, err := time.ParseDuration(fc.IdleTimeout)
		if err != nil || d <= 0 {
			return fmt.Errorf("config %s: idle_timeout %q: want a positive duration such as 30m", path, fc.IdleTimeout)
		}
		s.IdleTimeout = d
	}
	if fc.DrainTimeout != "" && !set["drain-timeout"] {
		d, err := time.ParseDuration(fc.DrainTimeout)
		if err != nil || d <= 0 {
			return fmt.Errorf("config %s: drain_timeout %q: want a positive duration such as 60s", path, fc.DrainTimeout)
		}
		s.DrainTimeout = d
	}
	if s.Data == "" {
		s.Data = defaultDataDir()
	}
	s.Data = expandHome(s.Data)
	if fc.Retention.MaxAge != "" && !set["max-age"] {
		d, err := time.ParseDuration(fc.Retention.MaxAge)
		if err != nil {
			return fmt.Errorf("config %s: retention.max_age: %w", path, err)
		}
		s.MaxAge = d
	}
	if fc.Retention.MaxBytes != 0 && !set["max-bytes"] {
		s.MaxBytes = fc.Retention.MaxBytes
	}
	if v := fc.Rewards.Deadline; v != "" && !set["reward-deadline"] {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("config %s: rewards.deadline %q: want a positive duration such as 100ms", path, v)
		}
		s.PluginDeadline = d
	}
	if v := fc.Rewards.MemoryMiB; v != 0 && !set["reward-memory-mib"] {
		if v < 1 || v > 4096 {
			return fmt.Errorf("config %s: rewards.memory_mib %d: want 1 to 4096", path, v)
		}
		s.PluginMemoryMiB = v
	}
	if v := fc.Rewards.JudgeTimeout; v != "" && !set["judge-timeout"] {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("config %s: rewards.judge_timeout %q: want a positive duration such as 30s", path, v)
		}
		s.JudgeTimeout = d
	}
	s.Share = share.Policy{
		Mode:         share.Mode(fc.Share.Mode),
		Tools:        fc.Share.Tools,
		Names:        fc.Share.Names,
		MinRewardAbs: fc.Share.MinRewardAbs,
	}
	check := s.Share
	if check.Mode == "" {
		check.Mode = share.ModeNone // the rest is checked all the same
	}
	if err := check.Validate(); err != nil {
		return fmt.Errorf("config %s: [share]: %v", path, strings.TrimPrefix(err.Error(), share.ErrPolicy.Error()+": "))
	}
	if err := fc.personal(path, &s.Personal); err != nil {
		return err
	}
	if len(fc.Plugins) > 0 {
		// A relative path is relative to the config file's directory,
		// wherever the node was started from.
		base := filepath.Dir(expandHome(path))
		for i, p := range fc.Plugins {
			pc := reward.PluginConfig{Name: p.Name, Path: p.Path, Builtin: p.Builtin, Weight: p.Weight, Enabled: p.Enabled == nil || *p.Enabled, Judge: p.Judge}
			if pc.Path == "" && pc.Builtin == "" {
				return fmt.Errorf("config %s: plugins[%d]: needs path or builtin", path, i)
			}
			for k, v := range p.Config {
				switch v.(type) {
				case string, int64, float64, bool:
				default:
					return fmt.Errorf("config %s: plugins[%d].config.%s: want a string, number or boolean, got %T", path, i, k, v)
				}
				if pc.Config == nil {
					pc.Config = map[string]string{}
				}
				pc.Config[k] = fmt.Sprint(v)
			}
			if pc.Path != "" && !filepath.IsAbs(pc.Path) {
				pc.Path = filepath.Join(base, expandHome(pc.Path))
			}
			if pc.Weight == 0 {
				pc.Weight = 1
			}
			if pc.Name == "" {
				pc.Name = pc.Builtin
				if pc.Name == "" {
					pc.Name = strings.TrimSuffix(filepath.Base(pc.Path), ".wasm")
				}
			}
			s.Plugins = append(s.Plugins, pc)
		}
	}
	return nil
}

func expandHome(p string) string {
	if p == "~" || strings.HasPrefix(p, "~/") {
		if h, err := os.UserHomeDir(); err == nil {
			return filepath.Join(h, strings.TrimPrefix(p, "~"))
		}
	}
	return p
}

// personal reads the [personal] section into ps.
func (fc *fileConfig) personal(path string, ps *personalSettings) error {
	fp := fc.Personal
	mode, err := personal.ParseMode(fp.Mode)
	if err != nil {
		return fmt.Errorf("config %s: [personal] mode %q: want local, mesh or off", path, fp.Mode)
	}
	ps.Mode = mode
	if fp.Base != "" {
		ps.Base = expandHome(fp.Base)
		if !filepath.IsAbs(ps.Base) {
			ps.Base = filepath.Join(filepath.Dir(expandHome(path)), ps.Base)
		}
	}
	for _, t := range fp.Trainers {
		if _, err := peer.Decode(t); err != nil {
			return fmt.Errorf("config %s: [personal] trainers: %q is not a peer id (`clawmesh trainer status` on the trainer prints its own)", path, t)
		}
	}
	ps.Trainers = fp.Trainers
	switch fp.Engine {
	case "", "native", "torch":
	default:
		return fmt.Errorf("config %s: [personal] engine %q: want native or torch", path, fp.Engine)
	}
	switch {
	case fp.Device == "" || fp.Device == "cpu":
	case fp.Device == "cuda" && fp.Engine == "torch":
	default:
		return fmt.Errorf("config %s: [personal] device %q: want cpu, or cuda with engine = \"torch\"", path, fp.Device)
	}
	ps.Engine, ps.Device = fp.Engine, fp.Device
	if mode == personal.ModeMesh && len(ps.Trainers) == 0 {
		return fmt.Errorf("config %s: [personal] mode = \"mesh\" needs trainers = [\"<peer id>\", ...]: the trainers you trust with your steps", path)
	}
	if fp.Idle != "" {
		d, err := time.ParseDuration(fp.Idle)
		if err != nil || d <= 0 {
			return fmt.Errorf("config %s: [personal] idle %q: want a positive duration such as 2m", path, fp.Idle)
		}
		ps.Idle = d
	}
	if fp.MinSteps < 0 || fp.MinSteps > 100000 {
		return fmt.Errorf("config %s: [personal] min_steps %d: want 1 to 100000", path, fp.MinSteps)
	}
	ps.MinSteps = fp.MinSteps
	return nil
}
