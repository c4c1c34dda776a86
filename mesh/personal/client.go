package personal

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/clawmesh/clawmesh/internal/atomicfile"
	"github.com/clawmesh/clawmesh/internal/core"
	"github.com/clawmesh/clawmesh/mesh"
	"github.com/clawmesh/clawmesh/mesh/batch"
	"github.com/clawmesh/clawmesh/mesh/member"
)

// Client has a device's personal adapter trained by a trainer the user
// trusts. Its Train is a node/personal.Trainer.
type Client struct {
	// Host opens the streams; Mesh says which peers are admitted, and
	// as what. Required.
	Host mesh.Host
	Mesh Mesh
	// Trainers are the trainer peers the user trusts with the device's
	// steps, in the order they are asked. A job goes to one of them at a
	// time, and only to one the mesh admitted as a trainer; to no other
	// peer ever.
	Trainers []mesh.PeerID
	// Limits bound what is sent and what is taken back.
	Limits Limits
	// Timeout bounds a job when the caller's context has no deadline
	// (default DefaultJobTimeout and a minute); Stall is how long the
	// trainer may take nothing of the request, or send nothing of its
	// adapter, before the stream is cut (default DefaultStall).
	Timeout time.Duration
	Stall   time.Duration
	// Rand makes the jobs' nonces (default crypto/rand).
	Rand   io.Reader
	Logger *slog.Logger
}

// Train sends the job to the first trusted trainer that is an admitted
// trainer now, and, if it fails, to the next: its steps, its held-back
// steps, the name of its shared version (the trainer trains on its own
// copy; j.Shared is not sent), its previous adapter (j.Prev, if any) and
// its seed. It checks the reply (signed by that trainer for this device
// and this job's nonce, over the request sent and the adapter received)
// and writes the adapter to j.Out, which must not exist, all at once.
func (c Client) Train(ctx context.Context, j core.PersonalJob) (core.PersonalResult, error) {
	lim := c.Limits.withDefaults()
	if c.Host == nil || c.Mesh == nil {
		return core.PersonalResult{}, errors.New("personal: a client needs a Host and a Mesh")
	}
	job, err := c.prepare(j, lim)
	if err != nil {
		return core.PersonalResult{}, err
	}
	if _, ok := ctx.Deadline(); !ok {
		timeout := c.Timeout
		if timeout <= 0 {
			timeout = DefaultJobTimeout + time.Minute
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var errs []error
	var listed, asked []mesh.PeerID
	for _, p := range c.Trainers {
		if p == "" || p == c.Mesh.ID() || slices.Contains(listed, p) {
			continue
		}
		listed = append(listed, p)
		pe, ok := c.Mesh.Peer(p)
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s is not admitted now", p))
			continue
		case pe.Cert.Role() != member.RoleTrainer:
			errs = append(errs, fmt.Errorf("%s is not a trainer (its certificate is a %s's): the steps are not sent to it", p, pe.Cert.Role()))
			continue
		}
		asked = append(asked, p)
		res, err := c.try(ctx, p, pe.Cert.SubjectKey(), job, j, lim)
		if err == nil {
			return res, nil
		}
		log.Info("personal training on a trusted trainer failed", "trainer", p, "err", err)
		errs = append(errs, fmt.Errorf("%s: %w", p, err))
		if ctx.Err() != nil {
			break
		}
	}
	switch {
	case len(listed) == 0:
		return core.PersonalResult{}, fmt.Errorf("%w: no trainer is trusted", ErrNoTrainer)
	case len(asked) == 0:
		return core.PersonalResult{}, fmt.Errorf("%w: %w", ErrNoTrainer, errors.Join(errs...))
	}
	return core.PersonalResult{}, errors.Join(errs...)
}

// prepared is a job encoded for the wire.
type prepared struct {
	steps, heldBack []byte
	config          []byte
	weights         string // the previous adapter's weights file ("": none)
	weightsSize     int64
}

// prepare checks a job and encodes it, within lim.
func (c Client) prepare(j core.PersonalJob, lim Limits) (*prepared, error) {
	switch {
	case len(j.Steps) == 0:
		return nil, errors.New("personal: a job needs steps")
	case len(j.Steps) > lim.MaxSteps || len(j.HeldBack) > lim.MaxSteps:
		return nil, fmt.Errorf("%w: %d steps and %d held back, limit %d each", ErrTooLarge, len(j.Steps), len(j.HeldBack), lim.MaxSteps)
	case j.Out == "":
		return nil, errors.New("personal: a job needs its Out directory")
	case j.Shared != "" && j.SharedVersion == "":
		return nil, errors.New("personal: a job on a shared version needs the version's name (the trainer trains on its own copy of it)")
	case j.SharedVersion != "" && !ValidVersion(j.SharedVersion):
		return nil, fmt.Errorf("personal: shared version %q is not a version's name", j.SharedVersion)
	}
	if _, err := os.Lstat(j.Out); err == nil {
		return nil, fmt.Errorf("personal: %s exists already: a job writes a new directory", j.Out)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var p prepared
	var err error
	if p.steps, err = encodeSteps(j.Steps, lim); err != nil {
		return nil, fmt.Errorf("personal: the steps: %w", err)
	}
	if len(j.HeldBack) > 0 {
		if p.heldBack, err = encodeSteps(j.HeldBack, lim); err != nil {
			return nil, fmt.Errorf("personal: the held-back steps: %w", err)
		}
	}
	if j.Prev != "" {
		if p.config, err = readFileMax(filepath.Join(j.Prev, ConfigFile), lim.MaxConfig); err != nil {
			return nil, fmt.Errorf("personal: the previous adapter: %w", err)
		}
		if err := checkConfig(p.config); err != nil {
			return nil, fmt.Errorf("personal: the previous adapter: %w", err)
		}
		p.weights = filepath.Join(j.Prev, WeightsFile)
		f, err := os.Open(p.weights)
		if err != nil {
			return nil, fmt.Errorf("personal: the previous adapter: %w", err)
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return nil, err
		}
		if p.weightsSize = fi.Size(); p.weightsSize > lim.MaxWeights {
			return nil, fmt.Errorf("%w: the previous adapter's weights are %d bytes, limit %d", ErrTooLarge, p.weightsSize, lim.MaxWeights)
		}
		if err := checkWeights(f, p.weightsSize); err != nil {
			return nil, fmt.Errorf("personal: the previous adapter: %w", err)
		}
	}
	return &p, nil
}

// encodeSteps encodes steps as a batch, within lim. The batch names no
// time nor policy: it is not one the device ships.
func encodeSteps(steps []*core.Step, lim Limits) ([]byte, error) {
	b, err := batch.Encode(batch.Meta{}, steps)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > lim.MaxStepBytes {
		return nil, fmt.Errorf("%w: %d bytes encoded, limit %d", ErrTooLarge, len(b), lim.MaxStepBytes)
	}
	return b, nil
}

// readFileMax reads a file of at most max bytes.
func readFileMax(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: %s is over %d bytes", ErrTooLarge, path, max)
	}
	return b, nil
}

// try runs the job with trainer p, whose identity key is key.
func (c Client) try(ctx context.Context, p mesh.PeerID, key ed25519.PublicKey, job *prepared, j core.PersonalJob, lim Limits) (core.PersonalResult, error) {
	var res core.PersonalResult
	rnd := c.Rand
	if rnd == nil {
		rnd = rand.Reader
	}
	var nb [nonceSize]byte
	if _, err := io.ReadFull(rnd, nb[:]); err != nil {
		return res, err
	}
	req := request{Device: string(c.Mesh.ID()), Nonce: hex.EncodeToString(nb[:]), SharedVersion: j.SharedVersion, Seed: j.Seed,
		Steps: int64(len(job.steps)), HeldBack: int64(len(job.heldBack)), Config: int64(len(job.config)), Weights: job.weightsSize}
	head, err := encodeMsg(req)
	if err != nil {
		return res, err
	}
	stall := c.Stall
	if stall <= 0 {
		stall = DefaultStall
	}
	sctx, cancel := context.WithTimeout(ctx, headerTimeout)
	st, err := c.Host.NewStream(sctx, p, Protocol)
	cancel()
	if err != nil {
		return res, err
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.Reset() })
	defer stop()

	// The header first; the steps only once the trainer took it.
	digest := sha256.New()
	w := &deadlineWriter{s: st, stall: stall}
	rd := &deadlineReader{s: st, stall: stall, hard: time.Now().Add(headerTimeout)}
	br := bufio.NewReaderSize(rd, 64<<10)
	if _, err := w.Write(head); err != nil {
		return res, c.refusal(ctx, br, err)
	}
	digest.Write(head)
	var first reply
	if _, err := readMsg(br, &first); err != nil {
		return res, c.streamErr(ctx, err)
	}
	if first.Status != statusAccepted {
		return res, ended(br, statusErr(first.Status, first.Error))
	}
	if err := sendJob(io.MultiWriter(w, digest), job); err != nil {
		rd.hard = time.Now().Add(headerTimeout)
		return res, c.refusal(ctx, br, err)
	}
	var reqSum [sha256.Size]byte
	digest.Sum(reqSum[:0])

	// The training: no deadline but the job's.
	rd.hard, rd.stall = time.Time{}, 0
	st.SetReadDeadline(time.Time{})
	var rep reply
	if _, err := readMsg(br, &rep); err != nil {
		return res, c.streamErr(ctx, err)
	}
	if rep.Status != statusOK {
		rd.hard = time.Now().Add(headerTimeout)
		return res, ended(br, statusErr(rep.Status, rep.Error))
	}
	if err := rep.checkOK(lim); err != nil {
		return res, err
	}
	res = *rep.Result
	if res.Trained > len(j.Steps) || res.HeldBack > len(j.HeldBack) {
		return core.PersonalResult{}, fmt.Errorf("%w: a result of %d steps trained and %d held back, for %d and %d sent", ErrMessage, res.Trained, res.HeldBack, len(j.Steps), len(j.HeldBack))
	}
	rd.stall = stall
	if err := c.receive(br, p, key, &req, reqSum, &rep, j.Out); err != nil {
		return core.PersonalResult{}, c.streamErr(ctx, err)
	}
	return res, nil
}

// sendJob writes a job's four parts.
func sendJob(w io.Writer, job *prepared) error {
	for _, b := range [][]byte{job.steps, job.heldBack, job.config} {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	if job.weights == "" {
		return nil
	}
	f, err := os.Open(job.weights)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(w, f, job.weightsSize); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("personal: %s changed while it was sent", job.weights)
		}
		return err
	}
	return nil
}

// receive reads the adapter a reply announced into a new directory
// beside out, checks it against the reply's signature and renames it to
// out.
func (c Client) receive(br *bufio.Reader, p mesh.PeerID, key ed25519.PublicKey, req *request, reqSum [sha256.Size]byte, rep *reply, out string) error {
	sig, err := hex.DecodeString(rep.Sig)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSignature, err)
	}
	cfg, err := readN(br, rep.Config)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp) // after the rename, there is nothing there
	wpath := filepath.Join(tmp, WeightsFile)
	wsum, err := receiveFile(br, wpath, rep.Weights)
	if err != nil {
		return err
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		if err == nil {
			return fmt.Errorf("%w: bytes after the adapter", ErrMessage)
		}
		return err
	}
	if !ed25519.Verify(key, signedReply(p, c.Mesh.ID(), req.Nonce, reqSum, sha256.Sum256(cfg), wsum, *rep.Result), sig) {
		return fmt.Errorf("%w: from %s", ErrSignature, p)
	}
	if err := checkConfig(cfg); err != nil {
		return err
	}
	f, err := os.Open(wpath)
	if err != nil {
		return err
	}
	err = checkWeights(f, rep.Weights)
	f.Close()
	if err != nil {
		return err
	}
	if err := writeSynced(filepath.Join(tmp, ConfigFile), cfg); err != nil {
		return err
	}
	atomicfile.SyncDir(tmp)
	if _, err := os.Lstat(out); err == nil {
		return fmt.Errorf("personal: %s appeared while the job ran", out)
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	atomicfile.SyncDir(filepath.Dir(out))
	return nil
}

// receiveFile reads n bytes into a new file at path, synced, and returns
// their SHA-256.
func receiveFile(r io.Reader, path string, n int64) (sum [sha256.Size]byte, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	h := sha256.New()
	got, err := io.CopyN(io.MultiWriter(f, h), r, n)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return sum, fmt.Errorf("%w: adapter weights cut after %d of %d bytes", ErrMessage, got, n)
		}
		return sum, err
	}
	if err := f.Sync(); err != nil {
		return sum, err
	}
	return sumOf(h), nil
}

func sumOf(h hash.Hash) (sum [sha256.Size]byte) {
	h.Sum(sum[:0])
	return sum
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// refusal is the error of a request the stream stopped taking (werr):
// the trainer's answer, if it sent one (it refused the job, and reads no
// more of it), else werr.
func (c Client) refusal(ctx context.Context, br *bufio.Reader, werr error) error {
	var rep reply
	if _, err := readMsg(br, &rep); err == nil && rep.Status != statusAccepted && rep.Status != statusOK {
		return ended(br, statusErr(rep.Status, rep.Error))
	}
	return c.streamErr(ctx, werr)
}

// ended waits for the end of a trainer's answer (it ends the stream once
// it cleared the job away, so that the device's next job finds it free),
// and returns err.
func ended(br *bufio.Reader, err error) error {
	io.CopyN(io.Discard, br, maxDrain)
	return err
}

// streamErr says why an exchange's stream failed: the job's context
// ended, or the stream did.
func (c Client) streamErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("personal: %w", ctx.Err())
	}
	return err
}
