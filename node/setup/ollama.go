package setup

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Errors of the Ollama wiring.
var (
	// ErrOllamaName: a model name Ollama would not accept.
	ErrOllamaName = errors.New("setup: not an Ollama model name")
	// ErrOllamaModel: the model is not in Ollama's store.
	ErrOllamaModel = errors.New("setup: no such Ollama model")
	// ErrOllamaManifest: the model's manifest, or the blob it names, is
	// not what Ollama writes.
	ErrOllamaManifest = errors.New("setup: bad Ollama manifest")
)

// Ollama's defaults for the parts of a model name left out
// (github.com/ollama/ollama types/model/name.go: defaultHost,
// defaultNamespace, defaultTag).
const (
	ollamaHost      = "registry.ollama.ai"
	ollamaNamespace = "library"
	ollamaTag       = "latest"
)

// OllamaName is a model name as Ollama parses it: [HOST/][NAMESPACE/]MODEL[:TAG].
type OllamaName struct {
	Host, Namespace, Model, Tag string
}

// ParseOllamaName parses a model name as Ollama does (types/model/name.go
// ParseNameBare, then Merge with DefaultName): the tag after the last ':'
// that follows the last '/', then model, namespace and host from the
// right; what is left out is registry.ollama.ai, library and latest. Each
// part is checked as Ollama's isValidPart checks it, so that no part can
// leave the manifests directory.
func ParseOllamaName(s string) (OllamaName, error) {
	s = strings.TrimSpace(s)
	var n OllamaName
	rest := s
	if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
		rest, n.Tag = rest[:i], rest[i+1:]
		if n.Tag == "" {
			return n, fmt.Errorf("%w: %q has an empty tag", ErrOllamaName, s)
		}
	}
	parts := strings.Split(rest, "/")
	if len(parts) > 3 {
		return n, fmt.Errorf("%w: %q has more parts than host/namespace/model:tag", ErrOllamaName, s)
	}
	n.Model = parts[len(parts)-1]
	if len(parts) >= 2 {
		n.Namespace = parts[len(parts)-2]
	}
	if len(parts) == 3 {
		n.Host = strings.TrimPrefix(strings.TrimPrefix(parts[0], "https://"), "http://")
	}
	if n.Host == "" {
		n.Host = ollamaHost
	}
	if n.Namespace == "" {
		n.Namespace = ollamaNamespace
	}
	if n.Tag == "" {
		n.Tag = ollamaTag
	}
	for _, p := range []struct {
		what, v string
		re      *regexp.Regexp
	}{{"host", n.Host, hostRE}, {"namespace", n.Namespace, namespaceRE}, {"model", n.Model, partRE}, {"tag", n.Tag, partRE}} {
		if !p.re.MatchString(p.v) {
			return n, fmt.Errorf("%w: %q: the %s %q (use letters, digits, '_', '-' and '.', starting with a letter, digit or '_')", ErrOllamaName, s, p.what, p.v)
		}
	}
	return n, nil
}

// The parts of a name as Ollama's isValidPart allows them: a letter, digit
// or '_' first, then those and '-', '.' (not in a namespace), ':' (only in
// a host); at most 80 characters (350 for a host).
var (
	partRE      = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$`)
	namespaceRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_-]{0,79}$`)
	hostRE      = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}$`)
)

// String is the name as Ollama shows it: the host and namespace only where
// they are not the defaults (types/model/name.go DisplayShortest).
func (n OllamaName) String() string {
	s := n.Model + ":" + n.Tag
	switch {
	case !strings.EqualFold(n.Host, ollamaHost):
		return n.Host + "/" + n.Namespace + "/" + s
	case !strings.EqualFold(n.Namespace, ollamaNamespace):
		return n.Namespace + "/" + s
	}
	return s
}

// manifestPath is the name's manifest under a models directory
// (Ollama's manifest/paths.go PathForName with types/model/name.go
// Name.Filepath: manifests/HOST/NAMESPACE/MODEL/TAG).
func (n OllamaName) manifestPath(models string) string {
	return filepath.Join(models, "manifests", n.Host, n.Namespace, n.Model, n.Tag)
}

// OllamaModelsDirs are the directories Ollama may keep its models in, in
// the order to look: $OLLAMA_MODELS, else ~/.ollama/models (Ollama's
// envconfig/config.go Models); on Linux also
// /usr/share/ollama/.ollama/models, the home of the ollama user its
// install runs the service as (Ollama's docs/faq.mdx, "Where are models
// stored?"; docs/linux.mdx).
func OllamaModelsDirs(getenv func(string) string, home, goos string) []string {
	if d := getenv("OLLAMA_MODELS"); d != "" {
		if d == "~" || strings.HasPrefix(d, "~/") {
			d = filepath.Join(home, strings.TrimPrefix(d, "~"))
		}
		return []string{d}
	}
	dirs := []string{filepath.Join(home, ".ollama", "models")}
	if goos == "linux" {
		dirs = append(dirs, "/usr/share/ollama/.ollama/models")
	}
	return dirs
}

// OllamaModel is a model found in Ollama's store.
type OllamaModel struct {
	Name OllamaName
	// Models is the models directory; Manifest the manifest's path.
	Models, Manifest string
	// Blob is the model's weights (the layer of media type
	// application/vnd.ollama.image.model): a GGUF file, Digest its
	// "sha256:HEX", Size its bytes.
	Blob, Digest string
	Size         int64
}

// The media type of a manifest's model weights layer (Ollama's
// server/create.go gives a GGUF model's layer this type).
const ollamaModelMedia = "application/vnd.ollama.image.model"

var digestRE = regexp.MustCompile(`^sha256[:-]([0-9a-fA-F]{64})$`)

// maxManifest bounds a manifest read: Ollama's are a few hundred bytes.
const maxManifest = 1 << 20

// FindOllamaModel finds the model name in the store under models: its
// manifest (manifests/HOST/NAMESPACE/MODEL/TAG, JSON: schemaVersion,
// mediaType, config, layers of mediaType, digest, size), and the one
// layer of the model's weights, whose blob is blobs/sha256-HEX
// (Ollama's manifest/manifest.go Manifest and Layer, ParseNamedManifest;
// manifest/paths.go BlobsPath, which accepts only sha256 digests). It checks that the blob is there, of the size the
// manifest says, and starts with GGUF's magic. A model that is not there
// wraps ErrOllamaModel and lists the models that are.
func FindOllamaModel(models string, name OllamaName) (OllamaModel, error) {
	m := OllamaModel{Name: name, Models: models, Manifest: name.manifestPath(models)}
	b, err := readLimit(m.Manifest, maxManifest)
	if errors.Is(err, fs.ErrNotExist) {
		have, lerr := ListOllamaModels(models)
		switch {
		case lerr != nil:
			return m, fmt.Errorf("%w: %s is not in %s (%v)", ErrOllamaModel, name, models, lerr)
		case len(have) == 0:
			return m, fmt.Errorf("%w: %s is not in %s, which holds no models", ErrOllamaModel, name, models)
		}
		return m, fmt.Errorf("%w: %s is not in %s, which holds %s", ErrOllamaModel, name, models, strings.Join(have, ", "))
	}
	if err != nil {
		return m, fmt.Errorf("%w: %s: %v", ErrOllamaManifest, m.Manifest, err)
	}
	var man struct {
		SchemaVersion int `json:"schemaVersion"`
		Layers        []struct {
			MediaType string `json:"mediaType"`
			Digest    string `json:"digest"`
			Size      int64  `json:"size"`
		} `json:"layers"`
	}
	if err := json.Unmarshal(b, &man); err != nil {
		return m, fmt.Errorf("%w: %s is not JSON: %v", ErrOllamaManifest, m.Manifest, err)
	}
	var found []int
	for i, l := range man.Layers {
		if l.MediaType == ollamaModelMedia {
			found = append(found, i)
		}
	}
	switch len(found) {
	case 0:
		return m, fmt.Errorf("%w: %s has no layer of media type %s (a model made of safetensors, or only a remote one, has no GGUF to serve)", ErrOllamaManifest, m.Manifest, ollamaModelMedia)
	case 1:
	default:
		return m, fmt.Errorf("%w: %s has %d model layers (a split GGUF): llama-server needs one file", ErrOllamaManifest, m.Manifest, len(found))
	}
	l := man.Layers[found[0]]
	dm := digestRE.FindStringSubmatch(l.Digest)
	if dm == nil {
		return m, fmt.Errorf("%w: %s: the model layer's digest %q is not sha256:HEX", ErrOllamaManifest, m.Manifest, l.Digest)
	}
	m.Digest = "sha256:" + strings.ToLower(dm[1])
	m.Blob = filepath.Join(models, "blobs", "sha256-"+strings.ToLower(dm[1]))
	fi, err := os.Stat(m.Blob)
	if err != nil {
		return m, fmt.Errorf("%w: %s names blob %s, which is not there: %v (pull the model again: ollama pull %s)", ErrOllamaManifest, m.Manifest, m.Digest, err, name)
	}
	if !fi.Mode().IsRegular() {
		return m, fmt.Errorf("%w: blob %s is not a file", ErrOllamaManifest, m.Blob)
	}
	m.Size = fi.Size()
	if l.Size != 0 && l.Size != m.Size {
		return m, fmt.Errorf("%w: blob %s holds %d bytes, the manifest says %d (pull the model again: ollama pull %s)", ErrOllamaManifest, m.Blob, m.Size, l.Size, name)
	}
	if err := checkGGUFMagic(m.Blob); err != nil {
		return m, fmt.Errorf("%w: %v", ErrOllamaManifest, err)
	}
	return m, nil
}

// checkGGUFMagic checks that a file starts with "GGUF".
func checkGGUFMagic(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil || string(magic[:]) != "GGUF" {
		return fmt.Errorf("%s is not a GGUF file (it starts %q)", path, magic[:])
	}
	return nil
}

// ListOllamaModels lists the models in the store under models, by name
// as Ollama shows them (manifest/manifest.go Manifests: the files
// manifests/*/*/*/*), sorted.
func ListOllamaModels(models string) ([]string, error) {
	matches, err := filepath.Glob(filepath.Join(models, "manifests", "*", "*", "*", "*"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, p := range matches {
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		rel, err := filepath.Rel(filepath.Join(models, "manifests"), p)
		if err != nil {
			continue
		}
		parts := strings.Split(filepath.ToSlash(rel), "/")
		names = append(names, OllamaName{Host: parts[0], Namespace: parts[1], Model: parts[2], Tag: parts[3]}.String())
	}
	slices.Sort(names)
	return names, nil
}

func readLimit(path string, n int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, n+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > n {
		return nil, fmt.Errorf("larger than %d bytes", n)
	}
	return b, nil
}

// KeyChange is one top-level key of the node's config.toml as setup finds
// it and as it leaves it.
type KeyChange struct {
	Key string `json:"key"`
	// Old is the key's line before ("" when the key was absent).
	Old string `json:"old,omitempty"`
	// New is the value set.
	New string `json:"new,omitempty"`
	// Comment, when set, is the line the key's became: commented out, in
	// its place, with a note (CommentTOMLKey).
	Comment string `json:"comment,omitempty"`
}

// CommentTOMLKey returns a TOML text with the line of top-level key
// commented out in its place, followed by note, and that line; ok is
// false (and src unchanged) when the key is absent.
func CommentTOMLKey(src, key, note string) (out, line string, ok bool) {
	old := TOMLKeyLine(src, key)
	if old == "" {
		return src, "", false
	}
	line = "# " + strings.TrimSpace(old) + "  # " + note
	lines := strings.Split(src, "\n")
	for i, l := range lines {
		if l == old {
			lines[i] = line
			break
		}
	}
	return strings.Join(lines, "\n"), line, true
}

// OllamaRecord is what setup ollama keeps in the node's data directory to
// undo its change.
type OllamaRecord struct {
	Config string      `json:"config"` // the node's config file
	Model  string      `json:"model"`  // the Ollama model's name
	Blob   string      `json:"blob"`   // the GGUF served
	Keys   []KeyChange `json:"keys"`
	// Created: setup made the config file; NoFinalNewline: the file ended
	// without one (SetTOMLKeys adds it).
	Created        bool      `json:"created,omitempty"`
	NoFinalNewline bool      `json:"no_final_newline,omitempty"`
	At             time.Time `json:"at"`
}

// OllamaRecordFile is the record's name in the node's data directory.
const OllamaRecordFile = "ollama-setup.json"

// TOMLKeyLine is the line of top-level key in a TOML text ("" when
// absent): the text SetTOMLKeys would replace.
func TOMLKeyLine(src, key string) string {
	for _, l := range strings.Split(src, "\n") {
		t := strings.TrimSpace(l)
		if strings.HasPrefix(t, "[") {
			break
		}
		if name, _, ok := strings.Cut(t, "="); ok && strings.Trim(strings.TrimSpace(name), `"'`) == key {
			return l
		}
	}
	return ""
}

// UndoTOMLKeys returns a TOML text with each changed key put back as it
// was: its old line, or no line where it was absent. It refuses (ErrChanged)
// where a key no longer holds the value setup set.
func UndoTOMLKeys(src string, changes []KeyChange) (string, error) {
	lines := strings.Split(src, "\n")
	end := len(lines)
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "[") {
			end = i
			break
		}
	}
	for _, c := range changes {
		if c.Comment != "" {
			i := slices.Index(lines, c.Comment)
			if i < 0 {
				return "", fmt.Errorf("%w: the line %q setup left in place of %s is gone", ErrChanged, c.Comment, c.Key)
			}
			if TOMLKeyLine(strings.Join(lines[:end], "\n"), c.Key) != "" {
				return "", fmt.Errorf("%w: %s is set again since setup commented it out", ErrChanged, c.Key)
			}
			lines[i] = c.Old
			continue
		}
		at := -1
		for i := 0; i < end; i++ {
			if name, _, ok := strings.Cut(strings.TrimSpace(lines[i]), "="); ok && strings.Trim(strings.TrimSpace(name), `"'`) == c.Key {
				at = i
			}
		}
		want := SetTOMLKeys("", []string{c.Key}, map[string]string{c.Key: c.New})
		if at < 0 || strings.TrimSpace(lines[at]) != strings.TrimSpace(want) {
			got := "absent"
			if at >= 0 {
				got = strings.TrimSpace(lines[at])
			}
			return "", fmt.Errorf("%w: %s is %s, no longer %s as setup left it", ErrChanged, c.Key, got, strings.TrimSpace(want))
		}
		if c.Old != "" {
			lines[at] = c.Old
			continue
		}
		lines = slices.Delete(lines, at, at+1)
		end--
	}
	return strings.Join(lines, "\n"), nil
}
