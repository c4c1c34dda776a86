package sse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

type want struct {
	raw, name, data, id string
	noData              bool
}

func readAll(t testing.TB, r io.Reader, max int) ([]Event, error) {
	rd := NewReader(r, max)
	var evs []Event
	for i := 0; i < 100000; i++ {
		ev, err := rd.Next()
		if err != nil {
			return evs, err
		}
		evs = append(evs, ev)
	}
	t.Fatal("reader did not stop")
	return nil, nil
}

func TestReader(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want []want
	}{
		{"empty", "", nil},
		{"one event", "data: {\"a\":1}\n\n", []want{{raw: "data: {\"a\":1}\n\n", data: `{"a":1}`}}},
		{"crlf", "event: message_start\r\ndata: x\r\n\r\ndata: y\r\n\r\n", []want{
			{raw: "event: message_start\r\ndata: x\r\n\r\n", name: "message_start", data: "x"},
			{raw: "data: y\r\n\r\n", data: "y"},
		}},
		{"cr only", "data: a\rdata: b\r\rid: 7\rdata:c\r\r", []want{
			{raw: "data: a\rdata: b\r\r", data: "a\nb"},
			{raw: "id: 7\rdata:c\r\r", data: "c", id: "7"},
		}},
		{"keep-alive comment", ": ping\n\ndata: [DONE]\n\n", []want{
			{raw: ": ping\n\n", noData: true},
			{raw: "data: [DONE]\n\n", data: "[DONE]"},
		}},
		{"comment inside event", "data: a\n: note\ndata: b\n\n", []want{{raw: "data: a\n: note\ndata: b\n\n", data: "a\nb"}}},
		{"no trailing blank line", "data: a\n\ndata: last\n", []want{
			{raw: "data: a\n\n", data: "a"},
			{raw: "data: last\n", data: "last"},
		}},
		{"no trailing newline", "data: last", []want{{raw: "data: last", data: "last"}}},
		{"trailing cr at eof", "data: last\r", []want{{raw: "data: last\r", data: "last"}}},
		{"stray blank lines", "\n\ndata: a\n\n\n", []want{
			{raw: "\n", noData: true},
			{raw: "\n", noData: true},
			{raw: "data: a\n\n", data: "a"},
			{raw: "\n", noData: true},
		}},
		{"empty data line", "data\n\ndata:\n\n", []want{
			{raw: "data\n\n", data: ""},
			{raw: "data:\n\n", data: ""},
		}},
		{"only one space stripped", "data:  two\n\n", []want{{raw: "data:  two\n\n", data: " two"}}},
		{"unknown field and retry", "retry: 10\nfoo: bar\ndata: z\n\n", []want{{raw: "retry: 10\nfoo: bar\ndata: z\n\n", data: "z"}}},
		{"id with nul ignored", "id: a\x00b\ndata: z\n\n", []want{{raw: "id: a\x00b\ndata: z\n\n", data: "z"}}},
	}
	readers := map[string]func(string) io.Reader{
		"whole":    func(s string) io.Reader { return strings.NewReader(s) },
		"one byte": func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		"data err": func(s string) io.Reader { return iotest.DataErrReader(strings.NewReader(s)) },
	}
	for _, c := range cases {
		for rn, mk := range readers {
			t.Run(c.name+"/"+rn, func(t *testing.T) {
				evs, err := readAll(t, mk(c.in), 0)
				if err != io.EOF {
					t.Fatalf("err = %v, want io.EOF", err)
				}
				if len(evs) != len(c.want) {
					t.Fatalf("got %d events %q, want %d", len(evs), raws(evs), len(c.want))
				}
				for i, w := range c.want {
					ev := evs[i]
					if string(ev.Raw) != w.raw || ev.Name != w.name || ev.ID != w.id {
						t.Errorf("event %d = raw %q name %q id %q, want %q %q %q", i, ev.Raw, ev.Name, ev.ID, w.raw, w.name, w.id)
					}
					if w.noData != (ev.Data == nil) || string(ev.Data) != w.data {
						t.Errorf("event %d data = %q (nil %v), want %q (nil %v)", i, ev.Data, ev.Data == nil, w.data, w.noData)
					}
				}
			})
		}
	}
}

func raws(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, string(e.Raw))
	}
	return out
}

func TestReaderEventsOwnTheirBytes(t *testing.T) {
	rd := NewReader(iotest.OneByteReader(strings.NewReader("data: first\n\ndata: second\n\n")), 0)
	a, err := rd.Next()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Next(); err != nil {
		t.Fatal(err)
	}
	if string(a.Raw) != "data: first\n\n" || string(a.Data) != "first" {
		t.Fatalf("first event changed after the next read: %q %q", a.Raw, a.Data)
	}
}

func TestReaderTooLarge(t *testing.T) {
	in := "data: ok\n\ndata: " + strings.Repeat("x", 100) + "\n\ndata: after\n\n"
	rd := NewReader(strings.NewReader(in), 64)
	ev, err := rd.Next()
	if err != nil || string(ev.Data) != "ok" {
		t.Fatalf("first = %q, %v", ev.Data, err)
	}
	if _, err := rd.Next(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	if _, err := rd.Next(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("err after too large = %v, want ErrTooLarge again", err)
	}
	// Many short lines add up too.
	in = strings.Repeat("data: 0123456789\n", 20) + "\n"
	if _, err := readAll(t, strings.NewReader(in), 64); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("many lines: err = %v, want ErrTooLarge", err)
	}
	// A last line with no terminator.
	if _, err := readAll(t, strings.NewReader("data: "+strings.Repeat("y", 80)), 64); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("unterminated: err = %v, want ErrTooLarge", err)
	}
	// Exactly at the limit is fine.
	in = "data: " + strings.Repeat("z", 56) + "\n\n"
	if len(in) != 64 {
		t.Fatal(len(in))
	}
	if evs, err := readAll(t, strings.NewReader(in), 64); err != io.EOF || len(evs) != 1 {
		t.Fatalf("at limit: %d events, %v", len(evs), err)
	}
}

func TestReaderPassesReadErrors(t *testing.T) {
	boom := errors.New("boom")
	r := io.MultiReader(strings.NewReader("data: a\n\ndata: cut"), iotest.ErrReader(boom))
	evs, err := readAll(t, r, 0)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if got := raws(evs); len(got) != 2 || got[0] != "data: a\n\n" || got[1] != "data: cut" {
		t.Fatalf("events = %q", got)
	}
}

func TestReaderLargeStream(t *testing.T) {
	var in bytes.Buffer
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&in, "data: {\"i\":%d,\"pad\":%q}\n\n", i, strings.Repeat("p", i%300))
	}
	evs, err := readAll(t, iotest.HalfReader(bytes.NewReader(in.Bytes())), 0)
	if err != io.EOF || len(evs) != 2000 {
		t.Fatalf("%d events, %v", len(evs), err)
	}
	var back bytes.Buffer
	for _, e := range evs {
		back.Write(e.Raw)
	}
	if !bytes.Equal(back.Bytes(), in.Bytes()) {
		t.Fatal("concatenated Raw differs from the input")
	}
}

func FuzzSSEReader(f *testing.F) {
	f.Add([]byte("data: a\n\n"), uint8(0), 0)
	f.Add([]byte("event: x\r\ndata: a\r\ndata: b\r\n\r\n: ping\n\n"), uint8(1), 0)
	f.Add([]byte("data: a\rdata: b\r\r\n\n\ndata"), uint8(2), 16)
	f.Add([]byte("id: 1\nretry: 5\ndata:[DONE]"), uint8(3), 5)
	f.Fuzz(func(t *testing.T, in []byte, mode uint8, max int) {
		var r io.Reader = bytes.NewReader(in)
		switch mode % 3 {
		case 1:
			r = iotest.OneByteReader(r)
		case 2:
			r = iotest.HalfReader(r)
		}
		if max > 1<<20 || max < -1<<20 {
			max = 0
		}
		rd := NewReader(r, max)
		limit := max
		if limit <= 0 {
			limit = DefaultMaxEventBytes
		}
		var back []byte
		for i := 0; i <= len(in); i++ {
			ev, err := rd.Next()
			if err == io.EOF {
				if !bytes.Equal(back, in) {
					t.Fatalf("concatenated Raw %q != input %q", back, in)
				}
				return
			}
			if err != nil {
				if !errors.Is(err, ErrTooLarge) {
					t.Fatalf("unexpected error %v", err)
				}
				if !bytes.HasPrefix(in, back) {
					t.Fatalf("consumed %q is not a prefix of %q", back, in)
				}
				return
			}
			if len(ev.Raw) == 0 {
				t.Fatal("empty event")
			}
			if len(ev.Raw) > limit {
				t.Fatalf("event of %d bytes over limit %d", len(ev.Raw), limit)
			}
			if len(ev.Data) > len(ev.Raw) {
				t.Fatal("data longer than raw")
			}
			back = append(back, ev.Raw...)
			if ev.Data != nil {
				checkWithData(t, ev, []byte("x"))
				checkWithData(t, ev, ev.Data)
			}
		}
		t.Fatal("more events than input bytes")
	})
}

// checkWithData checks that the event rebuilt with data reads back as one
// event with that data, name and id.
func checkWithData(t *testing.T, ev Event, data []byte) {
	t.Helper()
	out := ev.WithData(data)
	evs, err := readAll(t, bytes.NewReader(out), 0)
	if err != io.EOF || len(evs) != 1 {
		t.Fatalf("WithData(%q) of %q = %q: %d events, %v", data, ev.Raw, out, len(evs), err)
	}
	// Line breaks inside data come back as "\n".
	norm := bytes.ReplaceAll(bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
	got := evs[0]
	if !bytes.Equal(got.Data, norm) || got.Name != ev.Name || got.ID != ev.ID {
		t.Fatalf("WithData(%q) of %q read back as data %q name %q id %q", data, ev.Raw, got.Data, got.Name, got.ID)
	}
}

func TestWithData(t *testing.T) {
	evs, err := readAll(t, strings.NewReader("event: e\r\nid: 3\r\ndata: {\"a\":1}\r\n: c\r\n\r\ndata: a\ndata: b\n\n"), 0)
	if err != io.EOF || len(evs) != 2 {
		t.Fatal(len(evs), err)
	}
	if got := string(evs[0].WithData([]byte(`{"a":null}`))); got != "event: e\r\nid: 3\r\ndata: {\"a\":null}\r\n: c\r\n\r\n" {
		t.Errorf("splice = %q", got)
	}
	if got := string(evs[1].WithData([]byte("x\ny"))); got != "data: x\ndata: y\n\n" {
		t.Errorf("rebuild = %q", got)
	}
	hand := Event{Name: "n", Data: []byte("d")}
	if got := string(hand.WithData([]byte("z"))); got != "event: n\ndata: z\n\n" {
		t.Errorf("hand-made = %q", got)
	}
	for _, ev := range evs {
		checkWithData(t, ev, []byte("multi\r\nline\rdata"))
	}
}

func BenchmarkSSEReader(b *testing.B) {
	var in bytes.Buffer
	chunk := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"qwen3","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	for in.Len() < 1<<20 {
		in.WriteString(chunk)
	}
	data := in.Bytes()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		rd := NewReader(bytes.NewReader(data), 0)
		for {
			if _, err := rd.Next(); err != nil {
				break
			}
		}
	}
}

// smallReads returns at most n bytes per Read, like a network body.
type smallReads struct {
	r io.Reader
	n int
}

func (s smallReads) Read(p []byte) (int, error) {
	if len(p) > s.n {
		p = p[:s.n]
	}
	return s.r.Read(p)
}

// BenchmarkSSEReaderLongLine reads one 1 MiB data line arriving 4 KiB at a
// time (a response.completed event carrying a long reply): the reader must
// not rescan the line on every read.
func BenchmarkSSEReaderLongLine(b *testing.B) {
	data := []byte("data: " + strings.Repeat("x", 1<<20) + "\n\n")
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		rd := NewReader(smallReads{bytes.NewReader(data), 4096}, 0)
		ev, err := rd.Next()
		if err != nil || len(ev.Data) != 1<<20 {
			b.Fatal(err)
		}
	}
}
