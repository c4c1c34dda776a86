package mesh

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Protocols. The redeem and admit protocols are open: a peer without a
// certificate may open them (to join, and to show it has none). Every
// other protocol is for admitted peers only.
const (
	ProtoRedeem = "/clawmesh/redeem/1"
	ProtoAdmit  = "/clawmesh/admit/2"
	ProtoRenew  = "/clawmesh/renew/1"
	ProtoPull   = "/clawmesh/pull/1"
)

// OpenProtocols are the protocols anyone connected may open.
var OpenProtocols = []string{ProtoRedeem, ProtoAdmit}

// TopicName is the name of a mesh's gossip topic kind ("batches/1"). The
// mesh's id is not in it, but a hash of it: gossip tells every peer that
// connects, strangers included, the topics a peer reads, and a topic must
// not tell a stranger which mesh it found.
func TopicName(meshID, kind string) string {
	h := sha256.Sum256([]byte("clawmesh topic\x00" + meshID))
	return "clawmesh/" + hex.EncodeToString(h[:16]) + "/" + kind
}

// Topics, per mesh.
func topicRevocations(meshID string) string { return TopicName(meshID, "revocations/1") }
func topicBatches(meshID string) string     { return TopicName(meshID, "batches/1") }
func topicAcks(meshID string) string        { return TopicName(meshID, "acks/1") }

// maxMsg bounds one control message (a hello, a redeem request or reply).
const maxMsg = 64 << 10

// ErrMessage reports a malformed or oversize message from a peer.
var ErrMessage = errors.New("mesh: bad message")

// writeMsg writes v as one message: its JSON length as a uvarint, then the
// JSON.
func writeMsg(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > maxMsg {
		return fmt.Errorf("%w: %d bytes to send, over %d", ErrMessage, len(b), maxMsg)
	}
	buf := binary.AppendUvarint(make([]byte, 0, len(b)+binary.MaxVarintLen32), uint64(len(b)))
	_, err = w.Write(append(buf, b...))
	return err
}

// readMsg reads one message written by writeMsg into v, refusing one over
// max bytes before reading it.
func readMsg(r *bufio.Reader, v any, max int) error {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return fmt.Errorf("%w: length: %v", ErrMessage, err)
	}
	if n > uint64(max) {
		return fmt.Errorf("%w: %d bytes, over %d", ErrMessage, n, max)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("%w: %v", ErrMessage, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrMessage, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: trailing data", ErrMessage)
	}
	return nil
}
