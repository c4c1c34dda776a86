// Command hostile is a reward plugin that misbehaves on request, for the
// runner's containment tests. The last user message of the context picks
// the behaviour.
package main

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	rewards "github.com/clawmesh/clawmesh/wasm-rewards"
)

func init() { rewards.Register(score) }

func main() {}

var sink [][]byte

func score(in *rewards.Input) rewards.Result {
	switch mode := in.LastUser(); mode {
	case "ok":
		return rewards.Score(0.25).WithLabels("ok")
	case "spin":
		n := 0
		for {
			n++
		}
	case "oom":
		for {
			sink = append(sink, make([]byte, 1<<20))
		}
	case "exit":
		os.Exit(3)
	case "fatal":
		done := make(chan bool)
		go func() { panic("boom in a goroutine") }()
		<-done
	case "panic":
		var m map[string]int
		m["x"] = 1
	case "escape":
		var errs []string
		for _, p := range []string{"/etc/passwd", "/", ".", "/proc/self/environ"} {
			if b, err := os.ReadFile(p); err == nil {
				return rewards.Score(1).WithReason(fmt.Sprintf("read %s: %d bytes", p, len(b)))
			} else {
				errs = append(errs, err.Error())
			}
			if f, err := os.Create(p + ".clawmesh-test"); err == nil {
				f.Close()
				return rewards.Score(1).WithReason("created a file under " + p)
			}
		}
		if len(os.Environ()) > 0 || len(os.Args) > 1 {
			return rewards.Score(1).WithReason(fmt.Sprintf("env %v args %v", os.Environ(), os.Args))
		}
		return rewards.Abstain("contained: " + strings.Join(errs, "; "))
	case "clock":
		b := make([]byte, 16)
		crand.Read(b)
		return rewards.Abstain("clock").WithLabels(
			fmt.Sprint(time.Now().UnixNano()),
			time.Now().UTC().Format(time.RFC3339Nano),
			hex.EncodeToString(b),
		)
	case "mathrand":
		return rewards.Abstain("mathrand").WithLabels(fmt.Sprint(rand.Uint64()))
	case "counter":
		sink = append(sink, nil)
		return rewards.Abstain("counter").WithLabels(fmt.Sprint(len(sink)))
	case "chatty":
		line := strings.Repeat("x", 1023) + "\n"
		for i := 0; i < 10_000; i++ {
			fmt.Print(line)
		}
		rewards.Log(strings.Repeat("y", 1<<20))
		return rewards.Score(-0.25)
	case "nan":
		return rewards.Score(2)
	}
	return rewards.Abstain("unknown mode")
}
