// Package scenario holds the learning scenarios the demo uses: simulated
// users, each with a hidden preference about the replies it gets and a way
// of showing it (corrections, re-asks, thanks, explicit feedback), and the
// personalization score: the share of replies to held-back prompts that
// their user would accept.
//
// The package is pure: no network, no clock; randomness comes in as a
// *rand.Rand, so a seed replays the same users. It is a leaf apart from
// sim/live, the mesh the users talk to, so that a package the mesh is
// built on (trainer/learn's tests use TeachPrompts and WordHints) can use
// the users without importing the mesh.
package scenario

import (
	"math/rand/v2"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Preference is what a user wants from a reply, hidden from the mesh: only
// the user's reactions show it.
type Preference struct {
	// Name says the preference in a few words (for the demo's output).
	Name string
	// Accepts reports whether the user is happy with the reply.
	Accepts func(reply string) bool
	// Wants is what the user asks for when it complains ("a word": the
	// default), in its corrections and re-asks.
	Wants string
}

// wants is what p's user asks for when it complains.
func (p Preference) wants() string {
	if p.Wants == "" {
		return "a word"
	}
	return p.Wants
}

// The preferences of the default users. They differ, and a single adapter
// can satisfy all three: replies that start with a plain letter.
var (
	StartsWithWord = Preference{Name: "start straight away with a word", Accepts: func(s string) bool {
		r, _ := utf8.DecodeRuneInString(s)
		return r != utf8.RuneError && unicode.IsLetter(r)
	}}
	StartsAlphanumeric = Preference{Name: "start with a letter or a digit, not a space or a symbol", Accepts: func(s string) bool {
		r, _ := utf8.DecodeRuneInString(s)
		return r != utf8.RuneError && (unicode.IsLetter(r) || unicode.IsDigit(r))
	}}
	StartsASCIILetter = Preference{Name: "start with a plain a-z or A-Z letter", Accepts: func(s string) bool {
		return s != "" && (s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z')
	}}
)

// The preferences of the conflict scenario. StartsIndented is the
// opposite of StartsWithWord: no reply pleases both. CleanText is about
// something else (no garbled character), and agrees with neither.
var (
	StartsIndented = Preference{Name: "start indented: a space, a tab or a new line first", Wants: "a space", Accepts: func(s string) bool {
		r, _ := utf8.DecodeRuneInString(s)
		return r != utf8.RuneError && unicode.IsSpace(r)
	}}
	CleanText = Preference{Name: "no garbled character (no U+FFFD) anywhere in the reply", Wants: "clean text", Accepts: func(s string) bool {
		return s != "" && utf8.ValidString(s) && !strings.ContainsRune(s, utf8.RuneError)
	}}
)

// Style is how a user shows what it thinks of a reply.
type Style int

const (
	// Explicit users rate replies: a score on the feedback endpoint, and
	// "/bad" with what they wanted, or thanks.
	//
	// Every complaint but a bare re-ask says what the user wanted in words
	// the built-in hint plugin reads as a directive.
	Explicit Style = iota
	// Corrects users say what was wrong ("No, you should ...") or thank.
	Corrects
	// Reasks users ask the same question again, now and then with a
	// directive, or thank.
	Reasks
)

func (s Style) String() string {
	switch s {
	case Explicit:
		return "explicit feedback"
	case Corrects:
		return "corrections"
	case Reasks:
		return "re-asks"
	}
	return "unknown"
}

// User is one simulated user.
type User struct {
	Name  string
	Pref  Preference
	Style Style
	// Prompts are what the user asks while the mesh learns; HeldBack are
	// asked only to measure the score, never trained on.
	Prompts, HeldBack []string
}

// Reaction is what a user does after a reply: a score on the feedback
// endpoint (nil: none), then its next message in the session.
type Reaction struct {
	Liked    bool
	Feedback *float64
	Next     string
}

// React is u's reaction to reply, given to the question it answered.
func (u User) React(question, reply string, rng *rand.Rand) Reaction {
	liked := u.Pref.Accepts(reply)
	thanks := []string{"Thanks, that helps.", "Great, thank you.", "Perfect, thanks!"}
	if liked {
		r := Reaction{Liked: true, Next: thanks[rng.IntN(len(thanks))]}
		if u.Style == Explicit {
			one := 1.0
			r.Feedback = &one
		}
		return r
	}
	w := u.Pref.wants()
	switch u.Style {
	case Explicit:
		minus := -1.0
		return Reaction{Feedback: &minus, Next: "/bad you should start the reply with " + w}
	case Corrects:
		fixes := []string{"No, you should start with a word, not symbols.", "No, that's not what I asked. Next time, start the reply with a word.",
			"Wrong. Don't open with punctuation, start with a word."}
		if w != "a word" {
			fixes = []string{"No, you should start with " + w + ".", "No, that's not what I asked. Next time, start the reply with " + w + ".",
				"Wrong. Start with " + w + "."}
		}
		return Reaction{Next: fixes[rng.IntN(len(fixes))]}
	default:
		if rng.IntN(3) == 0 {
			return Reaction{Next: "I asked: " + question + " Please make sure to start with " + w + "."}
		}
		return Reaction{Next: question}
	}
}

// Users are the demo's three users: one per node, each with its own
// preference, style and topics.
func Users() []User {
	return []User{
		{Name: "alice", Pref: StartsWithWord, Style: Explicit,
			Prompts:  []string{"What time is it?", "Can you help me?", "Tell me a joke.", "How do I list files?"},
			HeldBack: []string{"What is the weather like?", "Where are my keys?"}},
		{Name: "bob", Pref: StartsAlphanumeric, Style: Corrects,
			Prompts:  []string{"Hi, how are you?", "Fix the failing test.", "Summarise this log.", "Which port is free?"},
			HeldBack: []string{"Rename the branch.", "Why is the build slow?"}},
		{Name: "carol", Pref: StartsASCIILetter, Style: Reasks,
			Prompts:  []string{"Plan my day.", "Translate hello to French.", "Write a haiku.", "What should I cook?"},
			HeldBack: []string{"Suggest a book.", "How far is the moon?"}},
	}
}

// ConflictUsers are the conflict scenario's users, on the same nodes,
// styles and prompts as Users: alice wants a word first and bob an
// indented reply, opposite wishes no shared adapter can meet at once;
// carol wants clean text, and agrees with neither. Only an adapter of
// their own gives alice and bob what they want.
func ConflictUsers() []User {
	us := Users()
	us[1].Pref = StartsIndented
	us[2].Pref = CleanText
	return us
}

// WordHints are the directives the users' complaints carry, as the
// built-in hint plugin extracts them: every way they ask for a reply that
// starts with a word.
var WordHints = []string{
	"you should start the reply with a word",
	"No, you should start with a word, not symbols.",
	"Next time, start the reply with a word.",
	"Don't open with punctuation, start with a word.",
	"Please make sure to start with a word.",
}

// TeachPrompts are prompts no user asks, on which the demo's base model is
// taught to follow the users' directive when a hint says it: an
// instruction-following base model, as a real deployment has, but one
// that does not know any user's preference.
var TeachPrompts = []string{
	"Good morning!", "Can you check this?", "What is the plan?", "Help me write an email.",
	"Explain recursion.", "Is it going to rain?", "Where should we eat?", "Count to five.",
	"Say something nice.", "What's new?", "Open the file.", "List three colours.",
	"Who wrote this code?", "When does the shop open?", "Start the server.", "Delete the old logs.",
	"How do I exit vim?", "Is this safe to eat?", "Book a table for two.", "What does this error mean?",
	"Find my last email.", "Turn off the lights.", "Draw a cat.", "Recommend a film.",
	"Check the tests.", "Update the docs.", "Why did it crash?", "How big is the sun?",
	"Call mum.", "Set an alarm for seven.", "What is two plus two?", "Clean up the repo.",
	"Where is the station?", "Read me the news.", "Order more coffee.", "Is the build green?",
}

// Accepted is the share of replies that u accepts (0 when there are none).
func (u User) Accepted(replies []string) float64 {
	if len(replies) == 0 {
		return 0
	}
	n := 0
	for _, r := range replies {
		if u.Pref.Accepts(r) {
			n++
		}
	}
	return float64(n) / float64(len(replies))
}

// Score is the personalization score: the mean over users of the share of
// their held-back replies they accept. replies[i] are user i's.
func Score(users []User, replies [][]string) float64 {
	if len(users) == 0 {
		return 0
	}
	var s float64
	for i, u := range users {
		if i < len(replies) {
			s += u.Accepted(replies[i])
		}
	}
	return s / float64(len(users))
}
