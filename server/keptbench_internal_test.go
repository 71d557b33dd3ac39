package server

import (
	"strings"
	"testing"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"

	"github.com/intentd/intentd/intent"
)

// BenchmarkReplayAnswer: what a replay from memory costs the server once
// the store has answered: the answer made from the memo and encoded by
// the server's codec, for 10,000 intents replayed round-robin.
//
//	go test -run '^$' -bench ReplayAnswer -benchmem ./server
func BenchmarkReplayAnswer(b *testing.B) {
	acqs := make([]*intent.Acquisition, 10000)
	for i := range acqs {
		a := completedAcquisition()
		a.Intent.Params = []byte(`{"note":"` + strings.Repeat("x", 289) + `"}`)
		a.Intent.Result.Payload = []byte(`{"r":"` + strings.Repeat("x", 292) + `"}`)
		a.Memo = new(intent.Memo)
		acquireResponse(a)
		acqs[i] = a
	}
	codec := requestCodec{encoding.GetCodecV2(grpcproto.Name)}
	i := 0
	for b.Loop() {
		i = (i + 1) % len(acqs)
		buf, err := codec.Marshal(acquireResponse(acqs[i]))
		if err != nil {
			b.Fatal(err)
		}
		buf.Free()
	}
}
