package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh/weights"
	"github.com/clawmesh/clawmesh/mesh/weights/chunks"
	"github.com/clawmesh/clawmesh/model/baseid"
	"github.com/clawmesh/clawmesh/model/engine/native"
	"github.com/clawmesh/clawmesh/model/gguf"
	"github.com/clawmesh/clawmesh/model/mlx"
	"github.com/clawmesh/clawmesh/model/modeldir"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/adapters"
	"github.com/clawmesh/clawmesh/trainer/group"
)

const weightsHelp = `Usage: clawmesh weights <ls|get|use|export> [flags] --data DIR

The adapter versions the mesh's trainers publish come back to every device:
a node in a mesh fetches the newest one over QUIC (from the trainers and
from every device that already holds it), verifies it chunk by chunk
against a manifest a majority of the mesh's voters certified (the
trainers its admin trusts), installs it under
DIR/adapters/vN and hot-swaps it into its model server, with no request
lost. ls, get and use ask the node running on DIR; export reads DIR.

  clawmesh weights ls [--json]        versions known: downloading (with
                                      progress), held, installed, serving;
                                      held-out pass@1 where the trainers
                                      evaluated a version on a task set
  clawmesh weights get VERSION        fetch and install a version now (v3)
  clawmesh weights use VERSION        pin a version (v3), or base for the
                                      base model; use latest to follow the
                                      newest again
  clawmesh weights export VERSION|base --format peft|gguf|mlx --out PATH
                                      write a version (v3, or latest) for
                                      another model server, from the node's
                                      disk (no running node needed):
                                      peft: the PEFT adapter directory as
                                      the mesh ships it (vLLM, SGLang,
                                      transformers); gguf: a llama.cpp LoRA
                                      adapter (llama-server --lora, Ollama's
                                      ADAPTER); mlx: an mlx-lm adapter
                                      directory (mlx_lm.server
                                      --adapter-path)

Export flags:
  --format peft|gguf|mlx   the format to write
  --out PATH               the file (gguf) or directory (peft, mlx) to write;
                           an existing one is refused without --force
  --force                  replace what is at --out
  --type f32|f16|bf16|q8_0 gguf only: the tensors' type (default f32 for an
                           adapter, f16 for the base)
  --base-dir DIR           the base model's Hugging Face directory, where the
                           node cannot build it (every base but the tiny one
                           the demo mesh trains: the node has no copy)
  --seed N                 the tiny base's seed (the mesh's; default 1)

base exports the mesh's base model: gguf writes a llama.cpp model file
(llama-server -m FILE, or model = FILE with serve = "llama-server" in the
node's config); mlx copies its Hugging Face directory, which mlx_lm.server
--model loads as it is. A version's gguf is
made for the base's architecture: the tiny base's is qwen3; other bases
say theirs in the adapter (base_model_name_or_path), or with --base-dir.
`

func runWeights(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub := ""
	if len(args) > 0 {
		sub, args = args[0], args[1:]
	}
	var s settings
	fs := newFlags("weights "+sub, weightsHelp, stderr)
	s.bindClient(fs)
	asJSON := fs.Bool("json", false, "print the node's weights status as JSON (a stable format: pin, serving, latest, driver, versions with their evals, error)")
	switch sub {
	case "-h", "--help", "help":
		fs.SetOutput(stdout)
		fs.Usage()
		return nil
	case "":
		return usageErr("weights needs a subcommand: ls, get, use or export")
	case "export":
		return runWeightsExport(fs, &s, args, stdout)
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	want := 0
	switch sub {
	case "ls":
	case "get", "use":
		want = 1
	default:
		return usageErr("unknown weights subcommand %q (want ls, get, use or export)", sub)
	}
	if fs.NArg() != want {
		if want == 0 {
			return usageErr("weights ls takes no arguments")
		}
		return usageErr("weights %s takes one version (v3%s)", sub, map[bool]string{true: ", base or latest"}[sub == "use"])
	}
	// A version name is checked before the node is looked for.
	if v := fs.Arg(0); sub == "get" || (sub == "use" && v != adapters.Base && v != "latest") {
		if _, err := adapters.ParseVersion(v); err != nil {
			return usageErr("%v", err)
		}
	}
	c, err := runningNode(&s)
	if err != nil {
		return err
	}
	var st adapters.Status
	switch sub {
	case "ls":
		st, err = c.Weights(ctx)
	case "use":
		st, err = c.UseWeights(ctx, fs.Arg(0))
		if err == nil && !*asJSON {
			if st.Pin == "" {
				fmt.Fprintln(stdout, "following the newest version")
			} else {
				fmt.Fprintf(stdout, "pinned %s: the node loads it and then serves it\n", st.Pin)
			}
		}
	case "get":
		st, err = getWithProgress(ctx, c, fs.Arg(0), stdout, *asJSON)
	}
	if err != nil && strings.Contains(err.Error(), strings.TrimPrefix(node.ErrNoWeights.Error(), "node: ")) {
		return withHint(fmt.Errorf("the node on %s follows no adapter versions: it is not in a mesh, or runs with --weights off", s.Data),
			"Join a mesh ('clawmesh join TOKEN --data %s') and restart the node, without --weights off", s.Data)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, st)
	}
	printWeights(stdout, st)
	return nil
}

// getWithProgress fetches a version through the node, drawing a progress
// bar from the node's status while the fetch runs.
func getWithProgress(ctx context.Context, c *node.Client, version string, w io.Writer, quiet bool) (adapters.Status, error) {
	if _, err := adapters.ParseVersion(version); err != nil {
		return adapters.Status{}, usageErr("%v", err)
	}
	type result struct {
		st  adapters.Status
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := c.GetWeights(ctx, version)
		done <- result{st, err}
	}()
	tk := time.NewTicker(200 * time.Millisecond)
	defer tk.Stop()
	drawn := false
	for {
		select {
		case r := <-done:
			if drawn {
				fmt.Fprintln(w)
			}
			return r.st, r.err
		case <-tk.C:
			if quiet {
				continue
			}
			st, err := c.Weights(ctx)
			if err != nil {
				continue
			}
			for _, v := range st.Versions {
				if v.Version == version && v.Bytes > 0 {
					fmt.Fprintf(w, "\r%s %s", version, bar(v.Downloaded, int64(v.Bytes), v.State))
					drawn = true
				}
			}
		}
	}
}

// bar draws "[#####.....]  42% 10.5/25.0 MiB".
func bar(done, total int64, state string) string {
	if state != "downloading" && state != "known" {
		done = total
	}
	const width = 30
	n := int(done * width / max(total, 1))
	return fmt.Sprintf("[%s%s] %3d%% %.1f/%.1f MiB", strings.Repeat("#", n), strings.Repeat(".", width-n),
		done*100/max(total, 1), float64(done)/(1<<20), float64(total)/(1<<20))
}

func printWeights(w io.Writer, st adapters.Status) {
	follow := "the newest version"
	if st.Pin != "" {
		follow = st.Pin + " (pinned; `clawmesh weights use latest` follows the newest again)"
	}
	driver := st.Driver
	if driver == "" {
		driver = "none (the upstream cannot hot-swap adapters: versions are installed, not served)"
	}
	fmt.Fprintf(w, "serving:  %s\nfollows:  %s\nhot swap: %s\n", st.Serving, follow, driver)
	if st.Error != "" {
		fmt.Fprintf(w, "waiting:  %s\n", st.Error)
	}
	if len(st.Versions) == 0 {
		fmt.Fprintln(w, "\nno version announced yet: the trainers publish one after their first round")
		return
	}
	// The held-out column shows only where a version was evaluated on a
	// task set (a mesh without task sets has none).
	evals := slices.ContainsFunc(st.Versions, func(v adapters.Version) bool { return len(v.Evals) > 0 })
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "VERSION\tHASH\tSTATE\tSIZE\tBUNDLE\tTERM\tINDEX"
	if evals {
		head += "\tHELD-OUT PASS@1"
	}
	fmt.Fprintln(tw, head)
	for _, v := range st.Versions {
		state := v.State
		if v.State == "downloading" {
			state = "downloading " + bar(v.Downloaded, int64(v.Bytes), v.State)
		}
		if v.Failed != "" {
			state += " (not served: " + v.Failed + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f MiB\t%s\t%d\t%d", v.Version, core.ShortHash(v.Hash), state, float64(v.Bytes)/(1<<20), core.ShortHash(v.Bundle), v.Term, v.Index)
		if evals {
			fmt.Fprintf(tw, "\t%s", adapters.FormatEvals(v.Evals))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// exportTypes are the tensor types --type names.
var exportTypes = map[string]gguf.TensorType{"f32": gguf.TypeF32, "f16": gguf.TypeF16, "bf16": gguf.TypeBF16, "q8_0": gguf.TypeQ8_0}

// runWeightsExport writes a version, or the base model, in another
// model server's format. It reads the node's data directory, never the
// running node: versions installed (DATA/adapters/vN) or held (the
// bundles in DATA/weights, checked against their manifests).
func runWeightsExport(fs *flag.FlagSet, s *settings, args []string, stdout io.Writer) error {
	format := fs.String("format", "", "the format to write: peft, gguf or mlx")
	out := fs.String("out", "", "the file (gguf) or directory (peft, mlx) to write")
	force := fs.Bool("force", false, "replace what is at --out")
	typ := fs.String("type", "", "gguf only: the tensors' type, f32, f16, bf16 or q8_0 (default f32 for an adapter, f16 for the base)")
	baseDir := fs.String("base-dir", "", "the base model's Hugging Face directory, where the node cannot build it")
	seed := fs.Uint64("seed", group.DefaultSeed, "the tiny base's seed: the mesh's")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageErr("weights export takes one version (v3, latest) or base")
	}
	if j := fs.Lookup("json"); j != nil && j.Value.String() == "true" {
		return usageErr("weights export has no --json: it writes files")
	}
	what := fs.Arg(0)
	if what != adapters.Base && what != "latest" {
		if _, err := adapters.ParseVersion(what); err != nil {
			return usageErr("%v", err)
		}
	}
	switch *format {
	case "peft", "gguf", "mlx":
	case "":
		return usageErr("say which format: --format peft, gguf or mlx")
	default:
		return usageErr("--format %q: want peft, gguf or mlx", *format)
	}
	if *out == "" {
		return usageErr("say where to write it: --out PATH")
	}
	tt := gguf.TypeF32 // an adapter's default, as convert_lora_to_gguf.py's
	if what == adapters.Base {
		tt = gguf.TypeF16 // a model's: half the size, as llama.cpp's converter's default
	}
	if *typ != "" {
		t, ok := exportTypes[strings.ToLower(*typ)]
		if !ok {
			return usageErr("--type %q: want f32, f16, bf16 or q8_0", *typ)
		}
		if *format != "gguf" {
			return usageErr("--type is for --format gguf")
		}
		tt = t
	}
	dst := expandHome(*out)
	if _, err := os.Lstat(dst); err == nil {
		if !*force {
			return withHint(fmt.Errorf("%s already exists", dst), "Give another --out, or add --force to replace it")
		}
		if err := replaceable(dst, *format); err != nil {
			return withHint(err, "Give another --out")
		}
	}
	if *baseDir != "" {
		*baseDir = expandHome(*baseDir)
	}
	ex := exporter{data: s.Data, format: *format, out: dst, typ: tt, baseDir: *baseDir, seed: *seed}
	if what == adapters.Base {
		return ex.base(stdout)
	}
	return ex.version(what, stdout)
}

// exporter writes one export.
type exporter struct {
	data, format, out string
	typ               gguf.TensorType
	baseDir           string
	seed              uint64
}

// heldVersions reads the manifests the node holds (DATA/weights), by
// version name.
func (e exporter) heldVersions() (map[string]*chunks.Manifest, *weights.Dir, error) {
	p := filepath.Join(e.data, node.WeightsDir)
	if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	wd, err := weights.OpenDir(p)
	if err != nil {
		return nil, nil, err
	}
	held := map[string]*chunks.Manifest{}
	for _, m := range wd.Held() {
		held[m.Name()] = m
	}
	return held, wd, nil
}

// version exports version name (vN, or latest: the newest the node holds
// or has installed).
func (e exporter) version(name string, stdout io.Writer) error {
	held, wd, err := e.heldVersions()
	if err != nil {
		return err
	}
	installed := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(e.data, node.AdaptersDir))
	for _, ent := range ents {
		if _, err := adapters.ParseVersion(ent.Name()); err == nil && ent.IsDir() {
			installed[ent.Name()] = true
		}
	}
	if name == "latest" {
		var newest uint64
		for _, set := range []map[string]bool{installed, keys(held)} {
			for v := range set {
				if n, _ := adapters.ParseVersion(v); n > newest {
					newest, name = n, v
				}
			}
		}
		if newest == 0 {
			return withHint(fmt.Errorf("the node on %s holds no adapter version yet", e.data),
				"'clawmesh weights ls' shows the versions the mesh announced; 'clawmesh weights get VERSION' fetches one")
		}
	}
	m := held[name]
	src := filepath.Join(e.data, node.AdaptersDir, name)
	switch {
	case installed[name]:
		if m != nil {
			b, err := weights.Pack(src)
			if err != nil {
				return fmt.Errorf("%s: %v", src, err)
			}
			if sha256.Sum256(b) != m.Bundle {
				return withHint(fmt.Errorf("%s differs from the version the mesh certified", src),
					"Remove %s; the node installs it again from the bundle it holds", src)
			}
		}
	case m != nil:
		// Held, not installed: unpack the bundle, checked against its
		// manifest, into a temporary directory.
		b, err := os.ReadFile(wd.BundlePath(m.BundleID()))
		if err != nil {
			return fmt.Errorf("the bundle of %s: %v", name, err)
		}
		if sha256.Sum256(b) != m.Bundle {
			return fmt.Errorf("the bundle of %s held in %s differs from its manifest: 'clawmesh weights get %s' fetches it again", name, wd.Path(), name)
		}
		tmp, err := os.MkdirTemp("", "clawmesh-export-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		src = filepath.Join(tmp, name)
		if err := weights.Unpack(b, src); err != nil {
			return err
		}
	default:
		var have []string
		for _, set := range []map[string]bool{installed, keys(held)} {
			for v := range set {
				if !slices.Contains(have, v) {
					have = append(have, v)
				}
			}
		}
		slices.SortFunc(have, func(a, b string) int {
			x, _ := adapters.ParseVersion(a)
			y, _ := adapters.ParseVersion(b)
			return cmp.Compare(x, y)
		})
		if len(have) == 0 {
			return withHint(fmt.Errorf("the node on %s holds no adapter version", e.data),
				"'clawmesh weights get %s' fetches it, where the mesh announced it", name)
		}
		return withHint(fmt.Errorf("the node on %s does not hold %s; it holds %s", e.data, name, strings.Join(have, ", ")),
			"'clawmesh weights get %s' fetches it, where the mesh announced it", name)
	}
	base := ""
	if m != nil {
		base = m.Base
	} else if id, err := baseid.FromAdapter(src); err == nil && len(id.Names) > 0 {
		base = id.Names[0] // base_model_name_or_path: "tiny" for the tiny base
	}
	var what string
	switch e.format {
	case "peft":
		err = e.replace(func(tmp string) error { return copyFiles(src, tmp, []string{weights.ConfigFile, weights.WeightsFile}) })
		what = "a PEFT adapter directory"
	case "gguf":
		opts := gguf.LoRAOptions{Type: e.typ, Name: name, BaseDir: e.baseDir}
		if base == group.DefaultBase && e.baseDir == "" {
			opts.Arch = gguf.ArchQwen3 // the tiny base is a Qwen3 (model/engine/native)
		}
		err = e.replace(func(tmp string) error { return gguf.ExportLoRA(src, tmp, opts) })
		if errors.Is(err, gguf.ErrUnsupported) && e.baseDir == "" {
			err = withHint(err, "Give the base model's directory with --base-dir, which says its architecture")
		}
		what = "a llama.cpp LoRA adapter (llama-server --lora FILE)"
	case "mlx":
		err = e.replace(func(tmp string) error { return mlx.Export(src, tmp) })
		what = "an mlx-lm adapter directory (mlx_lm.server --adapter-path DIR)"
	}
	if err != nil {
		return fmt.Errorf("exporting %s: %w", name, err)
	}
	fmt.Fprintf(stdout, "%s written to %s as %s.\n", name, e.out, what)
	return nil
}

func keys(m map[string]*chunks.Manifest) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

// base exports the mesh's base model: the tiny one built as the trainers
// build it, or the directory --base-dir names.
func (e exporter) base(stdout io.Writer) error {
	if e.format == "peft" {
		return usageErr("the base model is no adapter: export it with --format gguf or mlx")
	}
	held, _, err := e.heldVersions()
	if err != nil {
		return err
	}
	meshBase := ""
	for _, m := range held {
		meshBase = m.Base
	}
	if v, err := newestInstalled(e.data); meshBase == "" && err == nil && len(v.id.Names) > 0 {
		meshBase = v.id.Names[0] // the installed version's base_model_name_or_path
	}
	dir := e.baseDir
	switch {
	case dir != "":
		id, err := baseid.FromModelDir(dir)
		if err != nil {
			return fmt.Errorf("--base-dir: %s", strings.TrimPrefix(err.Error(), "baseid: "))
		}
		if meshBase != "" && meshBase != group.DefaultBase && baseid.Same(id, baseid.ID{Names: []string{meshBase}}) != nil {
			return withHint(fmt.Errorf("the mesh trains base %s; %s is %s", meshBase, dir, id),
				"Give the mesh's base model with --base-dir")
		}
	case meshBase == "":
		return withHint(fmt.Errorf("the node on %s holds no version, so it does not know the mesh's base model", e.data),
			"Give the base model's directory with --base-dir, or fetch a version first ('clawmesh weights get VERSION')")
	case meshBase == group.DefaultBase:
		tmp, err := os.MkdirTemp("", "clawmesh-tiny-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = filepath.Join(tmp, "tiny")
		// As the trainers build it (trainer/worker.go: modeldir.Tiny, the
		// group's seed) and `clawmesh serve --tiny --save-tiny` writes it.
		txt, cfg, err := modeldir.Tiny()
		if err != nil {
			return err
		}
		if err := native.CreateTiny(dir, cfg, e.seed); err != nil {
			return err
		}
		if err := txt.Tokenizer.Save(filepath.Join(dir, modeldir.TokenizerFile)); err != nil {
			return err
		}
	default:
		return withHint(fmt.Errorf("the mesh trains base %s, of which the node holds no copy", meshBase),
			"Give its Hugging Face directory with --base-dir")
	}
	var what string
	switch e.format {
	case "gguf":
		err = e.replace(func(tmp string) error { return gguf.ExportBase(dir, tmp, gguf.BaseOptions{Type: e.typ}) })
		what = "a llama.cpp model (llama-server -m FILE)"
	case "mlx":
		err = e.replace(func(tmp string) error { return copyModelDir(dir, tmp) })
		what = "a Hugging Face model directory, which mlx_lm.server --model loads"
	}
	if err != nil {
		return fmt.Errorf("exporting the base model: %w", err)
	}
	fmt.Fprintf(stdout, "The base model written to %s as %s.\n", e.out, what)
	return nil
}

// replace writes the export with write to a temporary path beside --out,
// then puts it in place of what is there.
func (e exporter) replace(write func(tmp string) error) error {
	parent := filepath.Dir(e.out)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	tmpDir, err := os.MkdirTemp(parent, ".clawmesh-export-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmpDir)
	tmp := filepath.Join(tmpDir, filepath.Base(e.out))
	if err := write(tmp); err != nil {
		return err
	}
	if err := os.RemoveAll(e.out); err != nil {
		return err
	}
	return os.Rename(tmp, e.out)
}

// copyFiles copies the named files of src into a new directory dst.
func copyFiles(src, dst string, names []string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dst, n), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// copyModelDir copies a Hugging Face model directory's files (config,
// weights, tokenizer) into a new directory dst.
func copyModelDir(src, dst string) error {
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if e.Type().IsRegular() && (strings.HasSuffix(n, ".json") || strings.HasSuffix(n, ".safetensors") || strings.HasSuffix(n, ".txt") || strings.HasSuffix(n, ".model")) {
			names = append(names, n)
		}
	}
	return copyFiles(src, dst, names)
}

// replaceable says whether --force may replace path with an export of
// format: a file with a file, and a directory with a directory only where
// it holds nothing but the files an export writes, so that a mistyped
// --out never removes a directory of the user's.
func replaceable(path, format string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if format == "gguf" {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s is not a file: --force replaces a file with a GGUF file, nothing else", path)
		}
		return nil
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory: --force replaces an exported directory, nothing else", path)
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return err
	}
	for _, e := range ents {
		n := e.Name()
		if !e.Type().IsRegular() || !(strings.HasSuffix(n, ".json") || strings.HasSuffix(n, ".safetensors") || strings.HasSuffix(n, ".txt") || strings.HasSuffix(n, ".model")) {
			return fmt.Errorf("%s holds %s, which no export writes: --force replaces an exported directory, nothing else", path, n)
		}
	}
	return nil
}
