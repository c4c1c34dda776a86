// Package layout keeps clawmesh's import graph as docs/design.md draws it.
// It has no code: its test reads the graph with `go list` and fails on any
// import that crosses a rule (see layout_test.go for the rules, each with
// the reason it holds).
package layout
