package peer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
)

// Status is a peer's membership, as `clawmesh mesh status --json` prints
// it. The field names are a stable contract.
type Status struct {
	MeshID      string    `json:"mesh_id"`
	Name        string    `json:"name,omitempty"`
	PeerID      string    `json:"peer_id"`
	Role        string    `json:"role"`
	MayInvite   bool      `json:"may_invite"`
	Admin       bool      `json:"admin"` // this device holds the admin key
	CertExpires time.Time `json:"cert_expires"`
	Addrs       []string  `json:"addrs"`
	Running     bool      `json:"running"`
	Connected   int       `json:"connected"`
	Admitted    int       `json:"admitted"`
	Revocations int       `json:"revocations"`
	// Revoked is set once this peer knows it was removed from the mesh:
	// by whom (RevokedBy: "the mesh admin" or "its inviter PEER"), when
	// and why.
	Revoked       bool      `json:"revoked"`
	RevokedBy     string    `json:"revoked_by,omitempty"`
	RevokedAt     time.Time `json:"revoked_at,omitzero"`
	RevokedReason string    `json:"revoked_reason,omitempty"`
	// Voters are the trainers the mesh's admin trusts to vote and to
	// certify versions (peer ids, sorted), as the voter set numbered
	// VoterSetSeq says (0: none known; no version can be certified).
	// Volunteer is set on a trainer that is not one of them.
	Voters      []string `json:"voters"`
	VoterSetSeq uint64   `json:"voter_set_seq"`
	Volunteer   bool     `json:"volunteer,omitempty"`
}

// PeerInfo is one admitted peer, as `clawmesh mesh peers --json` prints it.
type PeerInfo struct {
	PeerID    string    `json:"peer_id"`
	Role      string    `json:"role"`
	MayInvite bool      `json:"may_invite"`
	Since     time.Time `json:"since"`
	// Voter and Volunteer: a trainer the voter set names, or one it does
	// not.
	Voter     bool `json:"voter,omitempty"`
	Volunteer bool `json:"volunteer,omitempty"`
}

// BatchInfo is one batch, as `clawmesh mesh batches --json` prints it: a
// node's outbox batch (Created, Shipped) or a trainer's stored one
// (Received).
type BatchInfo struct {
	ID       core.BatchID `json:"id"`
	Size     int64        `json:"size"`
	Steps    int          `json:"steps"`
	Sessions int          `json:"sessions,omitempty"`
	Created  time.Time    `json:"created,omitzero"`
	Shipped  time.Time    `json:"shipped,omitzero"`
	Received time.Time    `json:"received,omitzero"`
	// NextAnnounce is when a running node announces an unshipped batch
	// to the mesh again.
	NextAnnounce time.Time `json:"next_announce,omitzero"`
	// Blocked says why an unshipped batch will not ship (this device was
	// removed from the mesh).
	Blocked string `json:"blocked,omitempty"`
}

// Unshipped reports an outbox batch no trainer has acked.
func (b BatchInfo) Unshipped() bool { return b.Shipped.IsZero() && b.Received.IsZero() }

// Annotate says, on each unshipped batch of l, why it will not ship if st
// says this peer was removed from the mesh, else when it is announced next
// (next, if not nil, tells).
func Annotate(l []BatchInfo, st Status, next func(core.BatchID) (time.Time, bool)) {
	for i := range l {
		if !l[i].Unshipped() {
			continue
		}
		if st.Revoked {
			l[i].Blocked = "this device was removed from the mesh by " + st.RevokedBy
			continue
		}
		if next != nil {
			if t, ok := next(l[i].ID); ok {
				l[i].NextAnnounce = t.UTC()
			}
		}
	}
}

// StatusOf is the running peer's status.
func StatusOf(p *Peer) Status {
	st := offline(p.Mesh.State(), p.Mesh.Cert(), p.Mesh.IsAdmin(), len(p.Mesh.Revocations()), p.Mesh.Revoked())
	withVoters(&st, p.Mesh.Voters())
	st.Running = true
	st.Addrs = p.Host.Addrs()
	st.Connected = len(p.Host.Connected())
	st.Admitted = len(p.Mesh.Peers())
	return st
}

// OfflineStatus is the status of a data directory no peer runs on.
func OfflineStatus(dataDir string) (Status, error) {
	s, err := mesh.LoadState(dataDir)
	if err != nil {
		return Status{}, err
	}
	cert, _ := s.Certificate()
	admin, _ := s.AdminKey()
	_, aerr := mesh.LoadAdminKey(dataDir)
	revs, err := mesh.LoadRevocations(dataDir, admin)
	if err != nil {
		return Status{}, err
	}
	vs, err := mesh.LoadVoters(dataDir, admin)
	if err != nil {
		return Status{}, err
	}
	st := offline(*s, cert, aerr == nil, revs.Len(), revs.RevocationOf(cert))
	withVoters(&st, vs)
	return st, nil
}

// withVoters fills in the voters of vs (nil: none known).
func withVoters(st *Status, vs *member.VoterSet) {
	st.Voters = []string{}
	if vs != nil {
		for _, v := range vs.Voters() {
			st.Voters = append(st.Voters, v.Peer)
		}
		st.VoterSetSeq = vs.Seq()
	}
	st.Volunteer = st.Role == member.RoleTrainer.String() && (vs == nil || !vs.Has(st.PeerID))
}

func offline(s mesh.State, cert *member.Certificate, admin bool, revs int, revoked *member.Revocation) Status {
	st := Status{
		MeshID: s.MeshID, Name: s.Name, PeerID: cert.Subject(), Role: cert.Role().String(), MayInvite: cert.MayInvite(),
		Admin: admin, CertExpires: cert.Expires().UTC(), Addrs: s.Addrs, Revocations: revs,
	}
	if r := revoked; r != nil {
		st.Revoked, st.RevokedBy, st.RevokedAt, st.RevokedReason = true, mesh.RevokedBy(r), r.RevokedAt().UTC(), r.Reason()
	}
	return st
}

// Batches lists batches for the admin API.
type Batches interface {
	List(ctx context.Context) ([]BatchInfo, error)
	// Get returns one batch decoded, or an error wrapping mesh.ErrNoBatch.
	Get(ctx context.Context, id core.BatchID) (*batch.Batch, error)
}

// AdminPrefix is where Handler serves, on the loopback admin listener of a
// node (its gateway) or a trainer:
//
//	GET  /clawmesh/v1/mesh/status        Status
//	GET  /clawmesh/v1/mesh/peers         []PeerInfo
//	GET  /clawmesh/v1/mesh/batches       []BatchInfo
//	GET  /clawmesh/v1/mesh/batches/{id}  the batch's steps as JSONL
//	POST /clawmesh/v1/mesh/revoke        {"peer", "reason", "force"} → RevokeResult
//	POST /clawmesh/v1/mesh/trust         {"peer"} → VotersResult (the admin's device only)
//	POST /clawmesh/v1/mesh/untrust       {"peer"} → VotersResult (the admin's device only)
const AdminPrefix = "/clawmesh/v1/mesh/"

// Handler serves the admin API of a running peer.
func Handler(p *Peer, b Batches) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+AdminPrefix+"status", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, StatusOf(p), nil)
	})
	mux.HandleFunc("GET "+AdminPrefix+"peers", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, peersOf(p), nil)
	})
	mux.HandleFunc("GET "+AdminPrefix+"batches", func(w http.ResponseWriter, r *http.Request) {
		l, err := b.List(r.Context())
		Annotate(l, StatusOf(p), p.Mesh.NextAnnounce)
		writeJSON(w, l, err)
	})
	mux.HandleFunc("GET "+AdminPrefix+"batches/{id}", func(w http.ResponseWriter, r *http.Request) {
		bt, err := b.Get(r.Context(), core.BatchID(r.PathValue("id")))
		if err != nil {
			writeJSON(w, nil, err)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		WriteSteps(w, bt)
	})
	mux.HandleFunc("POST "+AdminPrefix+"revoke", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Peer   string `json:"peer"`
			Reason string `json:"reason"`
			Force  bool   `json:"force"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil || req.Peer == "" {
			writeErr(w, http.StatusBadRequest, fmt.Errorf("want {\"peer\": ID, \"reason\": TEXT, \"force\": BOOL}"))
			return
		}
		rv, err := p.Mesh.Revoke(r.Context(), mesh.PeerID(req.Peer), mesh.RevokeOptions{Reason: req.Reason, Force: req.Force})
		switch {
		case errors.Is(err, mesh.ErrAlreadyRevoked):
			writeJSON(w, resultOf(rv, true), nil)
		case errors.Is(err, mesh.ErrBadPeerID):
			writeErr(w, http.StatusBadRequest, err)
		case err != nil:
			writeJSON(w, nil, err)
		default:
			writeJSON(w, resultOf(rv, false), nil)
		}
	})
	for _, path := range []string{"trust", "untrust"} {
		mux.HandleFunc("POST "+AdminPrefix+path, func(w http.ResponseWriter, r *http.Request) {
			var req struct {
				Peer string `json:"peer"`
			}
			if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil || req.Peer == "" {
				writeErr(w, http.StatusBadRequest, fmt.Errorf("want {\"peer\": ID}"))
				return
			}
			do, unchanged := p.Mesh.TrustVoter, mesh.ErrAlreadyVoter
			if path == "untrust" {
				do, unchanged = p.Mesh.UntrustVoter, mesh.ErrNotVoter
			}
			vs, err := do(r.Context(), mesh.PeerID(req.Peer))
			switch {
			case errors.Is(err, unchanged):
				writeJSON(w, votersOf(p.Mesh.Voters(), true), nil)
			case errors.Is(err, mesh.ErrBadPeerID):
				writeErr(w, http.StatusBadRequest, err)
			case err != nil:
				writeJSON(w, nil, err)
			default:
				writeJSON(w, votersOf(vs, false), nil)
			}
		})
	}
	return mux
}

// VotersResult is the admin API's answer to a trust or untrust: the
// voters now, and the number of their set; Unchanged when the peer was a
// voter already (trust) or none (untrust), and nothing was done.
type VotersResult struct {
	Voters    []string `json:"voters"`
	Seq       uint64   `json:"seq"`
	Unchanged bool     `json:"unchanged,omitempty"`
}

func votersOf(vs *member.VoterSet, unchanged bool) VotersResult {
	var st Status
	withVoters(&st, vs)
	return VotersResult{Voters: st.Voters, Seq: st.VoterSetSeq, Unchanged: unchanged}
}

// RevokeResult is the admin API's answer to a revocation: the revoked
// peer, and, when it was revoked already (and nothing was done), by whom,
// when and why.
type RevokeResult struct {
	Revoked string    `json:"revoked"`
	Already bool      `json:"already,omitempty"`
	By      string    `json:"by,omitempty"`
	At      time.Time `json:"at,omitzero"`
	Reason  string    `json:"reason,omitempty"`
}

func resultOf(r *member.Revocation, already bool) RevokeResult {
	res := RevokeResult{Revoked: r.Subject(), Already: already}
	if already {
		res.By, res.At, res.Reason = mesh.RevokedBy(r), r.RevokedAt().UTC(), r.Reason()
	}
	return res
}

func peersOf(p *Peer) []PeerInfo {
	out := []PeerInfo{}
	vs := p.Mesh.Voters()
	for _, pe := range p.Mesh.Peers() {
		pi := PeerInfo{PeerID: string(pe.ID), Role: pe.Cert.Role().String(), MayInvite: pe.Cert.MayInvite(), Since: pe.Since.UTC()}
		if pe.Cert.Role() == member.RoleTrainer {
			pi.Voter = vs != nil && vs.Has(pi.PeerID)
			pi.Volunteer = !pi.Voter
		}
		out = append(out, pi)
	}
	return out
}

// WriteSteps writes a batch's steps as JSONL (the `pool export` schema).
func WriteSteps(w io.Writer, b *batch.Batch) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, s := range b.Steps {
		if err := enc.Encode(core.ExportedStep{Schema: core.SchemaVersion, Step: *s}); err != nil {
			return err
		}
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any, err error) {
	if err != nil {
		code := http.StatusInternalServerError
		switch {
		case errors.Is(err, mesh.ErrNoBatch):
			code = http.StatusNotFound
		case errors.Is(err, member.ErrNotAllowed):
			code = http.StatusForbidden
		case errors.Is(err, mesh.ErrUnknownPeer), errors.Is(err, mesh.ErrNotTrainer), errors.Is(err, member.ErrRevoked):
			code = http.StatusConflict
		}
		writeErr(w, code, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, err error) { adminapi.WriteError(w, code, err) }

// Client reaches a running peer's admin API.
type Client struct {
	Base  string // http://127.0.0.1:PORT
	Token string
	HTTP  *http.Client
}

func (c *Client) do(ctx context.Context, method, path string, body io.Reader) (*http.Response, error) {
	resp, err := adminapi.Do(ctx, c.HTTP, method, strings.TrimSuffix(c.Base, "/")+AdminPrefix+path, c.Token, body)
	var se *adminapi.StatusError
	if errors.As(err, &se) {
		if se.Code == http.StatusNotFound && !se.Plain {
			return nil, fmt.Errorf("%w: %s", mesh.ErrNoBatch, se.Message)
		}
		return nil, errors.New(se.Error())
	}
	return resp, err
}

func (c *Client) get(ctx context.Context, path string, v any) error {
	resp, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// Status returns the running peer's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.get(ctx, "status", &s)
	return s, err
}

// Peers returns the admitted peers.
func (c *Client) Peers(ctx context.Context) ([]PeerInfo, error) {
	var p []PeerInfo
	err := c.get(ctx, "peers", &p)
	return p, err
}

// Batches returns the peer's batches.
func (c *Client) Batches(ctx context.Context) ([]BatchInfo, error) {
	var b []BatchInfo
	err := c.get(ctx, "batches", &b)
	return b, err
}

// Batch copies one batch's steps, as JSONL, to w.
func (c *Client) Batch(ctx context.Context, id core.BatchID, w io.Writer) error {
	resp, err := c.do(ctx, http.MethodGet, "batches/"+url.PathEscape(string(id)), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}

// Revoke asks the running peer to revoke a peer it knows.
func (c *Client) Revoke(ctx context.Context, p mesh.PeerID, reason string) error {
	_, err := c.RevokeWith(ctx, p, mesh.RevokeOptions{Reason: reason})
	return err
}

// RevokeWith asks the running peer to revoke a peer; the result says
// whether it was revoked already.
func (c *Client) RevokeWith(ctx context.Context, p mesh.PeerID, o mesh.RevokeOptions) (RevokeResult, error) {
	var res RevokeResult
	b, _ := json.Marshal(map[string]any{"peer": string(p), "reason": o.Reason, "force": o.Force})
	resp, err := c.do(ctx, http.MethodPost, "revoke", strings.NewReader(string(b)))
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&res)
	return res, err
}

// Trust asks the running peer (the admin's device) to make a trainer a
// voter; the result says whether it was one already.
func (c *Client) Trust(ctx context.Context, p mesh.PeerID) (VotersResult, error) {
	return c.voters(ctx, "trust", p)
}

// Untrust asks the running peer (the admin's device) to make a voter a
// volunteer; the result says whether it was no voter already.
func (c *Client) Untrust(ctx context.Context, p mesh.PeerID) (VotersResult, error) {
	return c.voters(ctx, "untrust", p)
}

func (c *Client) voters(ctx context.Context, path string, p mesh.PeerID) (VotersResult, error) {
	var res VotersResult
	b, _ := json.Marshal(map[string]any{"peer": string(p)})
	resp, err := c.do(ctx, http.MethodPost, path, strings.NewReader(string(b)))
	if err != nil {
		return res, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&res)
	return res, err
}
