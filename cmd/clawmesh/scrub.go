package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/clawmesh/clawmesh/node/scrub"
	"github.com/clawmesh/clawmesh/node/share"
)

const scrubHelp = `Usage: clawmesh scrub [--steps] [--report] [--name NAME]... < input

Shows what would leave this device: reads standard input and writes it to
standard output with personal data and secrets replaced by typed
placeholders, as the node does before anything leaves.

  clawmesh scrub < notes.txt              each line comes out scrubbed
  clawmesh scrub --steps < steps.jsonl    'clawmesh pool export' output in, the steps as
                                          they would leave out (JSONL)
  clawmesh scrub --report < notes.txt     also print to standard error how many of each
                                          kind were found

Found and replaced: e-mail addresses (<EMAIL_1>), phone numbers (<PHONE_1>),
IP addresses (<IP_1>), credentials in URLs (<CREDENTIAL_1>), secrets in
assignments and query strings (<SECRET_1>), vendor API keys and tokens
(<API_KEY_1>), PEM private keys (<PRIVATE_KEY_1>), card numbers (<CARD_1>),
IBANs (<IBAN_1>), US social security numbers (<SSN_1>), UK National
Insurance numbers (<NI_NUMBER_1>), user names in home directory paths
(<USER_1>), and the names you list (<NAME_1>). The same value
gets the same placeholder throughout the input (with --steps: throughout a
session). A private key spanning several lines becomes one placeholder.

With --steps, each step is scrubbed as the node's outbox does it: its ids
become keyed hashes (the key is DATA/share.key, made if missing; it never
leaves the device), its times are rounded to the hour, results of tools that
[share] tools does not list are withheld, and a reply that scrubbing changed
loses its recorded token ids and log-probs.

Names to hide come from [share] names in the config file and from --name.
What is not detected: free-form personal facts in prose ("my sister has
cancer"). Scrubbed text is pseudonymous, not anonymous; set [share]
mode = "none" to share nothing at all.
`

// maxScrubInput bounds the text read without --steps (it is scrubbed
// whole, so that a private key spanning lines is found), and one line with
// --steps.
const maxScrubInput = 512 << 20

func runScrub(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	var s settings
	fs := newFlags("scrub", scrubHelp, stderr)
	fs.StringVar(&s.Config, "config", "", "config file (TOML); default $CLAWMESH_CONFIG, else DATA/config.toml if it exists")
	fs.StringVar(&s.Data, "data", "", "data directory: its config file's [share] and its id key (default $CLAWMESH_DATA, else ~/.clawmesh)")
	steps := fs.Bool("steps", false, "read and write steps as JSONL ('clawmesh pool export' output)")
	report := fs.Bool("report", false, "print to standard error how many of each kind were found")
	var names []string
	fs.Func("name", "a word or phrase to hide as well (repeatable), beside [share] names", func(v string) error {
		names = append(names, v)
		return nil
	})
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageErr("scrub reads standard input and takes no arguments (got %q)", fs.Args())
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	pol := s.Share
	pol.Names = append(pol.Names, names...)
	sc, err := scrub.New(scrub.Options{Names: pol.Names})
	if err != nil {
		return usageErr("%v", err)
	}
	bw := bufio.NewWriterSize(stdout, 256<<10)
	var counts map[scrub.Kind]int
	if *steps {
		key, err := scrubKey(s.Data, stderr)
		if err != nil {
			return err
		}
		counts, err = sc.ScrubJSONL(ctx, stdin, bw, &scrub.StepOptions{Key: key, Tools: pol.Tools}, maxScrubInput)
		if err != nil && strings.Contains(err.Error(), "not a step") {
			bw.Flush()
			return withHint(err, "With --steps, give it what 'clawmesh pool export' writes: one step a line, as JSON")
		}
		if err != nil {
			bw.Flush()
			return err
		}
	} else {
		in, err := io.ReadAll(io.LimitReader(stdin, maxScrubInput+1))
		if err != nil {
			return err
		}
		if len(in) > maxScrubInput {
			return fmt.Errorf("input over %d MiB: scrub it in parts", maxScrubInput>>20)
		}
		var t scrub.Table
		bw.WriteString(sc.Text(&t, string(in)))
		counts = t.Counts()
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	if *report {
		printScrubReport(stderr, counts)
	}
	return nil
}

// scrubKey returns the device's id key from dataDir, making it if the data
// directory exists; else a key for this run only (the hashes will not match
// what the node sends).
func scrubKey(dataDir string, stderr io.Writer) ([]byte, error) {
	if _, err := os.Stat(dataDir); err == nil {
		release, err := lockKey(dataDir, "scrub")
		if err != nil {
			return nil, err
		}
		defer release()
		return share.LoadKey(dataDir)
	}
	dir, err := os.MkdirTemp("", "clawmesh-scrub-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	fmt.Fprintf(stderr, "clawmesh scrub: no data directory %s: ids are hashed with a key for this run only\n", dataDir)
	return share.LoadKey(filepath.Join(dir, "key"))
}

func printScrubReport(w io.Writer, counts map[scrub.Kind]int) {
	total := 0
	var kinds []string
	for k, n := range counts {
		total += n
		kinds = append(kinds, string(k))
	}
	sort.Slice(kinds, func(i, j int) bool {
		return kindOrder(scrub.Kind(kinds[i])) < kindOrder(scrub.Kind(kinds[j]))
	})
	fmt.Fprintf(w, "scrubbed %d:", total)
	if total == 0 {
		fmt.Fprintln(w, " nothing found")
		return
	}
	fmt.Fprintln(w)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-12s %d\n", k, counts[scrub.Kind(k)])
	}
}

func kindOrder(k scrub.Kind) int {
	for i, x := range scrub.Kinds {
		if x == k {
			return i
		}
	}
	return len(scrub.Kinds)
}
