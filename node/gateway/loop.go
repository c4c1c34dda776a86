package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"time"
)

// A gateway whose upstream leads back to itself, directly (its own
// address as --upstream) or through other gateways, would forward one
// call round and round, each pass a recorded failure, until it runs out
// of file descriptors. Every call a gateway forwards carries, in
// HopHeader, the ids of the gateways it went through, its own last; a
// gateway refuses a call that already names it (or has been through
// maxHops gateways) with 508 Loop Detected, records nothing of it, and
// names itself in LoopHeader; a gateway that gets such a refusal from
// its upstream passes it on and records nothing either.
const (
	// HopHeader lists the gateways a call went through, comma-separated.
	HopHeader = "X-Clawmesh-Hop"
	// LoopHeader, on a 508 reply, names the gateway that found itself
	// in HopHeader.
	LoopHeader = "X-Clawmesh-Loop"
	// maxHops bounds the gateways one call may go through.
	maxHops = 16
)

// newHopID is a gateway's id in HopHeader: random, unique to it.
func newHopID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// looped reports whether the call h carries has been through this gateway
// already, or through too many.
func (g *Gateway) looped(h http.Header) bool {
	n := 0
	for _, v := range h.Values(HopHeader) {
		for id := range strings.SplitSeq(v, ",") {
			if strings.TrimSpace(id) == g.cfg.HopID {
				return true
			}
			n++
		}
	}
	return n >= maxHops
}

// addHop adds this gateway to the hops of h, a call it forwards.
func (g *Gateway) addHop(h http.Header) {
	hops := h.Values(HopHeader)
	h.Set(HopHeader, strings.Join(append(hops, g.cfg.HopID), ", "))
}

// refuseLoop answers a call that came round a loop of gateways.
func (g *Gateway) refuseLoop(w http.ResponseWriter, anthropic bool, rt route) {
	g.loops.Add(1)
	if now := g.cfg.Now().UnixNano(); now-g.loopWarned.Load() >= int64(time.Minute) {
		g.loopWarned.Store(now)
		g.log.Warn("refused a call that came back to this gateway: its upstream leads to itself; point the upstream at the LLM server",
			"path", rt.rest, "upstream", g.cfg.Upstream, "loops_total", g.loops.Load())
	}
	w.Header().Set(LoopHeader, g.cfg.HopID)
	writeError(w, anthropic, http.StatusLoopDetected, "api_error", "loop_detected",
		"the call came back to the clawmesh gateway that forwarded it: the gateway's upstream ("+g.cfg.Upstream+") leads to the gateway itself; point it at the LLM server")
}

// loopRefusal reports whether resp is another gateway's (or this one's)
// refusal of a call that came round a loop.
func loopRefusal(resp *http.Response) bool {
	return resp.StatusCode == http.StatusLoopDetected && resp.Header.Get(LoopHeader) != ""
}
