package mesh

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzPluginMessages: no request or reply of the plugin protocol panics
// its reader, a request is served only for a well-formed hash, and a reply
// lets the asker read bytes only when their count is positive and within
// its limit.
func FuzzPluginMessages(f *testing.F) {
	for _, v := range []any{
		pluginRequest{Hash: sha256Hex([]byte("m"))},
		pluginRequest{Hash: "ABC"},
		pluginReply{Status: pluginOK, Size: 100},
		pluginReply{Status: pluginOK, Size: -1},
		pluginReply{Status: pluginOK, Size: 1 << 40},
		pluginReply{Status: pluginNotFound},
		pluginReply{Status: pluginRefused, Error: "no"},
		pluginReply{Status: "maybe"},
	} {
		var buf bytes.Buffer
		writeMsg(&buf, v)
		f.Add(buf.Bytes())
	}
	f.Add(binary.AppendUvarint(nil, 1<<40))
	f.Fuzz(func(t *testing.T, b []byte) {
		var req pluginRequest
		if readMsg(bufio.NewReader(bytes.NewReader(b)), &req, maxMsg) == nil && validHash(req.Hash) {
			if len(req.Hash) != 64 || bytes.ContainsAny([]byte(req.Hash), "ABCDEFGHIJKLMNOPQRSTUVWXYZ") {
				t.Fatalf("hash %q taken", req.Hash)
			}
		}
		var rep pluginReply
		if readMsg(bufio.NewReader(bytes.NewReader(b)), &rep, maxMsg) != nil {
			return
		}
		const limit = 1 << 20
		err := pluginReplyErr(rep, limit)
		if err == nil && (rep.Status != pluginOK || rep.Size <= 0 || rep.Size > limit) {
			t.Fatalf("reply %+v lets the asker read", rep)
		}
		if err != nil && rep.Status == pluginNotFound && !errors.Is(err, ErrNoPlugin) {
			t.Fatalf("not_found is %v", err)
		}
	})
}
