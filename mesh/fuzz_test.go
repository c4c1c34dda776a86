package mesh

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// FuzzParseManifest: no announcement panics the decoder, and one it accepts
// encodes back to a manifest it accepts the same.
func FuzzParseManifest(f *testing.F) {
	good, _ := json.Marshal(Manifest{ID: "5d61d1de102bea9a377f9e645e6b5ab38f803fd393ed97f99beebfeab4c3fadd", Size: 10, Steps: 2, Sessions: 1, Plugins: []string{"ab"}, Created: time.Unix(0, 0).UTC(), Round: 3})
	f.Add(good)
	f.Add([]byte(`{"id":"x"}`))
	f.Add([]byte(`{"id":"5D61D1DE102BEA9A377F9E645E6B5AB38F803FD393ED97F99BEEBFEAB4C3FADD","size":1,"steps":1,"sessions":1}`))
	f.Add([]byte(`{} {}`))
	f.Add(bytes.Repeat([]byte("["), 1<<15))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b)
		if err != nil {
			return
		}
		again, _ := json.Marshal(m)
		m2, err := ParseManifest(again)
		if err != nil {
			t.Fatalf("accepted %q, refused its re-encoding %q: %v", b, again, err)
		}
		if m2.ID != m.ID || m2.Size != m.Size || m2.Steps != m.Steps || m2.Round != m.Round {
			t.Fatalf("round trip changed %+v to %+v", m, m2)
		}
	})
}

// FuzzReadMsg: the framing of the control and pull messages refuses any
// length over the bound before reading it, and never panics.
func FuzzReadMsg(f *testing.F) {
	var buf bytes.Buffer
	writeMsg(&buf, pullRequest{ID: "5d61d1de102bea9a377f9e645e6b5ab38f803fd393ed97f99beebfeab4c3fadd"})
	f.Add(buf.Bytes())
	buf.Reset()
	writeMsg(&buf, hello{Cert: "00", Addrs: []string{"/ip4/127.0.0.1/tcp/1/p2p/x"}, Peers: [][]string{{"a"}}, Voters: "0153"})
	f.Add(buf.Bytes())
	f.Add(binary.AppendUvarint(nil, 1<<40))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Add(append(binary.AppendUvarint(nil, 4), `{}{}`...))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, v := range []any{&pullRequest{}, &pullReply{}, &hello{}, &redeemRequest{}, &redeemReply{}, &renewReply{}} {
			r := bufio.NewReader(bytes.NewReader(b))
			if err := readMsg(r, v, 1024); err == nil {
				n, _ := binary.ReadUvarint(bufio.NewReader(bytes.NewReader(b)))
				if n > 1024 {
					t.Fatalf("accepted a %d-byte message over the bound", n)
				}
			}
		}
	})
}

func TestReadMsgBounds(t *testing.T) {
	var buf bytes.Buffer
	if err := writeMsg(&buf, redeemRequest{Token: strings.Repeat("x", maxMsg)}); err == nil {
		t.Error("wrote a message over the bound")
	}
	buf.Reset()
	writeMsg(&buf, redeemRequest{Token: "abc"})
	var r redeemRequest
	if err := readMsg(bufio.NewReader(&buf), &r, maxMsg); err != nil || r.Token != "abc" {
		t.Fatalf("%+v, %v", r, err)
	}
	for name, in := range map[string][]byte{
		"oversize":      binary.AppendUvarint(nil, maxMsg+1),
		"unknown field": append(binary.AppendUvarint(nil, 13), `{"tokenx":""}`...),
		"trailing":      append(binary.AppendUvarint(nil, 4), `{}{}`...),
		"cut":           append(binary.AppendUvarint(nil, 10), `{}`...),
	} {
		if err := readMsg(bufio.NewReader(bytes.NewReader(in)), &r, maxMsg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
