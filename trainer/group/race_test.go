//go:build race

package group_test

// raceEnabled: the race detector slows the property test down tenfold; it
// runs fewer seeds under it.
const raceEnabled = true
