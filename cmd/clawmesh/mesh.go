package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/clawmesh/clawmesh/internal/adminapi"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
	"github.com/clawmesh/clawmesh/mesh/p2p"
	"github.com/clawmesh/clawmesh/mesh/peer"
	"github.com/clawmesh/clawmesh/node"
	"github.com/clawmesh/clawmesh/node/share"
	"github.com/clawmesh/clawmesh/pool"
	"github.com/clawmesh/clawmesh/trainer"
	"github.com/clawmesh/clawmesh/trainer/store"
)

const meshHelp = `Usage: clawmesh mesh <init|status|peers|batches|batch|revoke|trust|untrust> [flags]

A mesh is the devices you invite, and the trainers that learn from their
scrubbed batches. One device makes the mesh and holds its admin key; others
join with an invite token.

  clawmesh mesh init [--name home]          make a new mesh; this device holds its admin key
  clawmesh mesh status [--json]             who am I in which mesh, my addresses, how many peers
  clawmesh mesh peers [--json]              the admitted peers connected now, with their roles
  clawmesh mesh batches [--json]            a node's outbox batches (shipped or not), or a
                                            trainer's stored batches
  clawmesh mesh batch ID                    one batch's steps as JSONL, decoded from its bytes
  clawmesh mesh revoke PEER [--reason R]    remove a member: it is disconnected everywhere and
                                            refused from then on (the admin, or its inviter)
  clawmesh mesh trust PEER                  make a trainer a voter (the admin's device only)
  clawmesh mesh untrust PEER                make a voter a volunteer again (the admin's device only)

revoke takes a peer id this device knows: one it admitted or invited. For
another, check the id ('mesh peers' lists the peers connected now) or pass
--force. A peer revoked already is left as it is: revoke says so and exits 0.
A revoked device is told when it next meets a peer: its log and 'mesh
status' say it was removed, by whom and why, and 'mesh batches' that its
batches will not ship. To take part again it needs a new invite, redeemed
from a fresh data directory (its peer id stays refused).

Voters are the trainers the admin trusts: they vote in the trainers' raft
group and certify each adapter version, and devices install only versions a
majority of them certified. Other trainers volunteer: they train and hand
their deltas in, but never vote nor certify. The admin's device signs the
voter set and spreads it across the mesh; 'mesh status' lists the voters.
trust takes a trainer this device admitted or invited; untrusting the last
voter is allowed, but the mesh then certifies no version until one is
trusted. A trainer invited with 'clawmesh invite --role trainer --voter'
is trusted when it joins (the default while the mesh has no voter).

'mesh batches' on a running node says when each unshipped batch is
announced again: at once when a trainer joins, else with backoff (30 s
doubling to 30 min).

See also: clawmesh invite, clawmesh join, clawmesh trainer.

While a node or trainer runs on the data directory, these ask it over its
loopback admin API (DATA/node.addr or DATA/trainer.addr, with --token if the
node needs one); otherwise they read the data directory.
`

func runMesh(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, meshHelp)
		return usageErr("which mesh command? init, status, peers, batches, batch, revoke, trust or untrust")
	}
	sub, args := args[0], args[1:]
	var s settings
	fs := newFlags("mesh "+sub, meshHelp, stderr)
	s.bindClient(fs)
	var asJSON, force bool
	var name, reason string
	switch sub {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, meshHelp)
		return nil
	case "init":
		fs.StringVar(&name, "name", "", "a name for the mesh, shown to those who join")
	case "status", "peers", "batches":
		fs.BoolVar(&asJSON, "json", false, "print JSON (a stable format)")
	case "batch":
	case "revoke":
		fs.StringVar(&reason, "reason", "", "why, kept with the revocation and shown to the revoked device")
		fs.BoolVar(&force, "force", false, "revoke a peer id this device never admitted nor invited")
	case "trust", "untrust":
	default:
		return usageErr("unknown mesh command %q: want init, status, peers, batches, batch, revoke, trust or untrust", sub)
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	want := map[string]int{"init": 0, "status": 0, "peers": 0, "batches": 0, "batch": 1, "revoke": 1, "trust": 1, "untrust": 1}[sub]
	if fs.NArg() != want {
		if want == 1 {
			return usageErr("%s takes one argument", sub)
		}
		return usageErr("%s takes no arguments", sub)
	}
	if sub == "init" || sub == "revoke" || sub == "trust" || sub == "untrust" {
		// They write the directory when nothing runs on it (revoke, trust
		// and untrust go through the running node or trainer otherwise).
		release, err := lockOffline(s.Data, "mesh "+sub, sub == "init")
		if err != nil {
			return err
		}
		defer release()
	}
	if sub == "init" {
		if err := meshInit(s.Data, name, stdout); err != nil {
			return err
		}
		printSharing(stdout, s)
		return nil
	}
	c := runningPeer(&s)
	switch sub {
	case "status":
		var st peer.Status
		var err error
		if c != nil {
			st, err = c.Status(ctx)
		} else {
			st, err = peer.OfflineStatus(s.Data)
		}
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, st)
		}
		printMeshStatus(stdout, st)
		return nil
	case "peers":
		peers := []peer.PeerInfo{}
		if c != nil {
			var err error
			if peers, err = c.Peers(ctx); err != nil {
				return err
			}
		} else if _, err := mesh.LoadState(s.Data); err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, peers)
		}
		if c == nil {
			fmt.Fprintln(stdout, "(no node or trainer runs on this data directory: no peer is connected)")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PEER\tROLE\tINVITES\tSINCE")
		for _, p := range peers {
			role := p.Role
			switch {
			case p.Voter:
				role += " (voter)"
			case p.Volunteer:
				role += " (volunteer)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", p.PeerID, role, p.MayInvite, p.Since.Local().Format("01-02 15:04:05"))
		}
		return tw.Flush()
	case "batches":
		var list []peer.BatchInfo
		var err error
		if c != nil {
			list, err = c.Batches(ctx)
		} else {
			list, err = offlineBatches(ctx, s.Data)
		}
		if err != nil {
			return err
		}
		if list == nil {
			list = []peer.BatchInfo{}
		}
		if c == nil {
			if st, err := peer.OfflineStatus(s.Data); err == nil {
				peer.Annotate(list, st, nil)
			}
		}
		if asJSON {
			return printJSON(stdout, list)
		}
		return printBatches(stdout, list, time.Now())
	case "batch":
		id := core.BatchID(fs.Arg(0))
		var err error
		if c != nil {
			err = c.Batch(ctx, id, stdout)
		} else {
			var b *batch.Batch
			if b, err = offlineBatch(ctx, s.Data, id); err == nil {
				err = peer.WriteSteps(stdout, b)
			}
		}
		if errors.Is(err, mesh.ErrNoBatch) {
			return withHint(err, "'clawmesh mesh batches --data %s' lists the batches", s.Data)
		}
		return err
	case "revoke":
		return meshRevoke(ctx, c, &s, fs.Arg(0), mesh.RevokeOptions{Reason: reason, Force: force}, stdout)
	case "trust", "untrust":
		return meshTrust(ctx, c, &s, sub == "trust", fs.Arg(0), stdout, stderr)
	}
	return nil
}

// peerArg reads a peer id argument, saying in one line what is wrong with
// one that is not.
func peerArg(arg string) (mesh.PeerID, error) {
	p := mesh.PeerID(strings.TrimSpace(arg))
	if _, err := p2p.PublicKey(p); err != nil {
		shown := arg
		if len(shown) > 60 || strings.ContainsAny(shown, "\n\r\t") {
			shown = strings.Join(strings.Fields(shown), " ")
			if len(shown) > 60 {
				shown = strings.ToValidUTF8(shown[:60], "") + "..."
			}
		}
		return "", fmt.Errorf("%q is not a peer id: a peer id looks like 12D3KooW... ('clawmesh mesh peers' lists the peers connected now)", shown)
	}
	return p, nil
}

// meshRevoke revokes the peer named by arg, through the running peer c
// if there is one, else in the data directory.
func meshRevoke(ctx context.Context, c *peer.Client, s *settings, arg string, o mesh.RevokeOptions, stdout io.Writer) error {
	p, err := peerArg(arg)
	if err != nil {
		return err
	}
	if c != nil {
		res, err := c.RevokeWith(ctx, p, o)
		if err != nil && strings.Contains(err.Error(), strings.TrimPrefix(mesh.ErrUnknownPeer.Error(), "mesh: ")) {
			err = mesh.ErrUnknownPeer // the running peer's answer says no more
		}
		if errors.Is(err, mesh.ErrUnknownPeer) {
			return unknownPeer(p)
		}
		if err != nil {
			return err
		}
		if res.Already {
			fmt.Fprintf(stdout, "%s was already revoked, on %s by %s%s: nothing to do\n", p, res.At.Local().Format(time.RFC3339), res.By, reasonNote(res.Reason))
			return nil
		}
		fmt.Fprintf(stdout, "revoked %s: it is disconnected and refused across the mesh\n", p)
		return nil
	}
	key, _, err := peer.Identity(s.Data)
	if err != nil {
		return err
	}
	r, err := mesh.RevokeOffline(s.Data, key, p2p.PublicKey, p, o, time.Now())
	if errors.Is(err, mesh.ErrUnknownPeer) {
		return unknownPeer(p)
	}
	if errors.Is(err, mesh.ErrAlreadyRevoked) {
		fmt.Fprintf(stdout, "%s was already revoked, on %s by %s%s: nothing to do\n", p, r.RevokedAt().Local().Format(time.RFC3339), mesh.RevokedBy(r), reasonNote(r.Reason()))
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "revoked %s; the revocation spreads when this device next runs in the mesh\n", p)
	return nil
}

// meshTrust makes the trainer named by arg a voter (trust) or a volunteer
// (untrust), through the running peer c if there is one, else in the
// data directory.
func meshTrust(ctx context.Context, c *peer.Client, s *settings, trust bool, arg string, stdout, stderr io.Writer) error {
	p, err := peerArg(arg)
	if err != nil {
		return err
	}
	var res peer.VotersResult
	if c != nil {
		if trust {
			res, err = c.Trust(ctx, p)
		} else {
			res, err = c.Untrust(ctx, p)
		}
		if err != nil {
			return err
		}
	} else {
		key, _, err := peer.Identity(s.Data)
		if err != nil {
			return err
		}
		do, unchanged := mesh.TrustOffline, mesh.ErrAlreadyVoter
		if !trust {
			do, unchanged = mesh.UntrustOffline, mesh.ErrNotVoter
		}
		vs, err := do(s.Data, key, p2p.PublicKey, p, time.Now())
		switch {
		case errors.Is(err, unchanged):
			res.Unchanged = true // vs is the set in force
		case err != nil:
			return err
		}
		if vs != nil {
			res.Seq = vs.Seq()
			for _, v := range vs.Voters() {
				res.Voters = append(res.Voters, v.Peer)
			}
		}
	}
	switch {
	case res.Unchanged && trust:
		fmt.Fprintf(stdout, "%s is a voter already: nothing to do\n", p)
		return nil
	case res.Unchanged:
		fmt.Fprintf(stdout, "%s is not a voter: nothing to do\n", p)
		return nil
	case trust:
		fmt.Fprintf(stdout, "trusted %s: it votes and certifies versions (voter set %d, %s)\n", p, res.Seq, plural(len(res.Voters), "voter", "voters"))
	default:
		fmt.Fprintf(stdout, "untrusted %s: it volunteers from now on (voter set %d, %s)\n", p, res.Seq, plural(len(res.Voters), "voter", "voters"))
	}
	if c == nil {
		fmt.Fprintln(stdout, "the voter set spreads when this device next runs in the mesh")
	}
	if !trust && len(res.Voters) == 0 {
		fmt.Fprintln(stderr, "clawmesh mesh untrust: that was the last voter: the mesh will certify no version until a voter is trusted ('clawmesh mesh trust PEER')")
	}
	return nil
}

// unknownPeer is a revocation of a peer id this device never admitted
// nor invited (mesh.ErrUnknownPeer).
func unknownPeer(p mesh.PeerID) error {
	return withHint(fmt.Errorf("%s is not a member or trainer this device admitted or invited", p),
		"Check the id ('clawmesh mesh peers' lists the peers connected now), or run 'clawmesh mesh revoke %s --force'", p)
}

// plainLine is text from another device as a terminal shows it: one line,
// no control characters.
func plainLine(s string) string {
	return strings.TrimSpace(strings.Map(func(r rune) rune {
		if r < 0x20 || r >= 0x7f && r < 0xa0 {
			return ' '
		}
		return r
	}, s))
}

// reasonNote is a revocation's reason, as a terminal shows it.
func reasonNote(reason string) string {
	reason = plainLine(reason)
	if reason == "" {
		return ""
	}
	return " (reason: " + reason + ")"
}

// nextAt says when t is, from now: "at 15:04:05 (in 25s)", or "any
// moment now" once it is due.
func nextAt(t, now time.Time) string {
	d := t.Sub(now).Round(time.Second)
	if d <= 0 {
		return "any moment now"
	}
	return fmt.Sprintf("at %s (in %s)", t.Local().Format("15:04:05"), d)
}

// printBatches prints the batches' table: for each, when it shipped (or
// was received), or why it waits and when it is announced next.
func printBatches(w io.Writer, list []peer.BatchInfo, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BATCH\tSTEPS\tBYTES\tMADE\tSHIPPED/RECEIVED")
	for _, b := range list {
		when := "waiting for a trainer"
		switch {
		case b.Blocked != "":
			when = "will not ship: " + b.Blocked
		case !b.NextAnnounce.IsZero():
			when = "waiting for a trainer; announced again " + nextAt(b.NextAnnounce, now)
		case !b.Shipped.IsZero():
			when = "shipped " + b.Shipped.Local().Format("01-02 15:04:05")
		case !b.Received.IsZero():
			when = "received " + b.Received.Local().Format("01-02 15:04:05")
		}
		made := "-"
		if !b.Created.IsZero() {
			made = b.Created.Local().Format("01-02 15:04")
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", b.ID, b.Steps, b.Size, made, when)
	}
	return tw.Flush()
}

func meshInit(data, name string, stdout io.Writer) error {
	key, id, err := peer.Identity(data)
	if err != nil {
		return err
	}
	st, err := mesh.Init(data, name, key, id, time.Now(), rand.Reader)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "mesh %s made", st.MeshID)
	if name != "" {
		fmt.Fprintf(stdout, " (%s)", name)
	}
	fmt.Fprintf(stdout, "\nthis device is peer %s and holds the mesh's admin key (%s): keep it safe\n", id, filepath.Join(data, mesh.Dir, "admin.key"))
	fmt.Fprintf(stdout, "next: run the node, then 'clawmesh invite --role member' (or --role trainer) --data %s\n", data)
	return nil
}

// runningPeer returns a client of the node or trainer running on the data
// directory, or nil.
func runningPeer(s *settings) *peer.Client {
	if hc, ok := adminapi.SocketClient(s.Data); ok {
		c := &peer.Client{Base: adminapi.SocketBase, HTTP: hc}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.Status(ctx)
		cancel()
		if err == nil {
			return c
		}
	}
	for _, read := range []func(string) (string, error){node.ReadAddr, trainer.ReadAddr} {
		addr, err := read(s.Data)
		if err != nil {
			continue
		}
		c := &peer.Client{Base: "http://" + addr, Token: adminapi.ClientToken(s.Data, s.Token)}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = c.Status(ctx)
		cancel()
		if err == nil {
			return c
		}
	}
	return nil
}

func offlineBatches(ctx context.Context, data string) ([]peer.BatchInfo, error) {
	if _, err := mesh.LoadState(data); err != nil {
		return nil, err
	}
	if dir := filepath.Join(data, trainer.StoreDir); exists(dir) {
		st, err := store.Open(dir, nil)
		if err != nil {
			return nil, err
		}
		defer st.Close()
		return trainer.Batches{S: st}.List(ctx)
	}
	if dir := filepath.Join(data, "pool"); exists(dir) {
		p, err := pool.Open(dir, pool.Options{})
		if err != nil {
			return nil, err
		}
		defer p.Close()
		return node.Batches{P: p}.List(ctx)
	}
	return nil, nil
}

func offlineBatch(ctx context.Context, data string, id core.BatchID) (*batch.Batch, error) {
	if _, err := mesh.LoadState(data); err != nil {
		return nil, err
	}
	if dir := filepath.Join(data, trainer.StoreDir); exists(dir) {
		st, err := store.Open(dir, nil)
		if err != nil {
			return nil, err
		}
		defer st.Close()
		return st.Batch(ctx, id)
	}
	p, err := pool.Open(filepath.Join(data, "pool"), pool.Options{})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	return node.Batches{P: p}.Get(ctx, id)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func printMeshStatus(w io.Writer, st peer.Status) {
	name := ""
	if st.Name != "" {
		name = " (" + st.Name + ")"
	}
	fmt.Fprintf(w, "mesh      %s%s\n", st.MeshID, name)
	role := st.Role
	if st.MayInvite {
		role += ", may invite"
	}
	if st.Admin {
		role += ", holds the admin key"
	}
	if st.Revoked {
		role += ", REVOKED"
	}
	fmt.Fprintf(w, "peer      %s (%s)\n", st.PeerID, role)
	if st.Revoked {
		fmt.Fprintf(w, "revoked   removed from the mesh by %s on %s%s: every peer refuses it and its batches will not ship\n",
			plainLine(st.RevokedBy), st.RevokedAt.Local().Format(time.RFC3339), reasonNote(st.RevokedReason))
		fmt.Fprintf(w, "          to take part again, ask the mesh admin for a new invite and join from a fresh data directory\n")
	}
	fmt.Fprintf(w, "cert      expires %s\n", st.CertExpires.Local().Format(time.RFC3339))
	if st.Running {
		fmt.Fprintf(w, "running   %s connected, %d admitted; %s known\n", plural(st.Connected, "peer", "peers"), st.Admitted, plural(st.Revocations, "revocation", "revocations"))
	} else {
		fmt.Fprintf(w, "running   no (%s known)\n", plural(st.Revocations, "revocation", "revocations"))
	}
	if len(st.Voters) == 0 {
		fmt.Fprintf(w, "voters    none: no trusted trainer: versions cannot be certified; trust one with `clawmesh mesh trust PEER`\n")
	} else {
		fmt.Fprintf(w, "voters    %s (voter set %d)\n", plural(len(st.Voters), "trusted trainer", "trusted trainers"), st.VoterSetSeq)
		for _, v := range st.Voters {
			fmt.Fprintf(w, "          %s\n", v)
		}
	}
	if st.Volunteer {
		fmt.Fprintf(w, "          this trainer volunteers: it trains, but neither votes nor certifies versions\n")
	}
	for i, a := range st.Addrs {
		label := ""
		switch {
		case i == 0 && st.Running:
			label = "addrs"
		case i == 0:
			label = "last at"
		}
		fmt.Fprintf(w, "%-9s %s\n", label, a)
	}
}

const inviteHelp = `Usage: clawmesh invite [--role member|trainer] [--voter[=false]] [--ttl 24h] [--uses 1] --data DIR

Prints one copy-pasteable invite token line. On the other device:
  clawmesh join TOKEN --data ~/.clawmesh

The token is signed by this mesh's admin key (on the device that made the
mesh) or by this peer, if its certificate lets it invite. It carries this
peer's addresses: the peer that joins redeems it with this one, which must
be online then. A token is good for --uses redemptions until --ttl passes.

A trainer is a voter or a volunteer. Voters, trusted by the admin, vote in
the trainers' raft group and certify adapter versions; volunteers train and
hand their deltas in, but never vote nor certify. --voter makes the trainer
that joins a voter: only the admin's device may say so. While the mesh has
no voter, the admin's trainer token makes one unless --voter=false, so a
one-person mesh certifies its versions as it is. 'clawmesh mesh trust PEER'
and 'mesh untrust PEER' change a trainer's standing later.
`

func runInvite(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var s settings
	fs := newFlags("invite", inviteHelp, stderr)
	s.bindClient(fs)
	role := fs.String("role", "member", "what the invited peer may do: member (a device that shares batches) or trainer (pulls them to train)")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token stays valid")
	uses := fs.Int("uses", 1, "how many peers may join with it")
	voter := fs.Bool("voter", false, "make the trainer that joins a voter (the admin's device only; the default while the mesh has no voter); --voter=false makes it a volunteer")
	if err := parse(fs, args); err != nil {
		return err
	}
	choice := mesh.VoterIfNone
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "voter" {
			choice = mesh.MakeVolunteer
			if *voter {
				choice = mesh.MakeVoter
			}
		}
	})
	if fs.NArg() > 0 {
		return usageErr("unexpected arguments %q", fs.Args())
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	r, err := member.ParseRole(*role)
	if err != nil || r == member.RoleAdmin {
		return usageErr("--role: want member or trainer, got %q", *role)
	}
	if *ttl <= 0 || *uses < 1 {
		return usageErr("--ttl must be positive and --uses at least 1")
	}
	if choice == mesh.MakeVoter && r != member.RoleTrainer {
		return usageErr("--voter is for a trainer: add --role trainer")
	}
	var addrs []string
	c := runningPeer(&s)
	if c != nil {
		if st, err := c.Status(ctx); err == nil {
			addrs = st.Addrs
		}
	}
	release, err := lockOffline(s.Data, "invite", false)
	if err != nil {
		return err
	}
	defer release()
	key, _, err := peer.Identity(s.Data)
	if err != nil {
		return err
	}
	tok, err := mesh.InviteWith(s.Data, key, mesh.InviteOptions{Role: r, TTL: *ttl, Uses: *uses, Addrs: mesh.InviteAddrs(addrs), Voter: choice}, time.Now(), rand.Reader)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, tok.String())
	if c == nil {
		fmt.Fprintln(stderr, "clawmesh invite: no node or trainer runs on this data directory: the token carries the addresses it last listened on, and it must be running when the token is redeemed")
	}
	fmt.Fprintf(stderr, "(a %s token for %s, valid until %s)\n", r, plural(*uses, "use", "uses"), tok.Expires().Local().Format(time.RFC3339))
	switch {
	case r != member.RoleTrainer:
	case tok.Voter() && choice == mesh.VoterIfNone:
		fmt.Fprintln(stderr, "this trainer will be a voter: the mesh has none yet; --voter=false makes it a volunteer")
	case tok.Voter():
		fmt.Fprintln(stderr, "this trainer will be a voter: it votes and certifies versions")
	default:
		fmt.Fprintln(stderr, "this trainer will be a volunteer: it trains but neither votes nor certifies; the admin can trust it later with 'clawmesh mesh trust PEER'")
	}
	return nil
}

const joinHelp = `Usage: clawmesh join TOKEN --data DIR

Redeems an invite token (from 'clawmesh invite' on a device of the mesh):
reaches the inviter at the addresses in the token, which must be online,
gets this device's certificate, and records the membership in DIR. Then run
the node (or 'clawmesh trainer', with a trainer token) on DIR: it takes part
in the mesh.

A trainer token says whether the trainer will be a voter (it votes in the
trainers' raft group and certifies versions) or a volunteer (it trains,
but neither votes nor certifies); join says which.

While it tries the token's addresses it says which, one line each on
stderr; when none answers it says so in one line (--verbose adds each
address's error).

Refusals say why: the token is malformed or tampered with, expired, already
redeemed as many times as it allows, of another mesh, or its inviter (or
this device) was removed from the mesh. A device that was removed says so,
by whom and when, and cannot come back under the same peer id: with a new
invite from the mesh admin (or an inviter), join from a fresh data
directory, which gives it a new identity.
`

func runJoin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var s settings
	fs := newFlags("join", joinHelp, stderr)
	s.bindClient(fs)
	var listen multiFlag
	fs.Var(&listen, "p2p-listen", "libp2p address to use while joining (repeatable; default any free QUIC and TCP port)")
	verbose := fs.Bool("verbose", false, "when the inviter cannot be reached, print each address's error in full")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageErr("join takes one token (the line 'clawmesh invite' printed)")
	}
	if err := s.resolve(fs); err != nil {
		return err
	}
	release, err := lockOffline(s.Data, "join", true)
	if err != nil {
		return err
	}
	defer release()
	progress := func(a mesh.JoinAttempt) {
		switch {
		case !a.Done:
			fmt.Fprintf(stderr, "reaching the inviter at %s (%d of %d)...\n", plainLine(a.Addr), a.N, a.Of)
		case a.Err != nil:
			fmt.Fprintf(stderr, "  no answer: %s\n", dialReason(a.Err))
		}
	}
	st, err := peer.JoinWith(ctx, s.Data, fs.Arg(0), peer.JoinOptions{Listen: listen, Progress: progress})
	if errors.Is(err, mesh.ErrJoined) {
		if removed := mesh.Removed(s.Data); removed != nil {
			err = removed
		}
	}
	if removed := (*mesh.RemovedError)(nil); errors.As(err, &removed) && removed.NewIdentity() {
		return fmt.Errorf("%w\nto rejoin: clawmesh join NEW_TOKEN --data NEW_DIR (a fresh directory gets a new identity), "+
			"or move %s and %s aside and join with --data %s again", err,
			filepath.Join(s.Data, p2p.IdentityFile), filepath.Join(s.Data, mesh.Dir), s.Data)
	}
	var unreachable *mesh.UnreachableError
	if errors.As(err, &unreachable) {
		if *verbose {
			fmt.Fprint(stderr, unreachable.Detail())
			return withHint(err, "Check that the inviter's node or trainer runs, then run 'clawmesh join' again")
		}
		return withHint(err, "Check that the inviter's node or trainer runs, then run 'clawmesh join' again; --verbose shows each address's error")
	}
	if err != nil {
		return err
	}
	cert, _ := st.Certificate()
	name := ""
	if st.Name != "" {
		name = " (" + st.Name + ")"
	}
	standing := ""
	if tok, err := member.ParseToken(fs.Arg(0)); err == nil && cert.Role() == member.RoleTrainer {
		standing = " (a volunteer)"
		if tok.Voter() {
			standing = " (a voter)"
		}
	}
	fmt.Fprintf(stdout, "joined mesh %s%s as a %s%s; peer %s\n", st.MeshID, name, cert.Role(), standing, cert.Subject())
	if _, err := node.ReadAddr(s.Data); err == nil {
		fmt.Fprintln(stdout, "a node runs on this data directory: restart it to take part in the mesh")
	} else if cert.Role() == member.RoleTrainer {
		fmt.Fprintf(stdout, "next: clawmesh trainer --data %s\n", s.Data)
	} else {
		fmt.Fprintf(stdout, "next: run the node with --data %s\n", s.Data)
		printSharing(stdout, s)
	}
	return nil
}

// dialReason is why a dial failed, in a few words: libp2p's own error
// lists every transport's attempt, many lines long (join --verbose shows
// it).
func dialReason(err error) string {
	msg := err.Error()
	switch {
	case errors.Is(err, context.DeadlineExceeded) || strings.Contains(msg, "deadline exceeded") || strings.Contains(msg, "timeout"):
		return "no answer in time"
	case strings.Contains(msg, "connection refused"):
		return "connection refused (nothing listens there)"
	case strings.Contains(msg, "no route to host"), strings.Contains(msg, "network is unreachable"):
		return "no route to that address from here"
	case strings.Contains(msg, "peer id mismatch"):
		return "another peer answers there"
	case errors.Is(err, p2p.ErrBadAddr):
		return "not a usable address"
	}
	if i := strings.IndexByte(msg, '\n'); i >= 0 {
		msg = msg[:i]
	}
	if len(msg) > 120 {
		msg = strings.ToValidUTF8(msg[:120], "") + "..."
	}
	return msg
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error {
	v = strings.TrimSpace(v)
	if v == "" {
		return errors.New("empty value")
	}
	*m = append(*m, v)
	return nil
}

var _ flag.Value = (*multiFlag)(nil)

// printSharing says what a node on s.Data lets leave the device now that
// it is in a mesh, and how to keep everything on the device.
func printSharing(w io.Writer, s settings) {
	p := s.Share
	if p.Mode == "" {
		p.Mode = share.DefaultMode(true)
	}
	fmt.Fprintf(w, "sharing: %s\n", p.Summary())
	if p.Mode != share.ModeNone {
		fmt.Fprintf(w, "  to keep everything on this device, set [share] mode = \"none\" in %s; 'clawmesh pool preview --data %s' shows what would leave\n", nodeConfigPath(s), s.Data)
	}
}
