package intent

// MemoBytes estimates the heap a Memo holds once the gRPC server kept a
// replay answer in it: the answer converted to the API's messages (params
// as a structpb.Struct) and its encoding. Stores that bound their memory
// count it for every version whose memo they handed out. paramsLen and
// payloadLen are the lengths of the intent's params and result payload.
// TestMemoBytesIsWhatAKeptAnswerHolds in package server holds the estimate
// to the heap a kept answer takes (measured in docs/PERFORMANCE.md,
// "intentd's memory, in short").
func MemoBytes(paramsLen, payloadLen int) int64 {
	return memoBase + 3*int64(paramsLen) + 2*int64(payloadLen)
}

// memoBase is what a kept answer costs whatever its params: the converted
// intent's messages, its timestamps and lease, and its encoding's fields.
const memoBase = 3000
