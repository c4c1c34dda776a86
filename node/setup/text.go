package setup

import (
	"fmt"
	"strconv"
	"strings"
)

// SetTOMLKeys returns a TOML file's text with top-level string keys set:
// an existing `key = ...` line (before the first table) has its value
// replaced, other keys are added after the last top-level key, or at the
// top; comments and every other line stay. keys gives the order of
// addition.
func SetTOMLKeys(src string, keys []string, values map[string]string) string {
	lines := strings.Split(src, "\n")
	end := len(lines) // the first table header, where top-level keys stop
	for i, l := range lines {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "[") {
			end = i
			break
		}
	}
	lastKey := -1
	for i := 0; i < end; i++ {
		t := strings.TrimSpace(lines[i])
		if t != "" && !strings.HasPrefix(t, "#") {
			lastKey = i
		}
	}
	for _, k := range keys {
		v := k + " = " + strconv.Quote(values[k])
		found := false
		for i := 0; i < end; i++ {
			name, _, ok := strings.Cut(strings.TrimSpace(lines[i]), "=")
			if ok && strings.Trim(strings.TrimSpace(name), `"'`) == k {
				lines[i] = v
				found = true
			}
		}
		if found {
			continue
		}
		at := lastKey + 1
		lines = append(lines[:at], append([]string{v}, lines[at:]...)...)
		lastKey, end = at, end+1
	}
	out := strings.Join(lines, "\n")
	if !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}

// Diff is a unified diff of two texts (line by line, three lines of
// context), "" when they are the same.
func Diff(aName, bName, a, b string) string {
	if a == b {
		return ""
	}
	al, bl := splitLines(a), splitLines(b)
	// Longest common subsequence; config files are small.
	n, m := len(al), len(bl)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if al[i] == bl[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type op struct {
		kind byte // ' ', '-', '+'
		text string
		ai   int
		bi   int
	}
	var ops []op
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && al[i] == bl[j]:
			ops = append(ops, op{' ', al[i], i, j})
			i, j = i+1, j+1
		case j < m && (i == n || lcs[i][j+1] > lcs[i+1][j]):
			ops = append(ops, op{'+', bl[j], i, j})
			j++
		default:
			ops = append(ops, op{'-', al[i], i, j})
			i++
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "--- %s\n+++ %s\n", aName, bName)
	const ctx = 3
	for k := 0; k < len(ops); {
		if ops[k].kind == ' ' {
			k++
			continue
		}
		// A hunk: from ctx lines before this change to ctx after the
		// last change within 2*ctx of the previous.
		start := max(0, k-ctx)
		end := k
		for end < len(ops) {
			if ops[end].kind != ' ' {
				end++
				continue
			}
			run := end
			for run < len(ops) && ops[run].kind == ' ' {
				run++
			}
			if run == len(ops) || run-end > 2*ctx {
				end = min(end+ctx, len(ops))
				break
			}
			end = run
		}
		var na, nb int
		for _, o := range ops[start:end] {
			if o.kind != '+' {
				na++
			}
			if o.kind != '-' {
				nb++
			}
		}
		fmt.Fprintf(&sb, "@@ -%d,%d +%d,%d @@\n", ops[start].ai+1, na, ops[start].bi+1, nb)
		for _, o := range ops[start:end] {
			sb.WriteByte(o.kind)
			sb.WriteString(o.text)
			sb.WriteByte('\n')
		}
		k = end
	}
	return sb.String()
}

func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}
