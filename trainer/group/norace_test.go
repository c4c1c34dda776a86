//go:build !race

package group_test

const raceEnabled = false
