package etcdstore

import (
	"context"

	"github.com/intentd/intentd/intent"
	"github.com/intentd/intentd/internal/core/machine"
)

// replayRead answers an Acquire of an intent seen final (finalHints) whose
// record the cache no longer holds: one read of the record alone, and, if
// it is final and retained, the same answer a replay from memory gives
// (machine.ReplayFinal: the caller's session is not checked, nothing is
// issued to it), with the remembered version's memo when the cache keeps
// it. ok is false when the read does not settle it (an error, the record
// gone or not final, its retention over): the caller then takes the whole
// path, which reads linearizably and says what went wrong.
//
// The read is serializable: whichever member the client reaches answers
// from its own copy, with no round to the leader, and while the quorum is
// lost. That is safe for the reason a replay from memory is (DESIGN.md,
// "Final records are replayed from memory"): nothing a replay answers
// changes once the record is final, and a member that lags shows the
// record not yet final, or not at all, which settles nothing here.
//
// In a store whose callers keep answers (answersKept) the record's first
// replay makes its entry compact anyway (replayedFrom), so there the
// record is decoded without its history (decodeReplayRecord) and cached
// compact at once, with the memo its caller keeps the answer in, instead
// of whole and then compact.
func (s *Store) replayRead(ctx context.Context, tenant, key, fingerprint string) (_ *intent.Acquisition, ok bool, _ error) {
	rctx, span := s.startSpan(ctx, "etcd read", tenant, key)
	kv, err := s.kv.getSerializable(rctx, s.keys.intent(tenant, key), s.cfg.RequestTimeout)
	endRead(span, err)
	if err != nil || kv == nil {
		return nil, false, nil
	}
	compact := s.answersKept.Load()
	decode := decodeRecord
	if compact {
		decode = decodeReplayRecord
	}
	rec, err := decode(tenant, key, kv.Value, kv.ModRevision)
	if err != nil || !rec.State.Final() {
		return nil, false, nil // a copy not (yet) final is never remembered: it may be a lagging member's
	}
	rev := kv.ModRevision
	if compact {
		s.noteFinal(tenant, key, rec) // a record without its history is never cached whole
	} else {
		s.remember(tenant, key, rec, rev)
	}
	d, ok := machine.ReplayFinal(&machine.View{Key: key, Rec: rec, Rev: rev}, fingerprint, s.cfg.Now())
	if !ok {
		return nil, false, nil
	}
	if d.Err != nil {
		return nil, true, d.Err
	}
	out := acquisition(d.Answer)
	if compact {
		// A memo the cache did not admit would be the caller's alone: the
		// answer kept in it would never be sent again, and keeping it
		// costs a second copy of the answer's encoding.
		if memo := new(intent.Memo); s.rememberReplayed(tenant, key, cached{rec: rec, rev: rev, memo: memo}) {
			out.Memo = memo
		}
	} else if e, cached := s.cachedEntry(tenant, key); cached && e.rev == rev && e.memo != nil {
		out.Memo = e.memo
		if !e.replayed {
			s.replayedFrom(tenant, key, e.memo)
		}
	}
	return out, true, nil
}
