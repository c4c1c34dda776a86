package scrub

import (
	"strings"
	"testing"
)

// FuzzScrub: no input panics the scrubber; findings are in order, inside
// the text and apart; the output is bounded; and scrubbing is idempotent
// (scrubbing the output changes nothing, with the same table or a new one).
func FuzzScrub(f *testing.F) {
	for _, s := range []string{
		"mail alice.zhou@example.org or +44 20 7946 0958",
		"postgres://app:s3cr3t@db:5432/x?password=hunter22&sig=abcDEF123456",
		"DB_PASSWORD=hunter2 GITHUB_TOKEN=ghp_abcdefghijklmnopqrstuvwxyz0123456789",
		"-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
		"-----BEGIN PRIVATE KEY-----\\nMIIE",
		"4111 1111 1111 1111 GB82 WEST 1234 5698 7654 32 123-45-6789",
		`C:\Users\Ada Lovelace\x /home/bob/y \\Users\\c\\`,
		"fe80::1%eth0 [2001:db8::1]:443 10.0.0.1",
		"Alice Zhou <EMAIL_1> <TOOL_RESULT_WITHHELD> token: <SECRET_2>",
		"Authorization: Bearer abcdefghij1234567890",
		"a@b.cd@e.fg +1 (415) 555-0132 (020) 7946 0958",
		"030/12345678 089 / 123 456 (0)20 7946 0958 0 800 12 34 56 0049301234567 0044 20 7946 0958",
		"mailto:jane%40example.com?x=1&phone=%2B4930123456789&e=a%40b%40c.de %2",
		"SSN 123 45 6789 token=dGVzdA== AKIAIOSFODNN7EXAMPLE 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'",
	} {
		f.Add(s)
	}
	sc, err := New(Options{Names: []string{"Alice Zhou", "Falcon", "周杰"}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in string) {
		fs := sc.Find(in)
		last := 0
		for _, x := range fs {
			if x.Start < last || x.End <= x.Start || x.End > len(in) {
				t.Fatalf("bad finding %+v after %d in %q", x, last, in)
			}
			last = x.End
		}
		var tb Table
		out := Replace(&tb, in, fs)
		if len(out) > MaxPlaceholderGrowth*len(in)+64 {
			t.Fatalf("output of %d bytes for %d in", len(out), len(in))
		}
		if again := sc.Text(&tb, out); again != out {
			t.Fatalf("not idempotent (same table):\n in %q\nout %q\nthen %q", in, out, again)
		}
		if again := sc.Text(&Table{}, out); again != out {
			t.Fatalf("not idempotent (new table):\n in %q\nout %q\nthen %q", in, out, again)
		}
		if len(fs) == 0 && out != in {
			t.Fatalf("no finding, yet changed: %q → %q", in, out)
		}
		if strings.Count(out, "<") < strings.Count(in, "<") {
			t.Fatalf("a '<' went missing: %q → %q", in, out)
		}
	})
}
