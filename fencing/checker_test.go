package fencing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

// admit is one Admit call in a table and what it must return.
type admit struct {
	resource string
	token    Token
	wantErr  error // nil, ErrStale or ErrMalformed
	highest  Token // for ErrStale: the Highest the StaleError must carry
}

func TestMemoryCheckerAdmit(t *testing.T) {
	tests := []struct {
		name  string
		steps []admit
		// wantHighest is Highest per resource after all steps.
		wantHighest map[string]Token
	}{
		{
			name:        "first token admitted",
			steps:       []admit{{"r", 7, nil, 0}},
			wantHighest: map[string]Token{"r": 7},
		},
		{
			name:        "equal token admitted (same lease retrying)",
			steps:       []admit{{"r", 7, nil, 0}, {"r", 7, nil, 0}, {"r", 7, nil, 0}},
			wantHighest: map[string]Token{"r": 7},
		},
		{
			name:        "higher token admitted",
			steps:       []admit{{"r", 7, nil, 0}, {"r", 9, nil, 0}},
			wantHighest: map[string]Token{"r": 9},
		},
		{
			name: "lower token refused after higher",
			steps: []admit{
				{"r", 7, nil, 0},
				{"r", 9, nil, 0},
				{"r", 7, ErrStale, 9},
				{"r", 8, ErrStale, 9},
				{"r", 9, nil, 0},
			},
			wantHighest: map[string]Token{"r": 9},
		},
		{
			name:        "refusal does not lower the highest",
			steps:       []admit{{"r", 9, nil, 0}, {"r", 1, ErrStale, 9}, {"r", 5, ErrStale, 9}},
			wantHighest: map[string]Token{"r": 9},
		},
		{
			name: "resources are independent",
			steps: []admit{
				{"a", 9, nil, 0},
				{"b", 7, nil, 0},
				{"a", 7, ErrStale, 9},
				{"b", 8, nil, 0},
			},
			wantHighest: map[string]Token{"a": 9, "b": 8, "c": 0},
		},
		{
			name:        "zero token is malformed and not recorded",
			steps:       []admit{{"r", 0, ErrMalformed, 0}},
			wantHighest: map[string]Token{"r": 0},
		},
		{
			name:        "zero token is malformed even after a real one",
			steps:       []admit{{"r", 3, nil, 0}, {"r", 0, ErrMalformed, 0}},
			wantHighest: map[string]Token{"r": 3},
		},
		{
			name:        "largest token",
			steps:       []admit{{"r", math.MaxUint64, nil, 0}, {"r", math.MaxUint64 - 1, ErrStale, math.MaxUint64}},
			wantHighest: map[string]Token{"r": math.MaxUint64},
		},
		{
			name:        "empty resource name is a resource like any other",
			steps:       []admit{{"", 4, nil, 0}, {"", 2, ErrStale, 4}},
			wantHighest: map[string]Token{"": 4},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := NewMemoryChecker()
			for i, s := range tt.steps {
				err := c.Admit(context.Background(), s.resource, s.token)
				checkAdmitErr(t, i, s, err)
			}
			for r, want := range tt.wantHighest {
				if got := c.Highest(r); got != want {
					t.Errorf("Highest(%q) = %d, want %d", r, got, want)
				}
			}
		})
	}
}

// checkAdmitErr checks the error of step i against s.
func checkAdmitErr(t *testing.T, i int, s admit, err error) {
	t.Helper()
	if s.wantErr == nil {
		if err != nil {
			t.Errorf("step %d: Admit(%q, %d) = %v, want nil", i, s.resource, s.token, err)
		}
		return
	}
	if !errors.Is(err, s.wantErr) {
		t.Errorf("step %d: Admit(%q, %d) = %v, want %v", i, s.resource, s.token, err, s.wantErr)
		return
	}
	if s.wantErr != ErrStale {
		return
	}
	var se *StaleError
	if !errors.As(err, &se) {
		t.Errorf("step %d: Admit(%q, %d) = %T, want *StaleError", i, s.resource, s.token, err)
		return
	}
	want := StaleError{Resource: s.resource, Token: s.token, Highest: s.highest}
	if *se != want {
		t.Errorf("step %d: StaleError = %+v, want %+v", i, *se, want)
	}
}

func TestMemoryCheckerDoneContext(t *testing.T) {
	c := NewMemoryChecker()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Admit(ctx, "r", 7); !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit with cancelled ctx = %v, want context.Canceled", err)
	}
	if got := c.Highest("r"); got != 0 {
		t.Fatalf("Highest after cancelled Admit = %d, want 0 (nothing admitted)", got)
	}
}

func TestStaleError(t *testing.T) {
	var err error = &StaleError{Resource: "order/1", Token: 3, Highest: 5}
	wrapped := fmt.Errorf("resource: write refused: %w", err)
	tests := []struct {
		name   string
		err    error
		target error
		want   bool
	}{
		{"bare is ErrStale", err, ErrStale, true},
		{"wrapped is ErrStale", wrapped, ErrStale, true},
		{"not ErrMalformed", wrapped, ErrMalformed, false},
		{"ErrMalformed is not ErrStale", ErrMalformed, ErrStale, false},
	}
	for _, tt := range tests {
		if got := errors.Is(tt.err, tt.target); got != tt.want {
			t.Errorf("%s: errors.Is(%v, %v) = %v, want %v", tt.name, tt.err, tt.target, got, tt.want)
		}
	}
	const wantMsg = `fencing: stale token 3 for resource "order/1": highest admitted is 5`
	if got := err.Error(); got != wantMsg {
		t.Errorf("Error() = %q, want %q", got, wantMsg)
	}
}

// call is one Admit call as its caller saw it: when it began and ended, in
// the order of one counter all callers share, and what it returned.
type call struct {
	begin, end int64
	resource   string
	token      Token
	admitted   bool
	highest    Token // for a refusal: the StaleError's Highest
}

// TestMemoryCheckerConcurrent admits random tokens from many goroutines and
// then checks the answers against what a single highest-token-per-resource
// would have given, in the order callers can observe: a call that ended
// before another began comes first.
//
// Only that order is knowable from outside; calls that overlap may have been
// decided either way. So the test checks what must hold whatever the
// checker's inner order: an admitted token is never older than a token whose
// Admit had already returned nil (no lost update); a refusal names as
// Highest a token that was admitted by a call begun before the refusal
// ended, that is newer than the refused one, and that is not older than any
// token admitted before the refusal began (no fiction, nothing stale); and,
// without waiting for the others, Highest never reads below a token whose
// Admit has just returned nil.
func TestMemoryCheckerConcurrent(t *testing.T) {
	const (
		goroutines = 16
		perG       = 400
		maxToken   = 64 // small, so equal and stale tokens are frequent
	)
	resources := []string{"a", "b", "c"}

	c := NewMemoryChecker()
	var clock atomic.Int64
	results := make([][]call, goroutines) // results[g]: goroutine g's calls
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 0x5eed))
			for range perG {
				r := resources[rng.IntN(len(resources))]
				tok := Token(1 + rng.IntN(maxToken))
				begin := clock.Add(1)
				err := c.Admit(context.Background(), r, tok)
				end := clock.Add(1)
				var se *StaleError
				switch {
				case err == nil:
					results[g] = append(results[g], call{begin, end, r, tok, true, tok})
					if h := c.Highest(r); h < tok {
						errs <- fmt.Errorf("Highest(%q) = %d right after Admit(%d) returned nil", r, h, tok)
						return
					}
				case errors.As(err, &se):
					results[g] = append(results[g], call{begin, end, r, tok, false, se.Highest})
				default:
					errs <- fmt.Errorf("Admit(%q, %d) = %v, want nil or *StaleError", r, tok, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	var admitted, refused int
	for _, r := range resources {
		var calls, ended []call         // ended: the admitted calls, by when they ended
		firstBegin := map[Token]int64{} // admitted token → earliest begin of a call admitting it
		maxAdmitted := Token(0)
		for _, rs := range results {
			for _, cl := range rs {
				if cl.resource != r {
					continue
				}
				calls = append(calls, cl)
				if cl.admitted {
					ended = append(ended, cl)
					if b, ok := firstBegin[cl.token]; !ok || cl.begin < b {
						firstBegin[cl.token] = cl.begin
					}
					maxAdmitted = max(maxAdmitted, cl.token)
				}
			}
		}
		slices.SortFunc(ended, func(a, b call) int { return cmp.Compare(a.end, b.end) })
		// before[i] is the highest token admitted by ended[:i+1].
		before := make([]Token, len(ended))
		for i, cl := range ended {
			before[i] = cl.token
			if i > 0 {
				before[i] = max(before[i], before[i-1])
			}
		}
		// admittedBefore is the highest token admitted by a call that ended
		// before the counter read at.
		admittedBefore := func(at int64) Token {
			i, _ := slices.BinarySearchFunc(ended, at, func(cl call, at int64) int { return cmp.Compare(cl.end, at) })
			if i == 0 {
				return 0
			}
			return before[i-1]
		}
		for _, cl := range calls {
			prior := admittedBefore(cl.begin)
			if cl.admitted {
				admitted++
				if cl.token < prior {
					t.Errorf("%q: admitted %d although %d had been admitted before the call began", r, cl.token, prior)
				}
				continue
			}
			refused++
			switch b, ok := firstBegin[cl.highest]; {
			case cl.highest <= cl.token:
				t.Errorf("%q: refused %d naming highest %d, which is not newer", r, cl.token, cl.highest)
			case !ok || b > cl.end:
				t.Errorf("%q: refused %d naming highest %d, which no call had begun to admit", r, cl.token, cl.highest)
			case cl.highest < prior:
				t.Errorf("%q: refused %d naming highest %d although %d had been admitted before the call began", r, cl.token, cl.highest, prior)
			}
		}
		if got := c.Highest(r); got != maxAdmitted {
			t.Errorf("Highest(%q) = %d, want max admitted %d", r, got, maxAdmitted)
		}
	}
	if admitted == 0 || refused == 0 {
		t.Errorf("admitted %d, refused %d: the test should exercise both", admitted, refused)
	}
	if n := admitted + refused; n != goroutines*perG {
		t.Errorf("%d calls answered, want %d", n, goroutines*perG)
	}
}

func TestParseStringRoundTrip(t *testing.T) {
	for _, tok := range []Token{1, 7, 9, 10, 99, 100, 1 << 32, 1 << 63, math.MaxUint64 - 1, math.MaxUint64} {
		s := tok.String()
		got, err := Parse(s)
		if err != nil {
			t.Errorf("Parse(%q) error = %v, want %d", s, err, tok)
			continue
		}
		if got != tok {
			t.Errorf("Parse(%q) = %d, want %d", s, got, tok)
		}

		b, err := tok.MarshalText()
		if err != nil {
			t.Errorf("MarshalText(%d) error = %v", tok, err)
			continue
		}
		var back Token
		if err := back.UnmarshalText(b); err != nil || back != tok {
			t.Errorf("UnmarshalText(%q) = %d, %v, want %d, nil", b, back, err, tok)
		}
	}
}

func TestParseRejects(t *testing.T) {
	tests := []struct {
		name string
		in   string
	}{
		{"empty", ""},
		{"zero", "0"},
		{"leading zeros", "007"},
		{"plus sign", "+7"},
		{"minus sign", "-1"},
		{"leading space", " 7"},
		{"trailing space", "7 "},
		{"trailing newline", "7\n"},
		{"overflow by one", "18446744073709551616"},
		{"far overflow", "99999999999999999999999"},
		{"hex", "0x7"},
		{"exponent", "1e3"},
		{"underscore", "1_000"},
		{"fraction", "7.0"},
		{"fullwidth digit", "７"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.in)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse(%q) = %d, %v, want ErrMalformed", tt.in, got, err)
			}
			if got != 0 {
				t.Errorf("Parse(%q) = %d with error, want 0", tt.in, got)
			}
			if tt.in == "0" {
				return // UnmarshalText reads "0" as the zero Token; see TestUnmarshalTextZero
			}
			var tok Token = 5
			if err := tok.UnmarshalText([]byte(tt.in)); !errors.Is(err, ErrMalformed) || tok != 5 {
				t.Errorf("UnmarshalText(%q) = %v, token %d, want ErrMalformed and token unchanged", tt.in, err, tok)
			}
		})
	}
}

// A stored "no token" survives a text round trip, while a token arriving
// on the wire (Parse) may never be zero.
func TestUnmarshalTextZero(t *testing.T) {
	var tok Token = 5
	b, _ := Token(0).MarshalText()
	if err := tok.UnmarshalText(b); err != nil || tok != 0 {
		t.Fatalf("UnmarshalText(%q) = %v, token %d, want nil and 0", b, err, tok)
	}
	if _, err := Parse(string(b)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("Parse(%q) = %v, want ErrMalformed", b, err)
	}
}

func TestFromHeader(t *testing.T) {
	tests := []struct {
		name    string
		values  []string // values of Header, in order
		want    Token
		wantErr error
	}{
		{"one token", []string{"9"}, 9, nil},
		{"largest", []string{"18446744073709551615"}, math.MaxUint64, nil},
		{"absent", nil, 0, ErrMissing},
		{"empty value", []string{""}, 0, ErrMalformed},
		{"zero", []string{"0"}, 0, ErrMalformed},
		{"padded", []string{"009"}, 0, ErrMalformed},
		{"two values", []string{"9", "9"}, 0, ErrMalformed},
		{"comma list", []string{"7, 9"}, 0, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, v := range tt.values {
				h.Add(Header, v)
			}
			got, err := FromHeader(h)
			if tt.wantErr == nil && err != nil {
				t.Fatalf("FromHeader = %v, want %d", err, tt.want)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("FromHeader = %d, %v, want %v", got, err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("FromHeader = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestSetHeader(t *testing.T) {
	h := http.Header{}
	h.Add(Header, "3")
	h.Add(Header, "4")

	SetHeader(h, 9)
	if got := h.Values(Header); len(got) != 1 || got[0] != "9" {
		t.Fatalf("after SetHeader(9): %s = %q, want [\"9\"]", Header, got)
	}
	SetHeader(h, 0)
	if got := h.Values(Header); len(got) != 0 {
		t.Fatalf("after SetHeader(0): %s = %q, want absent", Header, got)
	}
	if _, err := FromHeader(h); !errors.Is(err, ErrMissing) {
		t.Errorf("FromHeader after SetHeader(0) = %v, want ErrMissing", err)
	}
}
