package sim

// Run runs the scenario o names and reports what it found. The same
// options give the same report, byte for byte once encoded.
func Run(o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	orig := o
	o = o.WithDefaults()
	def := DefAll
	w, err := newWorld(orig, def)
	if err != nil {
		return nil, err
	}
	w.run()
	r := w.report()
	if o.Personal > 0 {
		p := w.newPersonalRun(personalDefaults)
		p.run()
		r.Personal = p.report()
	}
	switch o.Scenario {
	case Poison:
		clean := orig
		clean.Malicious, clean.MaliciousTrainers = -1, -1
		runs := []struct {
			o   Options
			def Defences
		}{{clean, DefAll}, {orig, DefNone}, {orig, DefReverify}, {orig, DefQuota}, {orig, DefClip}, {orig, DefTrimmed}}
		for _, x := range runs {
			pw, err := newWorld(x.o, x.def)
			if err != nil {
				return nil, err
			}
			pw.run()
			r.Poison = append(r.Poison, pw.poisonRun())
			if x.o.Malicious < 0 {
				r.Poison[len(r.Poison)-1].Defences = "all (no malicious)"
			}
		}
		r.Poison = append(r.Poison, w.poisonRun())
	case Trust:
		if err := runTrust(orig, w, r); err != nil {
			return nil, err
		}
	case Relays:
		for _, c := range []struct {
			nat    float64
			relays int
		}{{-1, 0}, {0.4, 2}, {0.4, 0}, {0.7, 2}, {0.7, 0}} {
			x := orig
			x.Scenario, x.NATShare, x.Relays = Baseline, c.nat, c.relays
			sw, err := newWorld(x, def)
			if err != nil {
				return nil, err
			}
			sw.run()
			sr := sw.report()
			var reach []float64
			for _, v := range sr.Versions {
				if v.Reach99 >= 0 {
					reach = append(reach, v.Reach99)
				}
			}
			r.Sweep = append(r.Sweep, SweepRow{NATShare: max(0, sw.o.NATShare), Relays: len(sw.relays), HolePunch: sr.Options.HolePunch, MedianReach99: round3(median(reach)),
				MedianRatio99: sr.Propagation.MedianRatio99, RelayedMiB: sr.Bytes.RelayedMiB, Converged: sr.Invariants.OK,
				Reserved: sr.Network.Reserved, NATPairs: sr.Network.NATPairs, Punched: sr.Network.Punched})
		}
	}
	return r, nil
}

func (w *world) poisonRun() PoisonRun {
	p := PoisonRun{Defences: w.def.Name, Malicious: max(0, w.o.Malicious), Scores: w.scores, IntakeRefused: w.intake[oversized] + w.intake[malformed]}
	if w.o.Scenario != Poison {
		p.Malicious = 0
	}
	for i := range p.Scores {
		p.Scores[i] = round3(p.Scores[i])
	}
	if p.Scores == nil {
		p.Scores = []float64{}
	}
	if n := len(p.Scores); n > 0 {
		p.Final = p.Scores[n-1]
	}
	p.Refused = w.trainers[0].st.Refusals["verify"]
	return p
}
