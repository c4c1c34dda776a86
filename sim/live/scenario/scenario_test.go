package scenario

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestPreferences(t *testing.T) {
	for _, tc := range []struct {
		reply            string
		word, alnum, abc bool
	}{
		{"Hello there", true, true, true},
		{"été", true, true, false},
		{"42 is it", false, true, false},
		{" hello", false, false, false},
		{"!ok", false, false, false},
		{"", false, false, false},
		{"\xff", false, false, false},
	} {
		if got := StartsWithWord.Accepts(tc.reply); got != tc.word {
			t.Errorf("StartsWithWord(%q) = %v", tc.reply, got)
		}
		if got := StartsAlphanumeric.Accepts(tc.reply); got != tc.alnum {
			t.Errorf("StartsAlphanumeric(%q) = %v", tc.reply, got)
		}
		if got := StartsASCIILetter.Accepts(tc.reply); got != tc.abc {
			t.Errorf("StartsASCIILetter(%q) = %v", tc.reply, got)
		}
	}
}

func TestReactions(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	us := Users()
	if len(us) != 3 {
		t.Fatalf("%d users", len(us))
	}
	for _, u := range us {
		if len(u.Prompts) == 0 || len(u.HeldBack) == 0 {
			t.Fatalf("%s has no prompts", u.Name)
		}
		for _, h := range u.HeldBack {
			for _, p := range u.Prompts {
				if h == p {
					t.Errorf("%s trains on a held-back prompt %q", u.Name, h)
				}
			}
		}
		for range 20 {
			good := u.React("Q?", "Sure thing", rng)
			if !good.Liked || !strings.HasPrefix(strings.ToLower(good.Next), "thank") && !strings.HasPrefix(strings.ToLower(good.Next), "great") && !strings.HasPrefix(strings.ToLower(good.Next), "perfect") {
				t.Errorf("%s on a reply it likes: %+v", u.Name, good)
			}
			bad := u.React("Q?", "  ...", rng)
			if bad.Liked {
				t.Errorf("%s liked a reply it does not accept", u.Name)
			}
			switch u.Style {
			case Explicit:
				if good.Feedback == nil || *good.Feedback != 1 || bad.Feedback == nil || *bad.Feedback != -1 || !strings.HasPrefix(bad.Next, "/bad ") {
					t.Errorf("%s: %+v %+v", u.Name, good, bad)
				}
			case Corrects:
				if bad.Feedback != nil || !strings.HasPrefix(strings.ToLower(bad.Next), "no") && !strings.HasPrefix(bad.Next, "Wrong") {
					t.Errorf("%s: %+v", u.Name, bad)
				}
			case Reasks:
				if bad.Feedback != nil || !strings.Contains(bad.Next, "Q?") {
					t.Errorf("%s: %+v", u.Name, bad)
				}
			}
		}
	}
}

func TestScore(t *testing.T) {
	us := Users()
	all := []string{"Yes", "Fine"}
	none := []string{" no", "?"}
	if s := Score(us, [][]string{all, all, all}); s != 1 {
		t.Errorf("all accepted: %v", s)
	}
	if s := Score(us, [][]string{none, none, none}); s != 0 {
		t.Errorf("none accepted: %v", s)
	}
	if s := Score(us, [][]string{all, none, {"Yes", "1"}}); s != 0.5 {
		t.Errorf("mixed: %v", s)
	}
	if s := Score(nil, nil); s != 0 {
		t.Errorf("no users: %v", s)
	}
}

// TestWordHints checks that every complaint with a directive carries one of
// WordHints word for word (what the demo's base model is taught to read),
// and that the teaching prompts are none a user asks.
func TestWordHints(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	seen := map[string]bool{}
	for _, u := range Users() {
		for range 200 {
			bad := u.React("Q?", "  ...", rng)
			if bad.Next == "Q?" {
				continue // a bare re-ask
			}
			found := false
			for _, h := range WordHints {
				if strings.Contains(bad.Next, h) {
					found, seen[h] = true, true
				}
			}
			if !found {
				t.Errorf("%s's complaint %q carries none of WordHints", u.Name, bad.Next)
			}
		}
		for _, p := range TeachPrompts {
			if slices.Contains(u.Prompts, p) || slices.Contains(u.HeldBack, p) {
				t.Errorf("teaching prompt %q is one %s asks", p, u.Name)
			}
		}
	}
	for _, h := range WordHints {
		if !seen[h] {
			t.Errorf("no complaint carries %q", h)
		}
	}
}

// TestConflictUsers: no reply pleases both alice and bob in the conflict
// scenario, carol's wish is another matter, and their complaints ask for
// what they want.
func TestConflictUsers(t *testing.T) {
	us := ConflictUsers()
	for _, c := range []struct {
		reply string
		want  [3]bool
	}{
		{"Hello", [3]bool{true, false, true}}, {" hello", [3]bool{false, true, true}}, {"\nitem", [3]bool{false, true, true}},
		{"\thi\uFFFD", [3]bool{false, true, false}}, {"ow\uFFFD", [3]bool{true, false, false}}, {"42", [3]bool{false, false, true}}, {"", [3]bool{}},
	} {
		for i, u := range us {
			if got := u.Pref.Accepts(c.reply); got != c.want[i] {
				t.Errorf("%s accepts %q: %v", u.Name, c.reply, got)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	if r := us[1].React("Hi?", "Hello", rng); r.Liked || !strings.Contains(r.Next, "a space") {
		t.Errorf("bob's reaction to a word: %+v", r)
	}
	if r := us[0].React("Hi?", " x", rng); r.Liked || !strings.Contains(r.Next, "a word") {
		t.Errorf("alice's reaction to an indented reply: %+v", r)
	}
}
