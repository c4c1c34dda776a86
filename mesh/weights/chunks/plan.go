package chunks

import (
	"fmt"
	"maps"
	"slices"

	"github.com/clawmesh/clawmesh/mesh"
)

// MaxPerRequest bounds the chunks one request asks a source for: the
// limit of the weights protocol's chunks request, which a Plan never
// exceeds.
const MaxPerRequest = 64

// Plan is the part of a fetch that decides, with no I/O and no clock,
// which chunks to ask of which source: the chunks still missing, those on
// their way, the sources in use and those left, and the chunks each source
// sent wrong. A weights.Fetcher runs one per fetch under its lock; the
// simulator (package sim) runs the same for each of its devices' fetches.
// A Plan is not safe for concurrent use.
type Plan struct {
	perRequest, maxStrikes int

	pending  []int // chunks nobody is fetching, in order
	inflight int
	bad      map[int]map[mesh.PeerID]bool // chunk → sources that sent it wrong
	strikes  map[mesh.PeerID]int
	live     map[mesh.PeerID]bool
	order    map[mesh.PeerID]int // each source's place, in the order added
	left     map[mesh.PeerID]string
}

// NewPlan plans the fetch of the missing chunks (their indices, in
// order), asking for up to perRequest chunks at once and leaving a source
// after maxStrikes bad chunks (8 and 2, the defaults of
// weights.FetcherConfig, where not positive).
func NewPlan(missing []int, perRequest, maxStrikes int) *Plan {
	if perRequest <= 0 || perRequest > MaxPerRequest {
		perRequest = 8
	}
	if maxStrikes <= 0 {
		maxStrikes = 2
	}
	return &Plan{perRequest: perRequest, maxStrikes: maxStrikes, pending: slices.Clone(missing),
		bad: map[int]map[mesh.PeerID]bool{}, strikes: map[mesh.PeerID]int{},
		live: map[mesh.PeerID]bool{}, order: map[mesh.PeerID]int{}, left: map[mesh.PeerID]string{}}
}

// Add makes p a source. It reports false for a source added before,
// whether still in use or left.
func (pl *Plan) Add(p mesh.PeerID) bool {
	if _, ok := pl.order[p]; ok {
		return false
	}
	pl.order[p] = len(pl.order)
	pl.live[p] = true
	return true
}

// Take hands source p up to perRequest consecutive missing chunks it has
// not sent wrong, and counts them on their way. Each source starts at its
// own share of the missing chunks, so that all of them are busy from the
// start. It returns nil when there is none for p now, or p is not in use.
func (pl *Plan) Take(p mesh.PeerID) []int {
	if !pl.live[p] || len(pl.pending) == 0 {
		return nil
	}
	start := pl.order[p] * len(pl.pending) / max(len(pl.order), 1)
	got := pl.run(p, start, len(pl.pending))
	if len(got) == 0 && start > 0 {
		got = pl.run(p, 0, start)
	}
	if len(got) == 0 {
		return nil
	}
	pl.pending = slices.DeleteFunc(pl.pending, func(i int) bool { return i >= got[0] && i <= got[len(got)-1] })
	pl.inflight += len(got)
	return got
}

// run is the first run of consecutive chunks p may send among
// pending[from:to].
func (pl *Plan) run(p mesh.PeerID, from, to int) []int {
	var got []int
	for k := from; k < to && len(got) < pl.perRequest; k++ {
		i := pl.pending[k]
		if pl.bad[i][p] || (len(got) > 0 && i != got[len(got)-1]+1) {
			if len(got) > 0 {
				break
			}
			continue
		}
		got = append(got, i)
	}
	return got
}

// Got counts one chunk of a request in: verified and written.
func (pl *Plan) Got() { pl.inflight-- }

// Settle ends a request of source p: the chunks of it not got (rest) go
// back to the missing; badChunk (−1: none) is one p sent wrong, which it
// is not asked for again; p is left if leave is not nil, or after
// maxStrikes bad chunks. It returns why p was left now ("" if it was not).
func (pl *Plan) Settle(p mesh.PeerID, rest []int, badChunk int, leave error) string {
	pl.inflight -= len(rest)
	if len(rest) > 0 {
		pl.pending = append(pl.pending, rest...)
		slices.Sort(pl.pending)
	}
	if badChunk >= 0 {
		if pl.bad[badChunk] == nil {
			pl.bad[badChunk] = map[mesh.PeerID]bool{}
		}
		pl.bad[badChunk][p] = true
		pl.strikes[p]++
		if pl.strikes[p] >= pl.maxStrikes && leave == nil {
			leave = fmt.Errorf("%d bad chunks", pl.strikes[p])
		}
	}
	if leave == nil || !pl.live[p] {
		return ""
	}
	delete(pl.live, p)
	pl.left[p] = leave.Error()
	return pl.left[p]
}

// Live reports whether source p is in use.
func (pl *Plan) Live(p mesh.PeerID) bool { return pl.live[p] }

// Sources is how many sources are in use.
func (pl *Plan) Sources() int { return len(pl.live) }

// Missing is how many chunks nobody is fetching; Inflight how many are on
// their way.
func (pl *Plan) Missing() int  { return len(pl.pending) }
func (pl *Plan) Inflight() int { return pl.inflight }

// Over reports a fetch with nothing missing and nothing on its way.
func (pl *Plan) Over() bool { return len(pl.pending) == 0 && pl.inflight == 0 }

// Stuck reports a fetch no source in use can finish: chunks missing,
// none on their way, and every missing chunk sent wrong by every source
// in use (or none in use).
func (pl *Plan) Stuck() bool {
	if len(pl.pending) == 0 || pl.inflight > 0 {
		return false
	}
	for p := range pl.live {
		for _, i := range pl.pending {
			if !pl.bad[i][p] {
				return false
			}
		}
	}
	return true
}

// Left returns the sources left and why (nil if none).
func (pl *Plan) Left() map[mesh.PeerID]string {
	if len(pl.left) == 0 {
		return nil
	}
	return maps.Clone(pl.left)
}
