package mesh

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"
)

// ProtoPlugin fetches a reward plugin's module by its content hash (the hex
// sha256 of the .wasm, as core.Score.Hash names it), so that a peer can
// replay the scores a batch carries. Only admitted peers may use it.
//
// The asker sends {"hash": H}; the server answers {"status": S, "size": N,
// "error": E} and, when S is "ok", the module's N bytes, then closes. S is
// "ok", "not_found", "refused" (the asker is not admitted) or "too_large"
// (over the server's MaxPlugin).
const ProtoPlugin = "/clawmesh/plugin/1"

// MaxPlugin bounds the size of a plugin module served or fetched, unless
// FetchPlugin is given a smaller bound.
const MaxPlugin = 32 << 20

// pluginTimeout bounds a whole fetch when the caller's context has no
// deadline.
const pluginTimeout = 2 * time.Minute

// Errors of the plugin protocol.
var (
	// ErrNoPlugin: the peer does not hold the module (a PluginSource's
	// answer for a hash it does not know wraps it too).
	ErrNoPlugin = errors.New("mesh: no such plugin module")
	// ErrPluginHash: the bytes a peer sent do not hash to the hash asked
	// for.
	ErrPluginHash = errors.New("mesh: plugin module does not match its hash")
	// ErrPluginTooLarge: the module is over the size limit.
	ErrPluginTooLarge = errors.New("mesh: plugin module too large")
	// ErrPluginRefused: the peer refused the request (this peer is not
	// admitted there).
	ErrPluginRefused = errors.New("mesh: plugin fetch refused")
)

// PluginSource gives reward plugin modules by content hash: a node's
// reward runner, a trainer's plugin cache.
type PluginSource interface {
	// Plugin returns the module whose hex sha256 is hash, or an error
	// wrapping ErrNoPlugin.
	Plugin(ctx context.Context, hash string) ([]byte, error)
}

type pluginRequest struct {
	Hash string `json:"hash"`
}

type pluginReply struct {
	Status string `json:"status"`
	Size   int64  `json:"size,omitempty"`
	Error  string `json:"error,omitempty"`
}

// Statuses of a plugin reply, and the errors they are to the asker: the
// one place the wire's words map to sentinels.
const (
	pluginOK       = "ok"
	pluginNotFound = "not_found"
	pluginRefused  = "refused"
	pluginTooLarge = "too_large"
)

// pluginReplyErr says what a reply means to an asker that takes up to
// maxBytes: nil when the module's bytes follow and fit.
func pluginReplyErr(rep pluginReply, maxBytes int64) error {
	switch rep.Status {
	case pluginOK:
		if rep.Size > maxBytes {
			return fmt.Errorf("%w: %d bytes, limit %d", ErrPluginTooLarge, rep.Size, maxBytes)
		}
		if rep.Size <= 0 {
			return fmt.Errorf("%w: a plugin module of %d bytes", ErrMessage, rep.Size)
		}
		return nil
	case pluginNotFound:
		return ErrNoPlugin
	case pluginRefused:
		return fmt.Errorf("%w: %s", ErrPluginRefused, rep.Error)
	case pluginTooLarge:
		return fmt.Errorf("%w: %s", ErrPluginTooLarge, rep.Error)
	}
	return fmt.Errorf("%w: plugin reply status %q", ErrMessage, rep.Status)
}

// validHash reports a lower-case hex sha256.
func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for _, c := range []byte(h) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ServePlugins answers ProtoPlugin requests of admitted peers with src's
// modules. It serves only bytes that hash to what was asked (a module
// whose file changed is not found) and no module over MaxPlugin. Call it
// after Start.
func (m *Mesh) ServePlugins(src PluginSource) {
	if m.host == nil {
		panic("mesh: ServePlugins before Start")
	}
	m.host.Handle(ProtoPlugin, func(s Stream) {
		defer s.Close()
		s.SetDeadline(time.Now().Add(exchangeTimeout))
		var req pluginRequest
		if err := readMsg(bufio.NewReader(s), &req, maxMsg); err != nil || !validHash(req.Hash) {
			s.Reset()
			return
		}
		if _, ok := m.Peer(s.RemotePeer()); !ok {
			writeMsg(s, pluginReply{Status: pluginRefused, Error: "only admitted peers fetch plugins"})
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), exchangeTimeout)
		b, err := src.Plugin(ctx, req.Hash)
		cancel()
		switch {
		case err != nil:
			if !errors.Is(err, ErrNoPlugin) {
				m.log.Warn("serving a plugin module", "hash", req.Hash, "err", err)
			}
			writeMsg(s, pluginReply{Status: pluginNotFound})
			return
		case len(b) > MaxPlugin:
			writeMsg(s, pluginReply{Status: pluginTooLarge, Error: fmt.Sprintf("%d bytes, limit %d", len(b), MaxPlugin)})
			return
		case sha256Hex(b) != req.Hash:
			m.log.Warn("a plugin source gave bytes that do not match the hash asked for", "hash", req.Hash)
			writeMsg(s, pluginReply{Status: pluginNotFound})
			return
		}
		if err := writeMsg(s, pluginReply{Status: pluginOK, Size: int64(len(b))}); err != nil {
			s.Reset()
			return
		}
		// In chunks, each with its own deadline: a slow reader is fine,
		// a stalled one is cut.
		for off := 0; off < len(b); {
			n := min(len(b)-off, 256<<10)
			s.SetWriteDeadline(time.Now().Add(m.stall()))
			if _, err := s.Write(b[off : off+n]); err != nil {
				s.Reset()
				return
			}
			off += n
		}
	})
}

// FetchPlugin fetches the plugin module whose hex sha256 is hash from peer
// from, refusing one over maxBytes (MaxPlugin when maxBytes <= 0 or over
// it), and checks the bytes against the hash before it returns them. A
// peer that does not hold the module gives ErrNoPlugin; bytes that do not
// match, ErrPluginHash. The fetch gives up when ctx is done, when it has
// taken two minutes (if ctx has no deadline), and when the peer sends
// nothing for the stall timeout (Config.Stall).
func (m *Mesh) FetchPlugin(ctx context.Context, from PeerID, hash string, maxBytes int64) ([]byte, error) {
	if !validHash(hash) {
		return nil, fmt.Errorf("%w: plugin hash %q is not a lower-case hex sha256", ErrMessage, hash)
	}
	if maxBytes <= 0 || maxBytes > MaxPlugin {
		maxBytes = MaxPlugin
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, pluginTimeout)
		defer cancel()
	}
	sctx, cancel := context.WithTimeout(ctx, exchangeTimeout)
	s, err := m.host.NewStream(sctx, from, ProtoPlugin)
	cancel()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Reset() })
	defer stop()
	s.SetDeadline(time.Now().Add(m.stall()))
	if err := writeMsg(s, pluginRequest{Hash: hash}); err != nil {
		s.Reset()
		return nil, m.fetchErr(ctx, err)
	}
	br := bufio.NewReaderSize(s, 64<<10)
	var rep pluginReply
	if err := readMsg(br, &rep, maxMsg); err != nil {
		s.Reset()
		return nil, m.fetchErr(ctx, err)
	}
	if err := pluginReplyErr(rep, maxBytes); err != nil {
		s.Reset()
		return nil, err
	}
	buf, err := m.readBody(s, br, rep.Size, nil)
	switch {
	case errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: plugin module cut after %d of %d bytes", ErrMessage, len(buf), rep.Size)
	case err != nil:
		return nil, m.fetchErr(ctx, err)
	}
	if got := sha256Hex(buf); got != hash {
		return nil, fmt.Errorf("%w: asked %s, %s sent bytes that hash to %s", ErrPluginHash, hash, from, got)
	}
	return buf, nil
}

// fetchErr says why a fetch's stream failed: ctx ended, or it stalled.
func (m *Mesh) fetchErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("mesh: plugin fetch: %w", ctx.Err())
	}
	if isTimeout(err) {
		return fmt.Errorf("%w: plugin fetch: %v", ErrStalled, err)
	}
	return err
}
