// Package scrub finds personal data and secrets in text and replaces them
// with typed placeholders, before anything recorded on a device leaves it.
//
// It is pure: text in, text out, no network, no disk, no clock. A Scrubber
// holds the detectors (and the user's own list of names to hide) and is safe
// for concurrent use; Find reports what it detects in one text. A Table
// holds the placeholders of one trajectory (a session), so that the same
// e-mail address becomes <EMAIL_1> in every step of it and another becomes
// <EMAIL_2>. A Pass is one goroutine's scrubbing job (a batch): it remembers
// what it found in the texts it has seen, so a system prompt that a
// conversation resends at every call is scanned once per pass, not once per
// step.
//
// What is detected (see Kind): e-mail addresses and phone numbers (also
// percent-encoded in a URL), IP addresses, credentials in URLs, secrets in
// assignments and query strings, vendor API keys and tokens, PEM private
// keys, card numbers (Luhn checked), IBANs (mod-97 checked), US social
// security numbers, UK National Insurance numbers, user names in
// home-directory paths, and the user's listed names. Ordinary text, code,
// hashes, UUIDs, version numbers and dates are left as they are.
//
// What is not: free-form personal facts in prose ("my sister has cancer").
// Scrubbed text is pseudonymous, not anonymous. The placeholders cannot be
// reversed without the device's own data.
//
// Step applies all this to a recorded step, and also replaces the ids of a
// step by keyed hashes (HashID) and rounds its times to the hour.
package scrub

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Kind is the type of a finding; placeholders are written <KIND_N>.
type Kind string

// The kinds of finding.
const (
	Email      Kind = "EMAIL"
	Phone      Kind = "PHONE"
	IP         Kind = "IP"
	Credential Kind = "CREDENTIAL"  // user:password in a URL
	Secret     Kind = "SECRET"      // a value assigned to a name that says secret; a credential in a query string
	APIKey     Kind = "API_KEY"     // a vendor key or token, by its published format; Finding.Detail names the vendor
	PrivateKey Kind = "PRIVATE_KEY" // a whole PEM private key block
	Card       Kind = "CARD"        // a payment card number (Luhn checked)
	IBAN       Kind = "IBAN"        // an IBAN (mod-97 checked)
	SSN        Kind = "SSN"         // a US social security number
	NINumber   Kind = "NI_NUMBER"   // a UK National Insurance number
	User       Kind = "USER"        // the user name in a home-directory path
	Name       Kind = "NAME"        // a name the user listed
)

// Kinds lists every kind, in the order reports print them.
var Kinds = []Kind{Email, Phone, IP, Credential, Secret, APIKey, PrivateKey, Card, IBAN, SSN, NINumber, User, Name}

// priority decides between overlapping findings: the higher wins.
func (k Kind) priority() int {
	switch k {
	case PrivateKey:
		return 100
	case APIKey:
		return 90
	case Credential:
		return 80
	case Secret:
		return 70
	case IBAN:
		return 60
	case Card:
		return 55
	case SSN, NINumber:
		return 50
	case Email:
		return 45
	case IP:
		return 40
	case Phone:
		return 35
	case User:
		return 30
	case Name:
		return 20
	}
	return 0
}

// IsSecret reports whether k is one of the kinds that hold a secret rather
// than an identifier: credentials, secrets, API keys and private keys.
func (k Kind) IsSecret() bool {
	switch k {
	case Credential, Secret, APIKey, PrivateKey:
		return true
	}
	return false
}

// Finding is one detected span of a text: text[Start:End] is of kind Kind.
type Finding struct {
	Start, End int
	Kind       Kind
	// Detail refines the kind: the vendor of an API key ("github", "aws",
	// ...), empty otherwise.
	Detail string
}

// Options configure a Scrubber.
type Options struct {
	// Names are words and phrases the user wants hidden as well (people,
	// projects): each is matched case-insensitively as whole words, any run
	// of white space matching the spaces between its words, and becomes
	// <NAME_N>. Entries shorter than two characters are refused.
	Names []string
}

// Scrubber detects personal data and secrets. It is immutable once made and
// safe for concurrent use.
type Scrubber struct {
	names *nameMatcher
}

// New makes a Scrubber.
func New(o Options) (*Scrubber, error) {
	nm, err := newNameMatcher(o.Names)
	if err != nil {
		return nil, err
	}
	return &Scrubber{names: nm}, nil
}

// MaxPlaceholderGrowth bounds how much longer than its input a scrubbed text
// can be: len(out) <= MaxPlaceholderGrowth*len(in) + 64. A placeholder
// (<KIND_N>) replaces a finding at least two bytes long.
const MaxPlaceholderGrowth = 8

// Find returns the findings in text, ordered by position and not
// overlapping. Existing placeholders are never findings, so scrubbing
// scrubbed text changes nothing.
//
// Replacing a finding changes the text around others (a placeholder ends in
// '>' where the value ended in a letter; a keyword comes nearer), so Find
// scans the replaced text again and adds what that finds, until nothing
// more is found: the findings it returns leave a fixed point.
func (s *Scrubber) Find(text string) []Finding {
	fs := s.find(text)
	for round := 0; round < 8 && len(fs) > 0; round++ {
		var probe Table
		out, segs := replaceMapped(&probe, text, fs)
		more := s.find(out)
		if len(more) == 0 {
			return fs
		}
		// A finding in the replaced text lies between placeholders (resolve
		// drops any that touch one): move it back to where it is in text.
		for _, m := range more {
			k := sort.Search(len(segs), func(i int) bool { return segs[i].outEnd > m.Start }) // the segment holding m
			if k == len(segs) || m.Start < segs[k].outStart || m.End > segs[k].outEnd {
				continue
			}
			d := segs[k].inStart - segs[k].outStart
			m.Start += d
			m.End += d
			fs = append(fs, m)
		}
		slices.SortFunc(fs, func(a, b Finding) int { return a.Start - b.Start })
	}
	return fs
}

// find is one scan of text.
func (s *Scrubber) find(text string) []Finding {
	if len(text) < 2 {
		return nil
	}
	var d detector
	d.text = text
	d.scan()
	if s.names != nil {
		d.found = s.names.find(text, d.found)
	}
	return resolve(text, d.found)
}

// segment is a stretch of text that Replace copied unchanged: out[outStart:
// outEnd] is text[inStart:...].
type segment struct{ inStart, outStart, outEnd int }

// replaceMapped is Replace that also says where each unchanged stretch went.
func replaceMapped(t *Table, text string, fs []Finding) (string, []segment) {
	var b strings.Builder
	b.Grow(len(text))
	segs := make([]segment, 0, len(fs)+1)
	last := 0
	for _, f := range fs {
		segs = append(segs, segment{last, b.Len(), b.Len() + f.Start - last})
		b.WriteString(text[last:f.Start])
		b.WriteString(t.placeholder(f.Kind, text[f.Start:f.End]))
		last = f.End
	}
	segs = append(segs, segment{last, b.Len(), b.Len() + len(text) - last})
	b.WriteString(text[last:])
	return b.String(), segs
}

// resolve sorts candidates and keeps, of overlapping ones, the one of higher
// priority (then the longer, then the earlier); it drops candidates that
// overlap an existing placeholder.
func resolve(text string, c []Finding) []Finding {
	if len(c) == 0 {
		return nil
	}
	slices.SortFunc(c, func(a, b Finding) int {
		if a.Start != b.Start {
			return a.Start - b.Start
		}
		if pa, pb := a.Kind.priority(), b.Kind.priority(); pa != pb {
			return pb - pa
		}
		return (b.End - b.Start) - (a.End - a.Start)
	})
	ph := placeholderSpans(text)
	out := c[:0:0]
	for _, f := range c {
		if f.End <= f.Start || overlapsAny(ph, f) {
			continue
		}
		// The findings kept that f overlaps are a suffix of out (they do not
		// overlap each other and are sorted). f replaces them if it beats
		// every one of them.
		k := len(out)
		for k > 0 && f.Start < out[k-1].End {
			k--
		}
		beats := true
		for _, o := range out[k:] {
			pf, po := f.Kind.priority(), o.Kind.priority()
			if pf < po || pf == po && f.End-f.Start <= o.End-o.Start {
				beats = false
				break
			}
		}
		if beats {
			out = append(out[:k], f)
		}
	}
	return out
}

func overlapsAny(spans [][2]int, f Finding) bool {
	for _, s := range spans {
		if f.Start < s[1] && s[0] < f.End {
			return true
		}
	}
	return false
}

// Withheld replaces the content of a tool result the sharing policy does not
// let leave the device.
const Withheld = "<TOOL_RESULT_WITHHELD>"

// placeholderSpans finds the placeholders already in text: <KIND_N> for a
// known kind, and Withheld.
func placeholderSpans(text string) [][2]int {
	var out [][2]int
	for i := 0; i < len(text); {
		j := strings.IndexByte(text[i:], '<')
		if j < 0 {
			break
		}
		i += j
		if n := placeholderLen(text[i:]); n > 0 {
			out = append(out, [2]int{i, i + n})
			i += n
			continue
		}
		i++
	}
	return out
}

// placeholderLen returns the length of the placeholder text starts with, or 0.
func placeholderLen(text string) int {
	if strings.HasPrefix(text, Withheld) {
		return len(Withheld)
	}
	// <KIND_N>
	end := strings.IndexByte(text, '>')
	if end < 4 || end > 24 {
		return 0
	}
	body := text[1:end]
	us := strings.LastIndexByte(body, '_')
	if us < 1 || us == len(body)-1 {
		return 0
	}
	for _, c := range []byte(body[us+1:]) {
		if c < '0' || c > '9' {
			return 0
		}
	}
	if !slices.Contains(Kinds, Kind(body[:us])) {
		return 0
	}
	return end + 1
}

// Table holds the placeholders of one trajectory: the same value of a kind
// always gets the same number in it. The zero value is ready to use; a
// Table is not safe for concurrent use.
type Table struct {
	ids    map[tableKey]int
	next   map[Kind]int
	counts map[Kind]int
}

type tableKey struct {
	kind  Kind
	value string
}

// placeholder returns <KIND_N> for the value, numbering a new value next.
func (t *Table) placeholder(k Kind, value string) string {
	if t.ids == nil {
		t.ids = map[tableKey]int{}
		t.next = map[Kind]int{}
		t.counts = map[Kind]int{}
	}
	key := tableKey{k, normalize(k, value)}
	n, ok := t.ids[key]
	if !ok {
		t.next[k]++
		n = t.next[k]
		t.ids[key] = n
	}
	t.counts[k]++
	return "<" + string(k) + "_" + strconv.Itoa(n) + ">"
}

// Counts returns how many findings of each kind the table has replaced.
func (t *Table) Counts() map[Kind]int {
	out := make(map[Kind]int, len(t.counts))
	for k, v := range t.counts {
		out[k] = v
	}
	return out
}

// Distinct returns how many distinct values of each kind the table holds.
func (t *Table) Distinct() map[Kind]int {
	out := make(map[Kind]int, len(t.next))
	for k, v := range t.next {
		out[k] = v
	}
	return out
}

// normalize maps the ways one value is written to one key.
func normalize(k Kind, v string) string {
	switch k {
	case Email, Name, User:
		return strings.Join(strings.Fields(strings.ToLower(v)), " ")
	case Phone, Card, IBAN, SSN, NINumber:
		var b strings.Builder
		for _, c := range []byte(v) {
			if c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' {
				b.WriteByte(c)
			}
		}
		return b.String()
	case IP:
		if a, ok := parseIP(v); ok {
			return a
		}
	}
	return v
}

// Replace writes text with each finding replaced by its placeholder from t.
func Replace(t *Table, text string, fs []Finding) string {
	if len(fs) == 0 {
		return text
	}
	var b strings.Builder
	b.Grow(len(text))
	last := 0
	for _, f := range fs {
		if f.Start < last || f.End > len(text) {
			panic(fmt.Sprintf("scrub: findings out of order: %v after %d", f, last))
		}
		b.WriteString(text[last:f.Start])
		b.WriteString(t.placeholder(f.Kind, text[f.Start:f.End]))
		last = f.End
	}
	b.WriteString(text[last:])
	return b.String()
}

// Text scrubs text with a fresh scan, numbering placeholders in t.
func (s *Scrubber) Text(t *Table, text string) string {
	return Replace(t, text, s.Find(text))
}

// Pass is one scrubbing job (a batch of steps): it keeps the findings of the
// longer texts it has scanned, so a text seen again (the system prompt, the
// history a conversation resends, tool definitions) is not scanned again. A
// Pass is not safe for concurrent use; make one per goroutine and job.
type Pass struct {
	s      *Scrubber
	cache  map[string][]Finding
	cached int // bytes of text keys held
	// Scanned and Reused count the bytes scanned and the bytes whose
	// findings came from the cache.
	Scanned, Reused int64
}

// minCached is the length from which a text's findings are kept: shorter
// texts cost less to scan than to remember.
const minCached = 256

// maxCached bounds the text a Pass remembers findings for.
const maxCached = 256 << 20

// NewPass starts a scrubbing job.
func (s *Scrubber) NewPass() *Pass {
	return &Pass{s: s, cache: map[string][]Finding{}}
}

// Find is Scrubber.Find, remembering the findings of longer texts.
func (p *Pass) Find(text string) []Finding {
	if len(text) < minCached {
		p.Scanned += int64(len(text))
		return p.s.Find(text)
	}
	if fs, ok := p.cache[text]; ok {
		p.Reused += int64(len(text))
		return fs
	}
	p.Scanned += int64(len(text))
	fs := p.s.Find(text)
	if p.cached+len(text) <= maxCached {
		p.cache[text] = fs
		p.cached += len(text)
	}
	return fs
}

// Text scrubs text, numbering placeholders in t.
func (p *Pass) Text(t *Table, text string) string {
	return Replace(t, text, p.Find(text))
}
