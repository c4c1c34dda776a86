package core

// ShortHashLen is how many hex digits of a hash are printed.
const ShortHashLen = 12

// ShortHash is a hash as every command and log prints it: its first
// ShortHashLen hex digits ("-" for none). An adapter version's identity is
// its adapter hash (the trainers' canonical hash of the adapter's files,
// committed in raft and carried in the version's manifest), printed under
// the label "hash"; the SHA-256 of the bundle devices fetch, where shown
// as well, is labelled "bundle".
func ShortHash(h string) string {
	if h == "" {
		return "-"
	}
	return h[:min(len(h), ShortHashLen)]
}
