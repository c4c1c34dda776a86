package setup

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// plistValue decodes a property list value (the subset launchd agents use:
// dict, array, string, integer, true, false) from d, after its start
// element.
func plistValue(d *xml.Decoder, start xml.StartElement) (any, error) {
	switch start.Name.Local {
	case "string", "integer":
		var s string
		if err := d.DecodeElement(&s, &start); err != nil {
			return nil, err
		}
		if start.Name.Local == "integer" {
			var n int
			if _, err := fmt.Sscan(s, &n); err != nil {
				return nil, fmt.Errorf("integer %q", s)
			}
			return n, nil
		}
		return s, nil
	case "true", "false":
		if err := d.Skip(); err != nil {
			return nil, err
		}
		return start.Name.Local == "true", nil
	case "array":
		var a []any
		for {
			tok, err := d.Token()
			if err != nil {
				return nil, err
			}
			switch t := tok.(type) {
			case xml.StartElement:
				v, err := plistValue(d, t)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			case xml.EndElement:
				return a, nil
			}
		}
	case "dict":
		m := map[string]any{}
		key := ""
		for {
			tok, err := d.Token()
			if err != nil {
				return nil, err
			}
			switch t := tok.(type) {
			case xml.StartElement:
				if t.Name.Local == "key" {
					if key != "" {
						return nil, fmt.Errorf("key %q has no value", key)
					}
					if err := d.DecodeElement(&key, &t); err != nil {
						return nil, err
					}
					if _, dup := m[key]; dup {
						return nil, fmt.Errorf("key %q twice", key)
					}
					continue
				}
				if key == "" {
					return nil, fmt.Errorf("<%s> with no key", t.Name.Local)
				}
				v, err := plistValue(d, t)
				if err != nil {
					return nil, err
				}
				m[key], key = v, ""
			case xml.EndElement:
				if key != "" {
					return nil, fmt.Errorf("key %q has no value", key)
				}
				return m, nil
			}
		}
	}
	return nil, fmt.Errorf("unknown plist element <%s>", start.Name.Local)
}

// parsePlist reads an XML property list: a <plist version="1.0"> holding
// one value.
func parsePlist(b []byte) (any, error) {
	d := xml.NewDecoder(bytes.NewReader(b))
	d.Strict = true
	var v any
	sawPlist := false
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		t, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if !sawPlist {
			if t.Name.Local != "plist" {
				return nil, fmt.Errorf("root <%s>, want <plist>", t.Name.Local)
			}
			sawPlist = true
			continue
		}
		if v != nil {
			return nil, errors.New("more than one value in the plist")
		}
		if v, err = plistValue(d, t); err != nil {
			return nil, err
		}
	}
	if v == nil {
		return nil, errors.New("empty plist")
	}
	return v, nil
}

func TestLaunchdPlist(t *testing.T) {
	s := Service{
		Label:   ServiceLabel,
		Program: "/opt/homebrew/bin/clawmesh",
		Args:    []string{"node", "--data", "/Users/a & b/.clawmesh <x>", "--upstream", "http://127.0.0.1:11434/v1"},
		LogFile: "/Users/a & b/.clawmesh/node.log",
	}
	v, err := parsePlist(LaunchdPlist(s))
	if err != nil {
		t.Fatalf("not a property list: %v\n%s", err, LaunchdPlist(s))
	}
	want := map[string]any{
		"Label":             ServiceLabel,
		"ProgramArguments":  []any{"/opt/homebrew/bin/clawmesh", "node", "--data", "/Users/a & b/.clawmesh <x>", "--upstream", "http://127.0.0.1:11434/v1"},
		"RunAtLoad":         true,
		"KeepAlive":         map[string]any{"SuccessfulExit": false},
		"ThrottleInterval":  10,
		"ProcessType":       "Background",
		"StandardOutPath":   "/Users/a & b/.clawmesh/node.log",
		"StandardErrorPath": "/Users/a & b/.clawmesh/node.log",
	}
	if !reflect.DeepEqual(v, want) {
		t.Errorf("plist\n%#v\nwant\n%#v", v, want)
	}
	// And by property list readers not written here: Python's standard
	// plistlib, where python3 is installed, and on macOS plutil.
	if python, err := exec.LookPath("python3"); err == nil {
		cmd := exec.Command(python, "-c", "import json, plistlib, sys; json.dump(plistlib.loads(sys.stdin.buffer.read()), sys.stdout)")
		cmd.Stdin = bytes.NewReader(LaunchdPlist(s))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("plistlib cannot read the plist: %v\n%s", err, stderr.String())
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatal(err)
		}
		wantJSON, _ := json.Marshal(want)
		var w map[string]any
		json.Unmarshal(wantJSON, &w)
		if !reflect.DeepEqual(got, w) {
			t.Errorf("plistlib reads\n%v\nwant\n%v", got, w)
		}
	}
	if plutil, err := exec.LookPath("plutil"); err == nil {
		f := filepath.Join(t.TempDir(), "a.plist")
		os.WriteFile(f, LaunchdPlist(s), 0o600)
		if out, err := exec.Command(plutil, "-lint", f).CombinedOutput(); err != nil {
			t.Errorf("plutil -lint: %v\n%s", err, out)
		}
	}
}

// unitSections reads a systemd unit file into section → key → values.
func unitSections(t *testing.T, unit string) map[string]map[string][]string {
	t.Helper()
	secs := map[string]map[string][]string{}
	cur := ""
	for i, l := range strings.Split(unit, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
			cur = l[1 : len(l)-1]
			secs[cur] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok || cur == "" {
				t.Fatalf("line %d %q is not key=value in a section", i+1, l)
			}
			secs[cur][k] = append(secs[cur][k], v)
		}
	}
	return secs
}

func TestSystemdUnit(t *testing.T) {
	bin, err := os.Executable() // a file that exists and runs
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := Service{Label: ServiceLabel, Program: bin, Args: []string{"node", "--data", dir + "/my data", "--token", "50%$off"}, LogFile: dir + "/node.log", Dir: dir + "/my data"}
	unit := SystemdUnit(s)
	secs := unitSections(t, unit)
	for _, want := range []struct{ sec, key, val string }{
		{"Service", "ExecStart", bin + ` node --data "` + dir + `/my data" --token 50%%$$off`},
		{"Service", "Restart", "on-failure"},
		{"Service", "Type", "simple"},
		{"Service", "StandardOutput", "append:" + dir + "/node.log"},
		{"Service", "StandardError", "append:" + dir + "/node.log"},
		{"Service", "WorkingDirectory", dir + "/my data"},
		{"Install", "WantedBy", "default.target"},
	} {
		if got := secs[want.sec][want.key]; len(got) != 1 || got[0] != want.val {
			t.Errorf("[%s] %s = %q, want %q", want.sec, want.key, got, want.val)
		}
	}
	if len(secs["Unit"]["Description"]) != 1 {
		t.Error("no Description")
	}

	// systemd's own check, where systemd-analyze is installed. It needs a
	// runtime directory for the user manager it loads the unit into.
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: the unit is checked by its structure only")
	}
	f := filepath.Join(dir, ServiceLabel+".service")
	if err := os.WriteFile(f, []byte(unit), 0o600); err != nil {
		t.Fatal(err)
	}
	rt := t.TempDir()
	os.Chmod(rt, 0o700)
	verify := func(path string) (string, error) {
		cmd := exec.Command(analyze, "verify", "--user", path)
		cmd.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+rt, "SYSTEMD_LOG_COLOR=0")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := verify(f); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("systemd-analyze verify: %v\n%s\n%s", err, out, unit)
	}
	// And the check sees a broken unit: it would pass anything otherwise.
	bad := filepath.Join(dir, "bad.service")
	os.WriteFile(bad, []byte(strings.Replace(unit, "Restart=on-failure", "Restart=sometimes", 1)), 0o600)
	if out, _ := verify(bad); !strings.Contains(out, "sometimes") {
		t.Errorf("systemd-analyze verify passed a bad Restart= without a word: %q", out)
	}
}
