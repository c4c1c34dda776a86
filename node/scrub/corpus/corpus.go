// Package corpus is the labelled corpus the scrubber is measured against,
// and the measure: recall and precision per kind of finding (and per vendor
// of API key). The corpus is text in the shapes it takes in an agent's
// conversations (shell commands and their output, config files, stack
// traces, logs, JSON tool calls, prose), with every piece of personal data
// or secret labelled, and as many hard negatives (versions, hashes, UUIDs,
// dates, ids, look-alikes) left unlabelled.
//
// The corpus has two parts. The tuned part (files/*.txt) is what the
// detectors were developed against; the held-out part (heldout/*.txt) was
// written from public formats (numbering plans, national id and IBAN
// formats, the vendors' documented key shapes) before the detectors were
// last tuned, and is not tuned on: its figures say how the scrubber does on
// text it was not fitted to. A held-out file is only ever corrected where a
// label is wrong; a fault it shows is fixed with cases of its own in the
// tuned part, and new held-out text comes as new files, written before the
// scrubber is run on them.
//
// A file (files/*.txt or heldout/*.txt) is UTF-8 text in which a label is
// written inline as ⟦KIND:value⟧ or ⟦API_KEY/vendor:value⟧; the text with
// the markup removed is what the scrubber sees. An optional first line "#names: A, B" lists the
// names the user asked to hide for that file.
package corpus

import (
	"embed"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/clawmesh/clawmesh/node/scrub"
)

//go:embed files/*.txt heldout/*.txt
var files embed.FS

const (
	open  = "⟦"
	close = "⟧"
)

// Label is one labelled span of a document's text.
type Label struct {
	Start, End int
	Kind       scrub.Kind
	Vendor     string // for API_KEY
}

// Doc is one corpus file, its markup removed.
type Doc struct {
	Name   string
	Text   string
	Names  []string
	Labels []Label
}

// Load parses every file of the tuned part of the corpus.
func Load() ([]Doc, error) { return load("files") }

// LoadHeldOut parses every file of the held-out part of the corpus.
func LoadHeldOut() ([]Doc, error) { return load("heldout") }

func load(dir string) ([]Doc, error) {
	entries, err := fs.Glob(files, dir+"/*.txt")
	if err != nil {
		return nil, err
	}
	var docs []Doc
	for _, e := range entries {
		b, err := files.ReadFile(e)
		if err != nil {
			return nil, err
		}
		d, err := Parse(strings.TrimPrefix(e, dir+"/"), string(b))
		if err != nil {
			return nil, err
		}
		docs = append(docs, d)
	}
	return docs, nil
}

// Parse reads one file of the corpus format.
func Parse(name, content string) (Doc, error) {
	d := Doc{Name: name}
	for strings.HasPrefix(content, "#") {
		line, rest, _ := strings.Cut(content, "\n")
		if v, ok := strings.CutPrefix(line, "#names:"); ok {
			for _, n := range strings.Split(v, ",") {
				if n = strings.TrimSpace(n); n != "" {
					d.Names = append(d.Names, n)
				}
			}
		} else {
			return d, fmt.Errorf("%s: unknown header %q", name, line)
		}
		content = rest
	}
	var b strings.Builder
	for {
		i := strings.Index(content, open)
		j := strings.Index(content, close)
		if i < 0 {
			if j >= 0 {
				return d, fmt.Errorf("%s: %s without %s", name, close, open)
			}
			b.WriteString(content)
			break
		}
		if j < i {
			return d, fmt.Errorf("%s: %s before %s", name, close, open)
		}
		b.WriteString(content[:i])
		label := content[i+len(open) : j]
		if strings.Contains(label, open) {
			return d, fmt.Errorf("%s: nested label near %q", name, label)
		}
		kind, value, ok := strings.Cut(label, ":")
		if !ok || value == "" {
			return d, fmt.Errorf("%s: label %q has no KIND:value", name, label)
		}
		l := Label{Start: b.Len(), Kind: scrub.Kind(kind)}
		if k, v, ok := strings.Cut(kind, "/"); ok {
			l.Kind, l.Vendor = scrub.Kind(k), v
		}
		if !slices.Contains(scrub.Kinds, l.Kind) || (l.Vendor != "") != (l.Kind == scrub.APIKey) {
			return d, fmt.Errorf("%s: unknown kind %q", name, kind)
		}
		b.WriteString(value)
		l.End = b.Len()
		d.Labels = append(d.Labels, l)
		content = content[j+len(close):]
	}
	d.Text = b.String()
	if !utf8.ValidString(d.Text) {
		return d, fmt.Errorf("%s: not UTF-8", name)
	}
	return d, nil
}

// Score is the tally of one kind (or vendor).
type Score struct {
	Name     string // kind, or API_KEY/vendor
	Labels   int    // labelled spans
	Recalled int    // labels a finding of a fitting kind covered whole
	Found    int    // findings
	Right    int    // findings that replaced labelled data (and not much else)
}

// Recall is Recalled/Labels (1 with no labels).
func (s Score) Recall() float64 {
	if s.Labels == 0 {
		return 1
	}
	return float64(s.Recalled) / float64(s.Labels)
}

// Precision is Right/Found (1 with no findings).
func (s Score) Precision() float64 {
	if s.Found == 0 {
		return 1
	}
	return float64(s.Right) / float64(s.Found)
}

// Miss is a label no finding covered, or a finding that replaced nothing
// labelled.
type Miss struct {
	Doc     string
	Kind    string
	Text    string
	Context string
}

// Result is the measure of a scrubber on the corpus.
type Result struct {
	Kinds   []Score // one per kind, in scrub.Kinds order
	Vendors []Score // one per API key vendor, by name
	Total   Score
	Missed  []Miss // labels not recalled
	Wrong   []Miss // findings on unlabelled text
	Bytes   int    // of text
	Docs    int
}

// slack is how far, in bytes, a finding may reach beyond the labels it
// covers and still count as right (a '+' or a bracket the label left out).
const slack = 4

// Evaluate scrubs every document (with a scrubber that hides its names)
// and scores the findings against the labels.
func Evaluate(docs []Doc) (*Result, error) {
	r := &Result{Docs: len(docs)}
	kinds := map[string]*Score{}
	vendors := map[string]*Score{}
	score := func(m map[string]*Score, name string) *Score {
		if s, ok := m[name]; ok {
			return s
		}
		s := &Score{Name: name}
		m[name] = s
		return s
	}
	for _, k := range scrub.Kinds {
		score(kinds, string(k))
	}
	for _, d := range docs {
		sc, err := scrub.New(scrub.Options{Names: d.Names})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.Name, err)
		}
		r.Bytes += len(d.Text)
		found := sc.Find(d.Text)
		for _, l := range d.Labels {
			ks := score(kinds, string(l.Kind))
			ks.Labels++
			var vs *Score
			if l.Vendor != "" {
				vs = score(vendors, string(l.Kind)+"/"+l.Vendor)
				vs.Labels++
			}
			ok := false
			for _, f := range found {
				if f.Start <= l.Start && f.End >= l.End && fits(f.Kind, l.Kind) {
					ok = true
					break
				}
			}
			if ok {
				ks.Recalled++
				if vs != nil {
					vs.Recalled++
				}
			} else {
				r.Missed = append(r.Missed, Miss{Doc: d.Name, Kind: labelName(l), Text: d.Text[l.Start:l.End], Context: around(d.Text, l.Start, l.End)})
			}
		}
		for _, f := range found {
			ks := score(kinds, string(f.Kind))
			ks.Found++
			var vs *Score
			if f.Kind == scrub.APIKey {
				vs = score(vendors, string(f.Kind)+"/"+f.Detail)
				vs.Found++
			}
			covered, outside := 0, f.End-f.Start
			for _, l := range d.Labels {
				if l.Start < f.End && f.Start < l.End {
					covered++
					outside -= min(f.End, l.End) - max(f.Start, l.Start)
				}
			}
			if covered > 0 && outside <= slack {
				ks.Right++
				if vs != nil {
					vs.Right++
				}
			} else {
				r.Wrong = append(r.Wrong, Miss{Doc: d.Name, Kind: string(f.Kind), Text: d.Text[f.Start:f.End], Context: around(d.Text, f.Start, f.End)})
			}
		}
	}
	for _, k := range scrub.Kinds {
		s := *kinds[string(k)]
		r.Kinds = append(r.Kinds, s)
		r.Total.Labels += s.Labels
		r.Total.Recalled += s.Recalled
		r.Total.Found += s.Found
		r.Total.Right += s.Right
	}
	r.Total.Name = "all"
	for _, name := range slices.Sorted(mapKeys(vendors)) {
		r.Vendors = append(r.Vendors, *vendors[name])
	}
	return r, nil
}

// fits reports whether a finding of kind f replaces a label of kind l: the
// same kind, or both kinds of secret (a token assigned to API_KEY= is gone
// whether found as a vendor key or as a secret assignment).
func fits(f, l scrub.Kind) bool {
	return f == l || f.IsSecret() && l.IsSecret()
}

func labelName(l Label) string {
	if l.Vendor != "" {
		return string(l.Kind) + "/" + l.Vendor
	}
	return string(l.Kind)
}

func around(t string, s, e int) string {
	a, b := max(0, s-30), min(len(t), e+30)
	for a > 0 && !utf8.RuneStart(t[a]) {
		a--
	}
	for b < len(t) && !utf8.RuneStart(t[b]) {
		b++
	}
	return strings.ReplaceAll(t[a:b], "\n", "⏎")
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Goals are the figures the scrubber must reach on the tuned corpus.
const (
	GoalRecall    = 0.98 // every kind, every vendor, and all together
	GoalPrecision = 0.95 // every kind, and all together
)

// Goals on the held-out part, which is small and not tuned on: recall
// GoalRecall all together and GoalHeldOutKindRecall for every kind, and no
// finding on unlabelled text (precision 1 for every kind). The part is
// small (a kind has a few to sixty labels), so a floor below 1 would let
// a kind with few findings through with a look-alike flagged: an IP
// floor of 0.95 on its seven findings allows none wrong anyway, and a
// look-alike in this part (a lot number, a section number, a data: URI)
// is there because it was once flagged.
const GoalHeldOutKindRecall = 0.90

// Check reports every figure of r, measured on the tuned corpus, below its
// goal.
func (r *Result) Check() []string {
	var bad []string
	for _, s := range append(append(slices.Clone(r.Kinds), r.Vendors...), r.Total) {
		if s.Labels > 0 && s.Recall() < GoalRecall {
			bad = append(bad, fmt.Sprintf("%s: recall %.3f (%d of %d) below %.2f", s.Name, s.Recall(), s.Recalled, s.Labels, GoalRecall))
		}
	}
	for _, s := range append(r.Kinds, r.Total) {
		if s.Found > 0 && s.Precision() < GoalPrecision {
			bad = append(bad, fmt.Sprintf("%s: precision %.3f (%d of %d) below %.2f", s.Name, s.Precision(), s.Right, s.Found, GoalPrecision))
		}
	}
	return bad
}

// CheckHeldOut reports every figure of r, measured on the held-out part,
// below its goal.
func (r *Result) CheckHeldOut() []string {
	var bad []string
	for _, s := range r.Kinds {
		if s.Labels > 0 && s.Recall() < GoalHeldOutKindRecall {
			bad = append(bad, fmt.Sprintf("%s: recall %.3f (%d of %d) below %.2f", s.Name, s.Recall(), s.Recalled, s.Labels, GoalHeldOutKindRecall))
		}
	}
	if s := r.Total; s.Recall() < GoalRecall {
		bad = append(bad, fmt.Sprintf("%s: recall %.3f (%d of %d) below %.2f", s.Name, s.Recall(), s.Recalled, s.Labels, GoalRecall))
	}
	for _, s := range r.Kinds {
		if s.Right < s.Found {
			bad = append(bad, fmt.Sprintf("%s: precision %.3f (%d of %d): %d found on unlabelled text", s.Name, s.Precision(), s.Right, s.Found, s.Found-s.Right))
		}
	}
	return bad
}

// Print writes r, measured on the tuned corpus, as a table.
func (r *Result) Print(w io.Writer) {
	r.print(w, fmt.Sprintf("goals: recall >= %.2f for every kind and vendor, precision >= %.2f", GoalRecall, GoalPrecision))
}

// PrintHeldOut writes r, measured on the held-out part, as a table.
func (r *Result) PrintHeldOut(w io.Writer) {
	r.print(w, fmt.Sprintf("goals: recall >= %.2f in all and >= %.2f for every kind, nothing found on unlabelled text (precision 1 for every kind)", GoalRecall, GoalHeldOutKindRecall))
}

func (r *Result) print(w io.Writer, goals string) {
	fmt.Fprintf(w, "%-22s %7s %9s %7s %10s\n", "kind", "labels", "recall", "found", "precision")
	row := func(s Score) {
		fmt.Fprintf(w, "%-22s %7d %9.3f %7d %10.3f\n", s.Name, s.Labels, s.Recall(), s.Found, s.Precision())
	}
	for _, s := range r.Kinds {
		row(s)
	}
	for _, s := range r.Vendors {
		s.Name = "  " + s.Name
		row(s)
	}
	row(r.Total)
	fmt.Fprintf(w, "(%d documents, %d bytes; %s)\n", r.Docs, r.Bytes, goals)
}
