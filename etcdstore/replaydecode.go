package etcdstore

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/intentd/intentd/etcdstore/internal/storagepb"
)

// The fields of a compact record (storagepb.Record) a replay's decode
// leaves out (decodeReplayRecord): the history and the submissions.
var (
	historyField     = recordField("history")
	submissionsField = recordField("submissions")
)

func recordField(name protoreflect.Name) protowire.Number {
	f := (&storagepb.Record{}).ProtoReflect().Descriptor().Fields().ByName(name)
	if f == nil {
		panic("etcdstore: storagepb.Record has no field " + name)
	}
	return f.Number()
}

// withoutHistory is body, a compact record's encoding, without its history
// and submissions fields: the other fields' bytes as they are, in their
// order. inPlace says body may be changed (a decompressed value, the
// caller's own): the fields kept then move down over those left out;
// otherwise what is kept is copied, if anything is left out. A body that
// does not parse is returned as it is, for Unmarshal to say what is wrong.
func withoutHistory(body []byte, inPlace bool) []byte {
	var out []byte // what is kept, once a field was left out
	for rest := body; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			return body
		}
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return body
		}
		at, field := len(body)-len(rest), rest[:n+m]
		rest = rest[n+m:]
		switch {
		case num != historyField && num != submissionsField:
			if out != nil {
				// Never over a field not read yet: out ends at or
				// before this one's start.
				out = append(out, field...)
			}
		case out != nil:
		case inPlace:
			out = body[:at]
		default:
			out = append(make([]byte, 0, len(body)), body[:at]...)
		}
	}
	if out == nil {
		return body
	}
	return out
}
