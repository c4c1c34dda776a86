package p2p

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/clawmesh/clawmesh/mesh"
)

const (
	// gossipFraming is what an RPC may carry beside one message's data: the
	// topic name, protobuf framing, and control frames piggybacked on it
	// (the router splits bigger RPCs).
	gossipFraming = 16 << 10
	// subscriptionBuffer is how many received messages a Topic holds for
	// Next; beyond it pubsub drops them (and says so in its log).
	subscriptionBuffer = 256
	// validateQueue is how many received messages may wait for validation
	// (the size check) at once.
	validateQueue = 256
	// notAdmittedScore is the application score of a peer the Gate does
	// not admit: far below the graylist threshold, so that the router
	// neither sends to it nor accepts anything from it.
	notAdmittedScore = -10_000
)

// startGossip creates the Host's GossipSub router. Every message is signed
// by its author's identity key and stamped with its peer id and a sequence
// number (StrictSign), and a message whose signature does not verify is
// dropped: Message.Author is authenticated, and a peer that forwards a
// message cannot pass it off as its own. The data itself need not name
// anyone (a batch announcement does not name its device), but every peer
// that receives a message learns its author. Messages are identified by
// their author and content (messageID), so the same data published twice
// by one peer is delivered once, and a copy another peer publishes as its
// own does not hide the original.
//
// Admission is enforced three ways:
//   - the peer filter keeps peers the Gate does not admit out of the mesh,
//     out of gossip (IHAVE/IWANT) and out of fanout;
//   - the RPC inspector (inspectRPC) drops every message and control frame
//     such a peer sends, keeping only its subscriptions;
//   - the application-specific score puts it below the graylist threshold,
//     a second lock on both directions, and lets the router prune a peer
//     from the mesh within a heartbeat once the Gate stops admitting it.
//
// Flood publishing is off: it would send our own messages to every
// subscribed peer whose score passes, bypassing the peer filter.
func (h *Host) startGossip(ctx context.Context) (*pubsub.PubSub, error) {
	return pubsub.NewGossipSub(ctx, h.host,
		pubsub.WithMessageSignaturePolicy(pubsub.StrictSign),
		pubsub.WithMessageIdFn(messageID),
		pubsub.WithMaxMessageSize(h.maxMsg+gossipFraming),
		pubsub.WithFloodPublish(false),
		pubsub.WithPeerExchange(false),
		pubsub.WithPeerFilter(func(p peer.ID, _ string) bool { return h.gate.Admitted(meshID(p)) }),
		pubsub.WithAppSpecificRpcInspector(h.inspectRPC),
		pubsub.WithPeerScore(h.scoreParams(), scoreThresholds()),
		pubsub.WithDefaultValidator(pubsub.ValidatorEx(h.validateSize), pubsub.WithValidatorInline(true)),
		pubsub.WithValidateQueueSize(validateQueue),
		pubsub.WithLogger(h.log.With("component", "gossip")),
	)
}

// messageID identifies a message by its topic, author and data:
// sha256(topic, 0, uvarint length of the author's id, the id, data), as raw
// bytes. The topic is part of it because pubsub keeps one seen-cache for
// all topics: the same bytes on two topics are two messages. The author is
// part of it so that a peer that copies another's message and publishes it
// as its own makes a second message instead of taking the first one's
// place where the copy arrives first.
func messageID(m *pb.Message) string {
	d := sha256.New()
	d.Write([]byte(m.GetTopic()))
	d.Write([]byte{0})
	from := m.GetFrom()
	d.Write(binary.AppendUvarint(nil, uint64(len(from))))
	d.Write(from)
	d.Write(m.GetData())
	return string(d.Sum(nil))
}

// inspectRPC runs on every RPC received, before pubsub looks at it. From a
// peer the Gate does not admit, it strips the published messages and the
// control frames (GRAFT, PRUNE, IHAVE, IWANT, IDONTWANT) and the extension
// payloads, and keeps the subscription announcements: pubsub records those
// before anything else (handleIncomingRPC), so when the Gate admits the peer
// the router already knows its topics and grafts it at the next heartbeat.
//
// Rewriting the RPC in place is safe: pubsub decodes a fresh RPC for each
// read from the wire (comm.go, handleNewStream) and hands it to the
// inspector, on its event loop, before any other use. Returning an error
// instead would drop the subscriptions too.
func (h *Host) inspectRPC(from peer.ID, rpc *pubsub.RPC) error {
	if h.gate.Admitted(meshID(from)) {
		return nil
	}
	if len(rpc.Publish) > 0 || rpc.Control != nil || rpc.Partial != nil || rpc.TestExtension != nil {
		h.log.Debug("gossip from a peer not admitted: messages and control dropped",
			"from", from, "messages", len(rpc.Publish))
		rpc.Publish = nil
		rpc.Control = nil
		rpc.Partial = nil
		rpc.TestExtension = nil
	}
	return nil
}

// validateSize rejects messages larger than MaxMessage: the peer that sent
// one is penalised (invalid message deliveries), and it goes no further.
func (h *Host) validateSize(_ context.Context, from peer.ID, m *pubsub.Message) pubsub.ValidationResult {
	if len(m.GetData()) > h.maxMsg {
		h.log.Debug("gossip message too large: rejected", "from", from, "size", len(m.GetData()), "max", h.maxMsg)
		return pubsub.ValidationReject
	}
	return pubsub.ValidationAccept
}

// scoreParams are the router's peer-score parameters. Kept simple:
//
//   - P5, application score: 0 for an admitted peer, notAdmittedScore
//     otherwise (weight 1) — what enforces admission;
//   - P6, IP colocation: off. Devices behind one home NAT, or tests on
//     loopback, share an address, and sybils need certificates anyway;
//   - P7, behaviour penalty (re-grafting during backoff, broken IHAVE
//     promises): weight -10 above 6 offences, decaying over 10 minutes;
//   - per topic (topicScoreParams, set on Join): a little credit for time
//     in the mesh and for first deliveries, a heavy penalty for invalid
//     messages. No mesh-delivery-rate penalty (P3): announcements are
//     rare, and a quiet mesh is not a faulty one.
//
// Counters decay every second, to zero below 0.01; a disconnected peer's
// score is kept 10 minutes, so reconnecting does not wash it.
func (h *Host) scoreParams() *pubsub.PeerScoreParams {
	return &pubsub.PeerScoreParams{
		Topics:        make(map[string]*pubsub.TopicScoreParams), // filled by Join
		TopicScoreCap: 50,
		AppSpecificScore: func(p peer.ID) float64 {
			if h.gate.Admitted(meshID(p)) {
				return 0
			}
			return notAdmittedScore
		},
		AppSpecificWeight:         1,
		IPColocationFactorWeight:  0,
		BehaviourPenaltyWeight:    -10,
		BehaviourPenaltyThreshold: 6,
		BehaviourPenaltyDecay:     pubsub.ScoreParameterDecay(10 * time.Minute),
		DecayInterval:             pubsub.DefaultDecayInterval,
		DecayToZero:               pubsub.DefaultDecayToZero,
		RetainScore:               10 * time.Minute,
	}
}

// topicScoreParams score one topic: time in the mesh earns up to 1 point
// (0.01 a second, capped at 100 s), first deliveries up to 10 (1 each,
// decaying over 10 minutes), and each invalid message costs its count
// squared times 100, decaying over an hour: one oversized message puts a
// peer at the gossip threshold, two below the graylist.
func topicScoreParams() *pubsub.TopicScoreParams {
	return &pubsub.TopicScoreParams{
		TopicWeight:                    1,
		TimeInMeshWeight:               0.01,
		TimeInMeshQuantum:              time.Second,
		TimeInMeshCap:                  100,
		FirstMessageDeliveriesWeight:   1,
		FirstMessageDeliveriesDecay:    pubsub.ScoreParameterDecay(10 * time.Minute),
		FirstMessageDeliveriesCap:      10,
		InvalidMessageDeliveriesWeight: -100,
		InvalidMessageDeliveriesDecay:  pubsub.ScoreParameterDecay(time.Hour),
	}
}

// scoreThresholds: below -100 no gossip (IHAVE/IWANT) is exchanged with a
// peer, below -200 we do not publish to it, below -400 nothing from it is
// processed. Peer exchange is off, so AcceptPXThreshold only needs to be
// out of reach. Opportunistic grafting starts when the mesh's median score
// falls below 1.
func scoreThresholds() *pubsub.PeerScoreThresholds {
	return &pubsub.PeerScoreThresholds{
		GossipThreshold:             -100,
		PublishThreshold:            -200,
		GraylistThreshold:           -400,
		AcceptPXThreshold:           1000,
		OpportunisticGraftThreshold: 1,
	}
}

// Join joins a gossip topic and subscribes to it. A topic can be joined
// once per Host at a time (ErrJoined); Close it to join it again.
func (h *Host) Join(name string) (mesh.Topic, error) {
	if name == "" {
		return nil, fmt.Errorf("p2p: join: empty topic name")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, ErrClosed
	}
	if _, ok := h.topics[name]; ok {
		return nil, fmt.Errorf("%w: %s", ErrJoined, name)
	}
	pt, err := h.ps.Join(name)
	if err != nil {
		return nil, fmt.Errorf("p2p: join %s: %w", name, err)
	}
	if err := pt.SetScoreParams(topicScoreParams()); err != nil {
		_ = pt.Close()
		return nil, fmt.Errorf("p2p: join %s: score parameters: %w", name, err)
	}
	sub, err := pt.Subscribe(pubsub.WithBufferSize(subscriptionBuffer))
	if err != nil {
		_ = pt.Close()
		return nil, fmt.Errorf("p2p: subscribe %s: %w", name, err)
	}
	t := &topic{h: h, name: name, t: pt, sub: sub}
	h.topics[name] = t
	return t, nil
}

// topic is a joined gossip topic.
type topic struct {
	h    *Host
	name string
	t    *pubsub.Topic
	sub  *pubsub.Subscription

	mu     sync.RWMutex
	closed bool
}

// Publish sends data to the topic's admitted peers. Data larger than
// Options.MaxMessage is refused (ErrTooLarge). Publishing data already
// published or received on the topic does nothing.
func (t *topic) Publish(ctx context.Context, data []byte) error {
	if len(data) > t.h.maxMsg {
		return fmt.Errorf("%w: %d bytes on %s, at most %d", ErrTooLarge, len(data), t.name, t.h.maxMsg)
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return fmt.Errorf("%w: topic %s", ErrClosed, t.name)
	}
	if err := t.t.Publish(ctx, data); err != nil {
		return fmt.Errorf("p2p: publish on %s: %w", t.name, err)
	}
	return nil
}

// Next returns the next message from another peer; From is the peer that
// forwarded it, Author the peer that signed it. Our own messages are
// skipped.
func (t *topic) Next(ctx context.Context) (mesh.Message, error) {
	self := t.h.host.ID()
	for {
		m, err := t.sub.Next(ctx)
		if err != nil {
			if errors.Is(err, pubsub.ErrSubscriptionCancelled) {
				return mesh.Message{}, fmt.Errorf("%w: topic %s", ErrClosed, t.name)
			}
			return mesh.Message{}, err
		}
		author := m.GetFrom()
		if m.ReceivedFrom == self || author == self {
			continue
		}
		return mesh.Message{Data: m.Data, From: meshID(m.ReceivedFrom), Author: meshID(author)}, nil
	}
}

// Close cancels the subscription and leaves the topic.
func (t *topic) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()

	t.h.mu.Lock()
	if t.h.topics[t.name] == t {
		delete(t.h.topics, t.name)
	}
	t.h.mu.Unlock()

	t.sub.Cancel()
	if err := t.t.Close(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("p2p: leave %s: %w", t.name, err)
	}
	return nil
}
