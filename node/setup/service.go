package setup

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"strings"
)

// Service is what a service manager runs at login: the clawmesh binary with
// its arguments, and the file its output goes to.
type Service struct {
	// Label names the job (launchd's Label, systemd's unit name without
	// .service).
	Label string
	// Program is the binary's absolute path; Args what follows it.
	Program string
	Args    []string
	// LogFile receives the node's standard output and error.
	LogFile string
	// Dir is the working directory ("" for the manager's default).
	Dir string
}

// ServiceLabel is the job's name under both managers.
const ServiceLabel = "dev.clawmesh.node"

// LaunchdPlist is a launchd agent (~/Library/LaunchAgents/LABEL.plist) that
// starts the node at login (RunAtLoad), starts it again when it exits with
// a failure (KeepAlive: SuccessfulExit false), at most every 10 seconds,
// and appends its output to the log file.
func LaunchdPlist(s Service) []byte {
	var b bytes.Buffer
	esc := func(v string) string {
		var e bytes.Buffer
		xml.EscapeText(&e, []byte(v))
		return e.String()
	}
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
`)
	fmt.Fprintf(&b, "\t<key>Label</key>\n\t<string>%s</string>\n", esc(s.Label))
	b.WriteString("\t<key>ProgramArguments</key>\n\t<array>\n")
	for _, a := range append([]string{s.Program}, s.Args...) {
		fmt.Fprintf(&b, "\t\t<string>%s</string>\n", esc(a))
	}
	b.WriteString("\t</array>\n")
	b.WriteString("\t<key>RunAtLoad</key>\n\t<true/>\n")
	b.WriteString("\t<key>KeepAlive</key>\n\t<dict>\n\t\t<key>SuccessfulExit</key>\n\t\t<false/>\n\t</dict>\n")
	b.WriteString("\t<key>ThrottleInterval</key>\n\t<integer>10</integer>\n")
	b.WriteString("\t<key>ProcessType</key>\n\t<string>Background</string>\n")
	if s.Dir != "" {
		fmt.Fprintf(&b, "\t<key>WorkingDirectory</key>\n\t<string>%s</string>\n", esc(s.Dir))
	}
	fmt.Fprintf(&b, "\t<key>StandardOutPath</key>\n\t<string>%s</string>\n", esc(s.LogFile))
	fmt.Fprintf(&b, "\t<key>StandardErrorPath</key>\n\t<string>%s</string>\n", esc(s.LogFile))
	b.WriteString("</dict>\n</plist>\n")
	return b.Bytes()
}

// SystemdUnit is a systemd user unit (~/.config/systemd/user/LABEL.service)
// that starts the node at login (WantedBy=default.target), starts it again
// when it fails (Restart=on-failure), gives it time to drain on stop, and
// appends its output to the log file.
func SystemdUnit(s Service) string {
	var b strings.Builder
	b.WriteString("[Unit]\n")
	b.WriteString("Description=clawmesh node: the gateway the agent calls, recording into the DataPool\n")
	b.WriteString("Documentation=https://github.com/clawmesh/clawmesh\n")
	b.WriteString("After=network.target\n\n")
	b.WriteString("[Service]\n")
	b.WriteString("Type=simple\n")
	args := []string{systemdQuote(s.Program)}
	for _, a := range s.Args {
		args = append(args, systemdQuote(a))
	}
	fmt.Fprintf(&b, "ExecStart=%s\n", strings.Join(args, " "))
	if s.Dir != "" {
		fmt.Fprintf(&b, "WorkingDirectory=%s\n", systemdEscape(s.Dir))
	}
	b.WriteString("Restart=on-failure\n")
	b.WriteString("RestartSec=5\n")
	b.WriteString("KillSignal=SIGTERM\n")
	b.WriteString("TimeoutStopSec=90\n")
	fmt.Fprintf(&b, "StandardOutput=append:%s\n", systemdEscape(s.LogFile))
	fmt.Fprintf(&b, "StandardError=append:%s\n\n", systemdEscape(s.LogFile))
	b.WriteString("[Install]\n")
	b.WriteString("WantedBy=default.target\n")
	return b.String()
}

// systemdEscape escapes systemd's specifiers (%).
func systemdEscape(s string) string { return strings.ReplaceAll(s, "%", "%%") }

// systemdQuote quotes one word of an ExecStart line: specifiers (%) and
// variable references ($) escaped, and double quotes where it holds
// spaces, quotes or backslashes.
func systemdQuote(s string) string {
	s = strings.ReplaceAll(systemdEscape(s), "$", "$$")
	if s != "" && !strings.ContainsAny(s, " \t\"'\\;") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// InstalledDir reads back the working directory of a service file written
// by LaunchdPlist or SystemdUnit (install makes it the node's data
// directory); "" if it names none.
func InstalledDir(content []byte) string {
	if bytes.Contains(content, []byte("<plist")) {
		d := xml.NewDecoder(bytes.NewReader(content))
		var (
			elem, text string
			next       bool // the last key was WorkingDirectory
		)
		for {
			tok, err := d.Token()
			if err != nil {
				return ""
			}
			switch tok := tok.(type) {
			case xml.StartElement:
				elem, text = tok.Name.Local, ""
			case xml.CharData:
				text += string(tok)
			case xml.EndElement:
				switch {
				case tok.Name.Local == "key":
					next = text == "WorkingDirectory"
				case next && tok.Name.Local == "string" && elem == "string":
					return text
				default:
					next = false
				}
				elem = ""
			}
		}
	}
	for line := range strings.Lines(string(content)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "WorkingDirectory="); ok {
			return strings.ReplaceAll(v, "%%", "%")
		}
	}
	return ""
}
