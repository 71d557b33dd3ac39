package reliability

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// calm is a history of n quick successful calls, one every 10ms.
func calm(n int) []Call {
	var calls []Call
	for i := range n {
		s, e := at(10*i, 10*i+2)
		calls = append(calls, Call{Method: "Get", In: Input{Kind: OpGet, Key: key}, Start: s, End: e})
	}
	return calls
}

func TestFaultProof(t *testing.T) {
	ms := time.Millisecond
	fault := FaultEvent{Kind: "kill-leader", Injected: 600 * ms, Healed: 900 * ms}
	unavailable := Call{Method: "Acquire", In: Input{Kind: OpAcquire, Key: key}, Out: Output{Unknown: true},
		Code: codes.Unavailable, Start: 650 * ms, End: 700 * ms}
	recovered := Call{Method: "Complete", In: Input{Kind: OpComplete, Key: key, Token: 1}, Start: 950 * ms, End: 960 * ms}
	for _, tc := range []struct {
		name    string
		calls   []Call
		events  []FaultEvent
		anySeen bool
		want    string // "" for a proof that holds
	}{
		{"a run that injected nothing", calm(100), nil, false, "injected no fault"},
		{"a fault nobody saw", append(calm(100), recovered), []FaultEvent{fault}, false, "no call saw kill-leader"},
		{"a fault under too little load", append(calm(10), unavailable, recovered), []FaultEvent{fault}, false, "want at least 50"},
		{"no service after the heal", append(calm(60), unavailable), []FaultEvent{fault}, false, "no transition was acknowledged"},
		{"seen under load, recovered", append(calm(60), unavailable, recovered), []FaultEvent{fault}, false, ""},
		{"a slow call is seen", append(calm(60), Call{Method: "Get", In: Input{Kind: OpGet, Key: key}, Start: 620 * ms, End: 1200 * ms}, recovered),
			[]FaultEvent{fault}, false, ""},
		{"one of two seen, anySeen", append(calm(60), unavailable, recovered),
			[]FaultEvent{fault, {Kind: "slow-etcd-link", Injected: 2 * time.Second, Healed: 3 * time.Second}}, true, "no transition was acknowledged after slow-etcd-link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := ProveFaults(tc.calls, tc.events, 10*ms)
			problems := strings.Join(p.Problems(50, tc.anySeen), "\n")
			switch {
			case tc.want == "" && problems != "":
				t.Errorf("problems:\n%s", problems)
			case tc.want != "" && !strings.Contains(problems, tc.want):
				t.Errorf("problems:\n%s\nwant one saying %q", problems, tc.want)
			}
		})
	}
}
